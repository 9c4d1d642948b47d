"""Issue 21, item 12: after a cut-short delete under the systemd driver the sweep finishes the scope too.

Inside the booted-systemd lab (labkit.systemd): a host-PID task through
runc-guard, Path B with its children held past containerd's 5 s and the
scope's 5 s stop timeout. runc-guard reports at its deadline (exit 75) and
keeps runc's state and its pending record. A stop job of the scope that
outlives the stop timeout ends it ``failed``: runc's own destroy starts one
(stock runc on this path, a delete where runc-guard stepped aside); runc-guard
itself no longer does (issue 30, case 10), so the tests start it with
``systemctl stop`` while the children are held. ``runc-guardctl sweep`` re-runs
the runtime's delete, removes the v1 leftovers and must ``reset-failed`` the
scope of the container it finished, or systemd keeps one failed unit per such
container forever.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
import yaml

from labkit import prereq
from labkit import systemd as sl
from labkit.kernel import children, unique, wait_for

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sl.Machine]:
    """The booted lab machine (its root built once and cached), always stopped."""
    prereq.require_none(sl.missing())
    image = sl.ensure_image()
    with sl.booted_machine(str(tmp_path_factory.mktemp("rg21sd")), image) as m:
        # This module proves the sweep: runc-guard's finisher would otherwise finish these first.
        config = os.path.join(m.workdir, "runc-guard", "config.toml")
        with open(config) as f:
            body = f.read()
        with open(config, "w") as f:  # top-level key: before the file's [runtimes] table
            f.write("finish_window = 0\n" + body)
        yield m


def sweep(machine: sl.Machine, *args: str) -> tuple[int, dict[str, object], str]:
    """``runc-guardctl sweep --min-age 0 --format json`` in the machine."""
    argv = [f"{sl.GUARD_BIN}/runc-guardctl", "sweep", "--min-age", "0", "--format", "json", *args]
    out = machine.run(*argv, check=False, timeout=120)
    return out.returncode, (json.loads(out.stdout) if out.stdout.strip() else {}), out.stderr


def entries(report: dict[str, object], task: sl.SdTask) -> list[tuple[str, str]]:
    """(action, unit or "") of every report entry for the task's container."""
    found = report.get("containers", [])
    assert isinstance(found, list)
    return sorted((str(e["action"]), str(e.get("unit", ""))) for e in found if e["id"] == task.id)


def crash_past_the_deadline(machine: sl.Machine, ns: str) -> tuple[sl.SdTask, sl.FreezerHold]:
    """Path B through runc-guard with the children held until the caller releases them.

    Returns once runc-guard has exited at its deadline (the crash's delete is cut short).
    """
    task = sl.run_task(machine, ns, sl.GUARD)
    hold = sl.freezer_hold(machine)
    try:
        hold.hold(task.children())
        init = task.init_host_pid()
        shim = task.shim_host_pid(init)
        os.kill(init, signal.SIGKILL)
        assert wait_for(lambda: init not in task.host_pids(), 5)
        os.kill(shim, signal.SIGKILL)
        assert wait_for(lambda: bool(sl.guard_stats(machine, task.id)), 20, 0.1)
        assert sl.guard_stats(machine, task.id)[-1]["outcome"] == "deadline"
    except BaseException:
        hold.destroy()
        sl.remove_task(task)
        raise
    return task, hold


def stop_past_the_timeout(machine: sl.Machine, task: sl.SdTask) -> None:
    """Start the scope's stop job (as runc's own destroy would) and let its stop timeout pass."""
    machine.systemctl("stop", "--no-block", task.unit, check=True)
    assert wait_for(lambda: task.unit_state().get("ActiveState") == "deactivating", 5, 0.05)
    time.sleep(sl.STOP_TIMEOUT_S + 0.5)


def test_one_sweep_after_a_cut_short_delete_leaves_no_failed_scope(machine: sl.Machine) -> None:
    """Children held past the scope's stop timeout, the scope fails; one sweep: 0 dirs, state and record
    gone, unit collected."""
    ns = unique("rg21sd")
    records_before = set(sl.pending_records(machine))
    task, hold = crash_past_the_deadline(machine, ns)
    try:
        assert os.path.exists(task.runc_state())
        stop_past_the_timeout(machine, task)
        hold.release()
        assert wait_for(lambda: task.unit_state().get("ActiveState") == "failed", 30, 0.2), task.unit_state()
        left = task.host_dirs()
        assert len(left) >= 8
        code, report, err = sweep(machine)
        assert code == 0, err
        # The sweep's own container pass resets it (the unit named in runc's state).
        assert entries(report, task) == [("removed", ""), ("scope_reset_failed", task.unit)], report
        assert report["errors"] == []
        assert task.host_dirs() == [] and not os.path.exists(task.runc_state())
        assert set(sl.pending_records(machine)) == records_before
        assert task.unit_state()["LoadState"] == "not-found", task.unit_state()
        print(f"\nsystemd, cut-short delete: {len(left)} dirs + state + failed scope; "
              f"one sweep: 0 dirs, state gone, scope reset-failed and collected ({report['duration']} s)")
    finally:
        hold.destroy()
        sl.remove_task(task)


def test_a_sweep_during_the_stop_job_then_one_after_finishes_it(machine: sl.Machine) -> None:
    """Sweep right at runc-guard's deadline (scope still stopping, children held): it keeps what is busy;
    once the children are gone the next sweep removes the rest and resets the failed scope."""
    ns = unique("rg21sd")
    task, hold = crash_past_the_deadline(machine, ns)
    try:
        assert task.unit_state()["ActiveState"] == "active"  # runc-guard started no stop job
        machine.systemctl("stop", "--no-block", task.unit, check=True)
        assert wait_for(lambda: task.unit_state().get("ActiveState") == "deactivating", 5, 0.05)
        code, first, err = sweep(machine)
        assert code == 0, err
        assert ("kept:busy", "") in entries(first, task), first
        hold.release()
        assert wait_for(lambda: not task.host_pids(), 10)
        assert wait_for(lambda: task.unit_state().get("ActiveState") in ("failed", "inactive"), 30, 0.2)
        code, second, err = sweep(machine)
        assert code == 0, err
        assert task.host_dirs() == [] and not os.path.exists(task.runc_state())
        assert task.unit_state()["LoadState"] == "not-found", (task.unit_state(), second)
    finally:
        hold.destroy()
        sl.remove_task(task)


SWEEPER = os.path.join(os.path.dirname(__file__), "..", "contrib", "kubernetes", "runc-guard-sweeper.yaml")
#: A pod's view of the machine: its own mount namespace, without the node's /run/systemd.
POD = ["unshare", "-m", "--propagation", "private", "sh", "-c",
       'mount -t tmpfs pod /run/systemd && exec "$@"', "pod"]  # fmt: skip


def sweeper_script() -> str:
    """The shipped sweeper DaemonSet's container script."""
    with open(SWEEPER) as f:
        (doc,) = [d for d in yaml.safe_load_all(f) if d]
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["/bin/sh", "-c"]
    return str(container["args"][0])


def test_the_sweeper_daemonset_resets_the_scope_a_pods_view_cannot(machine: sl.Machine) -> None:
    """A sweep in a pod's own view (the DaemonSet before: no /run/systemd) finishes nothing of a
    cut-short delete under the systemd driver: runc refuses its re-drive, 8 dirs, the state and
    the failed scope stay. The DaemonSet's script, from that same view, runs the node's
    runc-guardctl in PID 1's namespaces: 0 dirs, state gone, scope reset and collected."""
    task, hold = crash_past_the_deadline(machine, unique("rg21sd"))
    metrics = f"/run/{unique('rg-sweeper')}.prom"
    try:
        stop_past_the_timeout(machine, task)
        hold.release()
        assert wait_for(lambda: task.unit_state().get("ActiveState") == "failed", 30, 0.2), task.unit_state()
        left = task.host_dirs()
        ctl = f"{sl.GUARD_BIN}/runc-guardctl"
        out = machine.run(*POD, ctl, "sweep", "--min-age", "0", "--format", "json", check=False, timeout=120)
        report = json.loads(out.stdout)
        # runc itself refuses the re-drive without /run/systemd: nothing is finished.
        assert entries(report, task) == [("error", "")], report
        assert "systemd not running on this host" in str(report["errors"]), report
        assert task.host_dirs() == left and os.path.exists(task.runc_state())
        assert task.unit_state()["ActiveState"] == "failed", task.unit_state()

        # HOST_CTL: the first candidate is missing, as the installer's path is on a .deb node
        env = {"PATH": sl.MACHINE_PATH, "HOST_CTL": f"/nonexistent/runc-guardctl {ctl}",
               "METRICS_FILE": metrics, "SWEEP_ARGS": "--min-age 0"}  # fmt: skip
        argv = [sl.NSENTER, "-t", str(machine.leader), "-a", "--", *POD, "sh", "-c", sweeper_script()]
        pod = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            collected = wait_for(lambda: task.unit_state().get("LoadState") == "not-found", 60, 0.2)
            (script,) = children(pod.pid)
            os.kill(script, signal.SIGTERM)
            _out, err = pod.communicate(timeout=10)
        finally:
            if pod.poll() is None:
                pod.kill()
                pod.wait()
        assert collected, (task.unit_state(), err)
        assert pod.returncode == 0, err
        assert task.host_dirs() == [] and not os.path.exists(task.runc_state())
        with open(machine.host_path(metrics)) as f:
            assert "runc_guard_" in f.read()
        print(f"\nsweeper DaemonSet: a pod-view sweep left {len(left)} dirs, runc's state "
              "and the failed scope (runc: systemd not running); the shipped script (nsenter into "
              "PID 1's namespaces): 0 dirs, state gone, scope collected")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(machine.host_path(metrics))
        hold.destroy()
        sl.remove_task(task)
