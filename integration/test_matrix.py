"""The runtime matrix on the real kernel: runc 1.1.5 / 1.3 x containerd 1.6.20 / 1.7 / 2.1.

Per cell, through ``ctr`` and a private containerd whose runc-guard fronts that
runc (``RUNC_GUARD_RUNTIME``), with the same runc as the stock control:

* Path B, host PID (the incident): init and shim SIGKILLed, two children die
  2.5 s later. Stock leaks (dirs, or runc >= 1.2's kept state); runc-guard
  leaves 0 dirs, 0 runtime state, 0 pending records.
* Path B, own PID namespace, teardown 7 s (past containerd's 5 s shim cleanup):
  runc-guard stops at its deadline before containerd's kill, keeping state
  and record; once the teardown is over, ``runc-guardctl sweep`` re-drives the
  orphaned state through the runtime's own delete: 0 left. Hybrid cells only
  (see ``OWN_PID_CELLS``).
* Path A (ctr task kill + task delete while two children hang 1.5 s): 0 left.
* Deadline then retry: children hang past the deadline, the delete fails with
  runc-guard's reason and keeps its record; containerd's retry finishes it.

containerd 1.7 (trixie), containerd 2.1 and runc 1.3 (sid) come from Debian's
archive (labkit/runtimes.py); a cell whose package cannot be had fails under CI
and is skipped elsewhere, naming the package (labkit.prereq).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from labkit import containerd as cl
from labkit import prereq
from labkit.kernel import FreezerHold, wait_for

pytestmark = pytest.mark.kernel

#: (containerd build, runc version, cgroup layout)
CELLS = [
    (cl.CONTAINERD_16, cl.RUNC_1_1, cl.HYBRID),
    (cl.CONTAINERD_16, cl.RUNC_1_3, cl.HYBRID),
    (cl.CONTAINERD_17, cl.RUNC_1_1, cl.HYBRID),
    (cl.CONTAINERD_17, cl.RUNC_1_3, cl.HYBRID),
    (cl.CONTAINERD_21, cl.RUNC_1_1, cl.HYBRID),
    (cl.CONTAINERD_21, cl.RUNC_1_3, cl.HYBRID),
    (cl.CONTAINERD_21, cl.RUNC_1_3, cl.UNIFIED),
]
#: The own-PID-namespace cell runs on the hybrid cells only. What it proves, runc-guard's
#: deadline before containerd's kill and the sweep's re-drive of the orphaned state, does
#: not depend on the cgroup layout (both act on runc's state and the recorded paths), and
#: runc on a cgroup2-only host is the pure-v2 cell's host-PID Path B; two more 7 s
#: teardowns there would add ~20 s to every run and nothing a reader could not infer.
OWN_PID_CELLS = [c for c in CELLS if c[2] != cl.UNIFIED]
#: Longer than containerd's io.containerd.timeout.shim.cleanup (5 s) and runc-guard's deadline.
LONG_TEARDOWN = 7.0


@dataclass
class Cell:
    name: str
    lab: cl.GuardedLab
    runc: str

    @property
    def containerd(self) -> cl.Containerd:
        return self.lab.containerd


def _cell_id(cell: tuple[str, str, str]) -> str:
    return "-".join(cell)


#: Every test names its cells; the lab of a cell is started once per module (indirect, module scope).
every_cell = pytest.mark.parametrize("cell", CELLS, ids=_cell_id, indirect=True, scope="module")


@pytest.fixture(scope="module")
def cell(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cell]:
    build_name, runc_version, layout = request.param
    build = cl.require_build(build_name)
    runc = cl.require_runc(runc_version)
    prereq.require_none(cl.missing_prerequisites(build))
    with cl.guarded_containerd_in(
        tmp_path_factory, "rgmx", layout, build=build, runc=runc
    ) as lab:
        yield Cell(_cell_id(request.param), lab, runc)


@pytest.fixture
def ns(cell: Cell) -> Iterator[str]:
    if not cell.containerd.alive():
        pytest.fail(f"containerd died:\n{cell.containerd.log()[-2000:]}")
    with cl.namespace(cell.containerd, "rgmx") as name:
        yield name


def _records(cell: Cell, task_id: str) -> list[str]:
    return [r for r in cl.pending_records(cell.lab.settings) if r.startswith(task_id + "@")]


def _left(cell: Cell, ns: str, task_id: str, dirs: list[str]) -> tuple[int, bool, int]:
    """(cgroup dirs, runtime state present, pending records) left by one task."""
    return len(dirs), os.path.exists(cell.containerd.runc_state(ns, task_id)), len(_records(cell, task_id))


def _sweep(cell: Cell, ns: str, task_id: str) -> subprocess.CompletedProcess[str]:
    """``runc-guardctl sweep`` as the node's timer runs it, pointed at the lab's roots."""
    state = cell.containerd.runc_state(ns, task_id)
    bundle = cell.containerd.bundle(ns, task_id)
    ctl = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")
    return subprocess.run(
        [ctl, "sweep", "--min-age", "0", "--pacing", "fixed", "--pause", "0", "--format", "json",
         "--runtime-root", os.path.dirname(os.path.dirname(state)),
         "--bundle-root", os.path.dirname(os.path.dirname(bundle)),
         "--kubepods", ns],
        capture_output=True, text=True, check=False, timeout=120,
        env={**os.environ, **cell.lab.settings, "RUNC_GUARD_RUNTIME": cell.runc},
    )


@every_cell
def test_path_b_host_pid(cell: Cell, ns: str, record_property: Callable[[str, object], None]) -> None:
    """Stock leaks dirs or state on the incident's path; runc-guard leaves nothing."""
    lab = cell.containerd
    stock = cl.path_b_crash(lab, ns, cell.runc, delay=2.5)
    try:
        stock_left = _left(cell, ns, stock.task_id, stock.left)
        assert stock_left[0] > 0 or stock_left[1], f"{cell.name}: the stock control did not leak"
    finally:
        cl.remove_dirs(stock.left)
    guard = cl.path_b_crash(lab, ns, cl.guard_binary(), delay=2.5)
    try:
        assert _left(cell, ns, guard.task_id, guard.left) == (0, False, 0), cell.containerd.log_lines_for(
            guard.task_id
        )
    finally:
        cl.remove_dirs(guard.left)
    record_property("figure", f"matrix {cell.name} path-b-host-pid: stock dirs={stock_left[0]}"
                    f" state={stock_left[1]} | runc-guard dirs=0 state=False records=0")


def _own_pid_crash(cell: Cell, ns: str, binary: str, delay: float) -> tuple[cl.Task, float]:
    """Path B in the task's own PID namespace: init killed, 2 of 3 children frozen ``delay`` s."""
    lab = cell.containerd
    task = cl.run_task(lab, ns, binary, children=3, host_pid=False)
    hold = FreezerHold.create()
    try:
        hold.hold(task.children()[:2])
        init = task.init_pid()
        shim = task.shim_pid(init)
        os.kill(init, signal.SIGKILL)
        os.kill(shim, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(task.gone, delay, 0.05)  # containerd's cleanup runs while the teardown hangs
        time.sleep(max(0.0, killed + delay - time.monotonic()))
        hold.release()
        wait_for(lambda: not task.pids(), 10)
        # containerd's cleanup budget (5 s) ran out before the release: what it finished is done, and
        # a task whose cleanup it killed (stock's) keeps its bundle for good; a short grace, no 15 s.
        wait_for(task.gone, 2, 0.05)
        return task, time.monotonic() - killed
    finally:
        hold.destroy()
        lab.ctr(ns, "container", "rm", task.id, check=False)


@pytest.mark.parametrize("cell", OWN_PID_CELLS, ids=_cell_id, indirect=True, scope="module")
def test_path_b_own_pid_namespace_past_the_cleanup_budget(
    cell: Cell, ns: str, record_property: Callable[[str, object], None]
) -> None:
    """A 7 s teardown in the task's own PID namespace: stock leaks; runc-guard reports at its
    deadline (before containerd's kill) and the sweep finishes the orphaned state: 0 left.

    Stock and runc-guard crash side by side on the one containerd (two tasks, two holds): each
    waits out its own 7 s teardown, so the cell takes one wait instead of two."""
    with ThreadPoolExecutor(2) as pool:
        stock_run = pool.submit(_own_pid_crash, cell, ns, cell.runc, LONG_TEARDOWN)
        guard_run = pool.submit(_own_pid_crash, cell, ns, cl.guard_binary(), LONG_TEARDOWN)
        (stock, _), (guard, _) = stock_run.result(), guard_run.result()
    stock_dirs = stock.cgroup_dirs()
    stock_left = _left(cell, ns, stock.id, stock_dirs)
    cl.remove_dirs(stock_dirs)
    assert stock_left[0] > 0 or stock_left[1], f"{cell.name}: the stock control did not leak"
    deletes = [e for e in cl.guard_events(cell.lab.settings, "delete") if e.get("container_id") == guard.id]
    assert deletes and deletes[0]["outcome"] == "deadline", deletes
    assert deletes[0]["exit_status"] == 75, deletes
    # Reported before containerd's 5 s kill: what containerd saw is runc-guard's exit, not
    # the SIGKILL of its cleanup (a killed delete would also have written no entry at all).
    killed = [line for line in cell.containerd.log_lines_for(guard.id) if "signal: killed" in line]
    assert killed == [], killed
    sweep = _sweep(cell, ns, guard.id)
    assert sweep.returncode == 0, sweep.stderr
    left = _left(cell, ns, guard.id, guard.cgroup_dirs())
    cl.remove_dirs(guard.cgroup_dirs())
    assert left == (0, False, 0), sweep.stdout
    record_property("figure", f"matrix {cell.name} path-b-own-pid-7s: stock dirs={stock_left[0]}"
                    f" state={stock_left[1]} | runc-guard exit 75 after {deletes[0]['total_ms']} ms,"
                    " after the sweep dirs=0 state=False records=0")


@every_cell
def test_path_a(cell: Cell, ns: str) -> None:
    """kill + delete while two children hang 1.5 s: the delete succeeds and leaves nothing."""
    lab = cell.containerd
    with cl.path_a(lab, ns, cl.guard_binary(), release_after=1.5) as run:
        try:
            assert run.delete.returncode == 0, run.delete.stderr
            assert _left(cell, ns, run.task.id, run.task.cgroup_dirs()) == (0, False, 0)
            assert run.task.gone()
        finally:
            run.hold.release()
            cl.remove_dirs(run.task.cgroup_dirs())


@every_cell
def test_deadline_then_retry(cell: Cell, ns: str) -> None:
    """Children hang past the deadline: the delete fails with runc-guard's reason and keeps the
    record and the runtime's state; containerd's retry after the release leaves nothing."""
    lab = cell.containerd
    with cl.path_a(lab, ns, cl.guard_binary(), release_after=None) as run:
        try:
            assert run.delete.returncode != 0
            assert "runc-guard: " in run.delete.stderr and "does not exist" not in run.delete.stderr
            assert len(_records(cell, run.task.id)) == 1
            run.hold.release()
            wait_for(lambda: not run.task.pids(), 5)
            retry = lab.ctr(ns, "task", "delete", run.task.id, check=False)
            assert retry.returncode == 0, retry.stderr
            assert _left(cell, ns, run.task.id, run.task.cgroup_dirs()) == (0, False, 0)
        finally:
            run.hold.release()
            wait_for(lambda: not run.task.pids(), 5)
            cl.remove_dirs(run.task.cgroup_dirs())
