"""The interposed delete on the real kernel with real runc 1.1.5 (docs/background.md, the failure, Path B).

Each test builds a host-PID busybox container, holds some of its children in a
frozen v1 freezer (their SIGKILL stays pending), kills init and runs
``delete --force``. Stock runc must leak (the control: if it stops leaking, the
harness stopped reproducing the incident); runc-guard must leave nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from labkit import journald as jd
from labkit.kernel import (
    RUNC,
    cgroup_mount_points,
    crafted_container,
    guard_is_waiting,
    procs,
    read_jsonl,
    remove_tree,
    reported_events,
    script,
    wait_for,
)
from labkit.scenario import guard_env, run_leak_scenario

pytestmark = pytest.mark.kernel


def test_stock_runc_leaks_the_cgroups(workdir: str) -> None:
    """Control: runc 1.1.5 exits 0 and leaves the container's cgroups in every hierarchy but freezer."""
    result = run_leak_scenario(RUNC, workdir, 1.0, guard_env(workdir))
    assert result["exit_status"] == 0
    assert len(result["left"]) >= len(cgroup_mount_points()) - 1
    assert not result["state_exists"]  # runc 1.1 deletes its state even though it failed


def test_runc_guard_leaves_nothing(shim_binary: str, workdir: str) -> None:
    """runc-guard waits for the held processes, then removes every dir incl. a nested child cgroup."""
    result = run_leak_scenario(shim_binary, workdir, 1.5, guard_env(workdir))
    assert result["exit_status"] == 0, result["stderr"]
    assert result["left"] == []
    assert result["pending"] == []
    assert result["stdout"] == ""
    events = reported_events(workdir)
    (entry,) = [e for e in events if e["event"] == "delete"]
    # init was dead: runc-guard waited for the release *before* runc ran, so runc's own
    # removal succeeded; what runc could not remove (the nested child cgroup) runc-guard did
    assert entry["outcome"] in ("removed", "already_gone") and entry["container_id"] == result["container_id"]
    assert entry["attempts"] >= 2 and entry["waited_ms"] > 0  # it really waited for the release
    assert entry["init_alive"] is False and entry["runtime_runs"] == 1
    stats = read_jsonl(os.path.join(workdir, "stats.jsonl"))
    assert stats[-1]["outcome"] == entry["outcome"]
    # the wall time the benches split a delete by: it waited ~1.5 s for the release
    assert stats[-1]["total_ms"] == entry["total_ms"] >= 1000, stats[-1]
    assert stats[-1]["runtime_ms"] == entry["runtime_ms"] > 0, stats[-1]


def test_a_real_delete_loads_nothing_heavy_before_it_exits(python_entry: str, workdir: str) -> None:
    """The whole delete (wait, runc, removal, stats, spool, reporter hand-over) as the launcher
    runs it, under ``-X importtime``: none of the modules test_layout keeps off the path is
    imported, lazily either."""
    from tests.test_layout import NOT_BEFORE_THE_REPLY

    imports = os.path.join(workdir, "importtime.txt")
    wrapper = script(
        os.path.join(workdir, "timed-guard"),
        f'exec {sys.executable} -X importtime {python_entry} "$@" 2>>{imports}\n',
    )
    result = run_leak_scenario(wrapper, workdir, 0.3, guard_env(workdir))
    assert result["exit_status"] == 0 and result["left"] == []
    with open(imports) as f:
        loaded = {ln.split("|")[-1].strip() for ln in f if ln.startswith("import time:")}
    assert "runc_guard.delete.run" in loaded and "_ctypes" in loaded  # it did take the full path
    assert "ctypes" not in loaded, "runc_guard.libc: the ~6 ms ctypes package stays off the delete path"
    assert sorted(m for m in NOT_BEFORE_THE_REPLY if m in loaded) == []


def test_deadline_gives_exit_75_log_line_and_record(shim_binary: str, workdir: str) -> None:
    """Held past delete_timeout: exit 75, reason on stderr and in --log (JSON error), record kept."""
    env = guard_env(workdir, RUNC_GUARD_DELETE_TIMEOUT="1")
    result = run_leak_scenario(shim_binary, workdir, 4.0, env)
    assert result["exit_status"] == 75
    assert "still in use" in result["stderr"] and "does not exist" not in result["stderr"]
    last = json.loads(result["log_lines"][-1])
    assert last["level"] == "error" and "runc-guard: cgroup" in last["msg"]
    (record,) = result["pending"]
    assert record.startswith(result["container_id"] + "@")
    assert result["stdout"] == ""


def test_journald_receives_canonical_entry(shim_binary: str, workdir: str) -> None:
    """A real journald gets one canonical entry, queryable by CONTAINER_ID."""
    if not jd.available():
        pytest.fail("systemd-journald is missing: make deps installs the systemd package")
    with jd.private_journald() as journal:
        env = guard_env(workdir, RUNC_GUARD_JOURNAL_SOCKET=journal.socket)
        result = run_leak_scenario(shim_binary, workdir, 1.0, env, nested=False)
        assert result["exit_status"] == 0, result["stderr"]
        entries = journal.wait_entries(f"CONTAINER_ID={result['container_id']}", "EVENT=delete")
    (entry,) = entries
    assert entry["SYSLOG_IDENTIFIER"] == "runc-guard"
    assert entry["OUTCOME"] in ("removed", "already_gone")
    assert int(entry["ATTEMPTS"]) >= 2 and int(entry["WAITED_MS"]) > 0
    assert entry["PRIORITY"] == "6"
    assert not os.path.exists(os.path.join(workdir, "events.jsonl"))  # journald took it


def test_pure_cgroup_v2(shim_binary: str, tmp_path: os.PathLike[str]) -> None:
    """Pure v2 (private mount namespace, cgroup2 at /sys/fs/cgroup): stock runc leaks, runc-guard does not.

    Why the control leaks every run: runc 1.1.5 freezes the container's v2 cgroup before its
    SIGKILL and waits for ``frozen 1`` (up to 10 s). A task the v1 freezer holds never enters
    the v2 freezer's trap, so that freeze waited for the hold on some runs (traced: ``frozen 0``
    until the hold thawed) and the kill then came after it, with nothing left to leak. So the
    held children are frozen in a cgroup2 child first (labkit.kernel.freeze_v2_first): counted
    frozen, runc's freeze returns at once; its SIGKILL stays pending under the v1 hold; its one
    rmdir (no retry on v2 in 1.1) fails with EBUSY, and it exits 0.
    """
    results = {}
    for name, binary in (("stock", RUNC), ("guard", shim_binary)):
        freezer = os.path.join(tmp_path, f"freezer-{name}")
        os.mkdir(freezer)
        script = (
            "set -e; mount --make-rprivate /; umount -l /sys/fs/cgroup; "
            "mount -t cgroup2 none /sys/fs/cgroup; "
            f"mount -t cgroup -o freezer freezer {freezer}; "
            f"cd {os.getcwd()}; exec {sys.executable} -m labkit.scenario "
            f"--binary {binary} --hold 1.5 --freezer-root {freezer} --v2-frozen-first"
        )
        proc = subprocess.run(
            ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120, check=False
        )
        results[name] = json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr}
        relative = results[name].get("cgroup_relative", "")
        # whatever happened inside, nothing may stay in the real unified tree
        if relative:
            parent = relative.strip("/").split("/")[0]
            leftover = f"/sys/fs/cgroup/unified/{parent}"
            if os.path.isdir(leftover):
                for d, _, _ in os.walk(leftover):
                    for pid in procs(d):
                        os.kill(pid, signal.SIGKILL)
                wait_for(lambda: not any(procs(d) for d, _, _ in os.walk(leftover)), 5)  # noqa: B023
                remove_tree(leftover)
        os.rmdir(freezer)
    assert "error" not in results["stock"], results["stock"]
    assert "error" not in results["guard"], results["guard"]
    stock = results["stock"]
    assert stock["exit_status"] == 0 and stock["left"], f"control must leak on v2: {json.dumps(stock)}"
    assert all(p.startswith("/sys/fs/cgroup/rgtest") for p in results["stock"]["left"])
    assert any("device or resource busy" in line for line in stock["log_lines"]), stock["log_lines"]
    assert results["guard"]["exit_status"] == 0, results["guard"]["stderr"]
    assert results["guard"]["left"] == []


def test_no_state_passes_delete_through(shim_binary: str, workdir: str) -> None:
    """Unknown container: runc's own answer and exit status; quiet (nothing happened), no metric."""
    root = os.path.join(workdir, "root")
    os.mkdir(root)
    args = ["--root", root, "delete", "--force", "rgtest-absent"]
    stock = subprocess.run([RUNC, *args], capture_output=True, text=True, check=False)
    guard = subprocess.run(
        [shim_binary, *args], capture_output=True, text=True, env=guard_env(workdir), check=False
    )
    assert guard.returncode == stock.returncode
    assert "Traceback" not in guard.stderr and stock.stderr.strip().split("msg=")[-1] in guard.stderr
    assert reported_events(workdir) == []
    assert read_jsonl(os.path.join(workdir, "stats.jsonl")) == []
    debug = subprocess.run(
        [shim_binary, *args], capture_output=True, text=True, check=False,
        env=guard_env(workdir, RUNC_GUARD_LOG_LEVEL="debug"),
    )
    assert debug.returncode == stock.returncode
    (entry,) = reported_events(workdir)
    assert (entry["level"], entry["outcome"]) == ("debug", "unknown")
    assert read_jsonl(os.path.join(workdir, "stats.jsonl")) == []


class ForeignProcess:
    """A process outside every container cgroup, started and stopped by its pid."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(["sleep", "600"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_recycled_init_pid_is_never_signalled(shim_binary: str, workdir: str) -> None:
    """A recycled init pid (unrelated process outside the cgroup) survives; a straggler inside dies."""
    foreign = ForeignProcess()
    try:
        with crafted_container(workdir, init_pid=foreign.proc.pid) as ctr:
            straggler = ctr.add_process()
            env = guard_env(workdir, RUNC_GUARD_RUNTIME=ctr.runtime())
            proc = subprocess.run([shim_binary, "--root", ctr.root, "delete", "--force", ctr.id],
                                  capture_output=True, text=True, env=env, check=False, timeout=30)
            assert proc.returncode == 0, proc.stderr
            assert foreign.proc.poll() is None, "the recycled pid was signalled"
            assert wait_for(lambda: straggler.poll() is not None, 5)
            assert straggler.returncode == -signal.SIGKILL
            assert not any(os.path.exists(p) for p in ctr.dirs)
    finally:
        foreign.stop()


def test_state_escaping_cgroupfs_touches_nothing(shim_binary: str, workdir: str) -> None:
    """state.json aiming outside the cgroup filesystems (tampering): exit 65, runtime not run."""
    with crafted_container(workdir) as ctr:
        sibling = ctr.add_process(("memory",))
        with open(ctr.state_path()) as f:
            doc = json.load(f)
        doc["cgroup_paths"]["memory"] = workdir  # a tmpfs/ext4 dir, not a cgroup
        with open(ctr.state_path(), "w") as f:
            json.dump(doc, f)
        marker = os.path.join(workdir, "runtime-ran")
        runtime = script(os.path.join(workdir, "fake-runtime"), f"touch {marker}")
        env = guard_env(workdir, RUNC_GUARD_RUNTIME=runtime)
        proc = subprocess.run([shim_binary, "--root", ctr.root, "delete", "--force", ctr.id],
                              capture_output=True, text=True, env=env, check=False)
        assert proc.returncode == 65
        assert "refusing cgroup path" in proc.stderr and "Traceback" not in proc.stderr
        assert not os.path.exists(marker), "the runtime must not run on tampered state"
        assert sibling.poll() is None
        assert all(os.path.isdir(p) for p in ctr.dirs)


def test_state_naming_a_parent_cgroup_steps_aside(shim_binary: str, workdir: str) -> None:
    """state.json naming a cgroup that is not the container's (its parent): runc-guard steps aside.
    The runtime runs unchanged and its status is returned; runc-guard kills and removes nothing."""
    with crafted_container(workdir) as ctr:
        sibling = ctr.add_process(("memory",))
        with open(ctr.state_path()) as f:
            doc = json.load(f)
        doc["cgroup_paths"]["memory"] = os.path.dirname(ctr.dir_in("memory"))  # not the container
        with open(ctr.state_path(), "w") as f:
            json.dump(doc, f)
        marker = os.path.join(workdir, "runtime-ran")
        runtime = script(os.path.join(workdir, "fake-runtime"), f"touch {marker}; exit 3")
        env = guard_env(workdir, RUNC_GUARD_RUNTIME=runtime)
        proc = subprocess.run([shim_binary, "--root", ctr.root, "delete", "--force", ctr.id],
                              capture_output=True, text=True, env=env, check=False)
        assert proc.returncode == 3 and "Traceback" not in proc.stderr
        assert os.path.exists(marker), "stepping aside means the runtime runs as it would alone"
        assert sibling.poll() is None
        assert all(os.path.isdir(p) for p in ctr.dirs)
        assert not os.path.exists(os.path.join(workdir, "pending")), "stepping aside records nothing"
        events = reported_events(workdir)
        assert [e["event"] for e in events] == ["step_aside", "delete"]
        assert events[-1]["outcome"] == "stepped_aside" and events[-1]["level"] == "warning"


def test_sigterm_during_wait_keeps_record(shim_binary: str, workdir: str) -> None:
    """SIGTERM while waiting for a held cgroup: exit 143, record kept for the sweep, clear reason."""
    with crafted_container(workdir) as ctr:
        straggler = ctr.add_process()
        env = guard_env(workdir, RUNC_GUARD_RUNTIME=ctr.runtime(), RUNC_GUARD_KILL_STRAGGLERS="false",
                        RUNC_GUARD_DELETE_TIMEOUT="30")
        proc = subprocess.Popen([shim_binary, "--root", ctr.root, "delete", "--force", ctr.id],
                                stderr=subprocess.PIPE, text=True, env=env)
        pending = os.path.join(workdir, "pending")
        assert wait_for(lambda: os.path.isdir(pending) and bool(os.listdir(pending)), 10)
        assert wait_for(lambda: guard_is_waiting(proc.pid), 10, 0.005)  # in its wait loop, not before
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=10)
        assert proc.returncode == 128 + signal.SIGTERM
        assert "interrupted by SIGTERM" in err
        assert len(os.listdir(pending)) == 1
        assert straggler.poll() is None  # kill_stragglers=false respected
