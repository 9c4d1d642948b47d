"""Never more harm than the runtime, when a fact about the node fails (issue 21), on the real kernel.

Each case runs stock runc 1.1.5 alone as the control, then runc-guard in front of
it in the same situation, and compares exit status, cgroup directories, live
processes and runtime state. Faults the kernel will not give on demand are
injected into the real syscall with strace (``-e inject=SYSCALL:error=ERRNO``).
A wall-clock step has no faithful stand-in here (a time namespace offsets neither
CLOCK_REALTIME nor, for its readers, /proc start times; libfaketime breaks
clock_nanosleep and pidfd_open), so case 5 is proven in tests/test_delete_unit.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from labkit.kernel import RUNC, RuncContainer, reported_events, wait_for
from labkit.scenario import guard_env

pytestmark = pytest.mark.kernel

STRACE = shutil.which("strace") or "strace"


@dataclass
class Result:
    """What one delete left: the facts the issue compares, stock against runc-guard."""

    status: int
    stderr: str
    dirs: int
    live: int
    state: bool

    def row(self) -> tuple[int, int, int, bool]:
        return (self.status, self.dirs, self.live, self.state)


@pytest.fixture
def dead_init_container(workdir: str) -> Iterator[callable]:  # type: ignore[valid-type]
    """Host-PID containers whose init was SIGKILLed, five children still inside (Path B)."""
    made: list[RuncContainer] = []

    def make() -> tuple[RuncContainer, list[int]]:
        ctr = RuncContainer.start(workdir, children=5)
        made.append(ctr)
        children = ctr.children()
        os.kill(ctr.init_pid(), signal.SIGKILL)
        assert wait_for(lambda: ctr.init_pid() not in ctr.pids(), 5)
        return ctr, children

    yield make
    for ctr in made:
        ctr.destroy()


def _delete(argv: list[str], ctr: RuncContainer, env: dict[str, str], wrap: list[str] = ()) -> Result:  # type: ignore[assignment]
    proc = subprocess.run(
        [*wrap, *argv, "--root", ctr.root, "delete", "--force", ctr.id],
        capture_output=True, text=True, env=env, check=False, timeout=60,
    )
    wait_for(lambda: not ctr.pids(), 3)  # what the kernel still has to reap after the exit
    live = len(ctr.pids()) if ctr.cgroup_dirs() else 0
    return Result(
        proc.returncode, proc.stderr, len(ctr.cgroup_dirs()), live,
        os.path.exists(os.path.join(ctr.root, ctr.id, "state.json")),
    )


def _inject(syscall: str, errno_name: str, *, path: str | None = None, when: str | None = None) -> list[str]:
    spec = f"{syscall}:error={errno_name}" + (f":when={when}" if when else "")
    return [STRACE, "-f", "-qq", "-o", "/dev/null", "-e", f"trace={syscall}", "-e", f"inject={spec}",
            *(["-P", path] if path else [])]


def _entry(workdir: str, container_id: str) -> dict:  # type: ignore[type-arg]
    entries = [e for e in reported_events(workdir) if e.get("event") == "delete"
               and e.get("container_id") == container_id]
    assert entries, reported_events(workdir)
    return entries[-1]


def test_without_pidfd_open_the_delete_still_kills_and_removes(
    shim_binary: str, workdir: str, dead_init_container: callable  # type: ignore[valid-type]
) -> None:
    """Case 1, a kernel before 5.3: pidfd_open fails ENOSYS. Stock runc kills the host-PID stragglers
    by pid and exits 0 with nothing left; runc-guard now does the same (by pid, after a start-time
    check) instead of exiting 70 with every straggler alive, and says which fallback it used."""
    enosys = _inject("pidfd_open", "ENOSYS")
    stock_ctr, _ = dead_init_container()
    stock = _delete([RUNC], stock_ctr, dict(os.environ), enosys)
    guard_ctr, _ = dead_init_container()
    guard = _delete([shim_binary], guard_ctr, guard_env(workdir, RUNC_GUARD_RUNTIME=RUNC), enosys)
    assert stock.row() == (0, 0, 0, False), stock
    assert guard.row() == (0, 0, 0, False), guard
    entry = _entry(workdir, guard_ctr.id)
    assert entry["outcome"] == "removed" and len(entry["stragglers_killed"]) == 5
    assert "pidfd_open:ENOSYS" in entry["kernel_fallbacks"]


def test_unreadable_init_stat_steps_aside(shim_binary: str, workdir: str) -> None:
    """Case 2: runc-guard's read of the init's /proc/<pid>/stat fails with EMFILE (only that first
    read: runc's own reads succeed). Unknown is not dead: runc-guard steps aside and runc alone
    deletes the running container exactly as stock runc does (control: the same container kind,
    no fault): exit 0, nothing left; the entry says why."""
    stock_ctr = RuncContainer.start(workdir, children=2)
    guard_ctr = RuncContainer.start(workdir, children=2)
    try:
        stock = _delete([RUNC], stock_ctr, dict(os.environ))
        fault = _inject("openat", "EMFILE", path=f"/proc/{guard_ctr.init_pid()}/stat", when="1")
        guard = _delete([shim_binary], guard_ctr, guard_env(workdir, RUNC_GUARD_RUNTIME=RUNC), fault)
        assert stock.row() == (0, 0, 0, False), stock
        assert guard.row() == stock.row(), guard
        entry = _entry(workdir, guard_ctr.id)
        assert entry["outcome"] == "stepped_aside" and "cannot tell whether init" in entry["reason"]
        assert entry["stragglers_killed"] == []
    finally:
        stock_ctr.destroy()
        guard_ctr.destroy()


def test_kill_stragglers_false_lets_the_runtime_kill(
    shim_binary: str, workdir: str, dead_init_container: callable  # type: ignore[valid-type]
) -> None:
    """Case 4, kill_stragglers = false: stock runc SIGKILLs a host-PID container's stragglers itself and
    exits 0; runc-guard now runs it first (its own kill applies) and removes the rest: exit 0, nothing
    left, runc-guard killed nothing. It used to wait for emptiness first and exit 75 on every retry."""
    stock_ctr, _ = dead_init_container()
    stock = _delete([RUNC], stock_ctr, dict(os.environ))
    guard_ctr, _ = dead_init_container()
    env = guard_env(workdir, RUNC_GUARD_RUNTIME=RUNC, RUNC_GUARD_KILL_STRAGGLERS="false")
    guard = _delete([shim_binary], guard_ctr, env)
    assert stock.row() == (0, 0, 0, False), stock
    assert guard.row() == (0, 0, 0, False), guard
    entry = _entry(workdir, guard_ctr.id)
    assert entry["stragglers_killed"] == [] and entry["runtime_runs"] == 1


def test_a_runtime_stopped_mid_destroy_does_not_leave_the_freezer_frozen(
    shim_binary: str, workdir: str
) -> None:
    """runc 1.1's destroy freezes the container's v1 freezer, SIGKILLs, then thaws. A runtime stopped in
    between (here: it freezes, then hangs past runc-guard's deadline) left the freezer FROZEN for good, so
    the SIGKILLed processes sat in state D and the cgroups could never empty (a crash storm in CI showed
    ``sleep`` in D in every hierarchy). runc-guard now thaws the container's own freezer when it stops the
    runtime: the process dies, the freezer reads THAWED. Control: the same runtime stopped by timeout(1)
    alone, as containerd's kill stops stock runc, leaves it FROZEN."""
    from labkit.kernel import crafted_container, script

    for front in ("stock", "guard"):
        with crafted_container(workdir) as ctr:
            inside = ctr.add_process(("memory", "freezer", "unified"))
            freezer = os.path.join(ctr.dir_in("freezer"), "freezer.state")
            body = f"echo FROZEN > {freezer}; kill -9 {inside.pid}; exec sleep 60"
            runtime = script(os.path.join(workdir, f"rt-{front}"), body)
            if front == "stock":
                argv = [runtime, "--root", ctr.root, "delete", "--force", ctr.id]
                subprocess.run(["timeout", "-s", "KILL", "1", *argv], check=False, timeout=30)
                with open(freezer) as f:
                    assert f.read().strip() == "FROZEN"  # the control: left frozen, the process stuck
                assert inside.poll() is None
                continue
            env = guard_env(workdir, RUNC_GUARD_RUNTIME=runtime, RUNC_GUARD_DELETE_TIMEOUT="1")
            argv = [shim_binary, "--root", ctr.root, "delete", "--force", ctr.id]
            done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=60)
            assert done.returncode == 75, done.stderr
            with open(freezer) as f:
                assert f.read().strip() == "THAWED"
            assert wait_for(lambda p=inside: p.poll() is not None, 10), "the pending SIGKILL must land"
            entry = _entry(workdir, ctr.id)
            assert entry["thawed"] == [os.path.dirname(freezer)], entry


def test_a_paused_container_stays_paused_when_its_delete_is_stopped(shim_binary: str, workdir: str) -> None:
    """A plain ``delete`` (no --force) of a paused v1 container whose runtime is stopped by the
    deadline: runc-guard used to thaw the container's freezer, and the workload ran again while
    containerd believed it paused. Only a freezer the runtime froze during this delete is thawed now;
    one frozen before it began stays FROZEN, as the runtime alone (the control) leaves it."""
    import json

    from labkit.kernel import crafted_container, script

    for front in ("stock", "guard"):
        with crafted_container(workdir) as ctr:
            inside = ctr.add_process(("memory", "freezer", "unified"))
            with open(f"/proc/{inside.pid}/stat") as f:
                start = int(f.read().rsplit(")", 1)[1].split()[19])
            with open(ctr.state_path()) as f:
                state = json.load(f)
            state.update(init_process_pid=inside.pid, init_process_start=start)  # the paused init
            with open(ctr.state_path(), "w") as f:
                json.dump(state, f)
            freezer = os.path.join(ctr.dir_in("freezer"), "freezer.state")
            with open(freezer, "w") as f:
                f.write("FROZEN")  # what runc pause writes
            runtime = script(os.path.join(workdir, f"rt-paused-{front}"), "exec sleep 60")
            argv = ["--root", ctr.root, "delete", ctr.id]
            if front == "stock":
                subprocess.run(["timeout", "-s", "KILL", "1", runtime, *argv], check=False, timeout=30)
            else:
                env = guard_env(workdir, RUNC_GUARD_RUNTIME=runtime, RUNC_GUARD_DELETE_TIMEOUT="1")
                done = subprocess.run([shim_binary, *argv], capture_output=True, text=True, env=env,
                                      check=False, timeout=60)  # fmt: skip
                assert done.returncode == 75, done.stderr
                assert "thawed" not in _entry(workdir, ctr.id)
            with open(freezer) as f:
                assert f.read().strip() == "FROZEN", front
            assert inside.poll() is None and os.path.exists(ctr.state_path()), front


def test_a_cgroup_removed_between_the_walk_and_its_statfs_is_not_tampering(
    shim_binary: str, workdir: str, dead_init_container: callable  # type: ignore[valid-type]
) -> None:
    """A directory that vanishes between the path walk and its statfs (a concurrent delete of the same
    id removed it; seen in a two-delete race as exit 65) is answered for by its parent: statfs of the
    container's first cgroup fails ENOENT once. Stock runc never statfs it: exit 0, nothing left;
    runc-guard the same, where it used to refuse the path as tampered (exit 65, runtime not run)."""
    stock_ctr, _ = dead_init_container()
    stock = _delete([RUNC], stock_ctr, dict(os.environ))
    guard_ctr, _ = dead_init_container()
    first = sorted(guard_ctr.cgroup_dirs())[0]
    vanished = _inject("statfs", "ENOENT", path=first, when="1")
    guard = _delete([shim_binary], guard_ctr, guard_env(workdir, RUNC_GUARD_RUNTIME=RUNC), vanished)
    assert stock.row() == (0, 0, 0, False), stock
    assert guard.row() == (0, 0, 0, False), guard
    assert _entry(workdir, guard_ctr.id)["outcome"] == "removed"
