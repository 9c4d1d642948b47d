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
    unique,
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


class CrunSystemdLayout:
    """crun 1.28's systemd-driver layout crafted on the real hierarchies: ``cri-containerd-<id>.scope`` with
    the ``container`` leaf in every mount (crun places its one relative path under each), and crun's
    ``status`` + ``config.json`` (no PID namespace: host PID, its stragglers ours to kill) naming it. No
    systemd unit exists (the host's PID 1 is not systemd): the delete's scope handling has nothing to ask."""

    def __init__(self, workdir: str, scope_of: str | None = None) -> None:
        self.id = unique("rgtest-crun")
        self.root = os.path.join(workdir, "root")
        self.parents = [os.path.join(m, f"{self.id}-parent") for m in cgroup_mount_points()]
        named = scope_of or self.id
        self.relative = f"/{self.id}-parent/cri-containerd-{named}.scope/container"
        self.leaves = [m + self.relative for m in cgroup_mount_points()]
        self.scopes = [os.path.dirname(leaf) for leaf in self.leaves]
        self.started: list[subprocess.Popen[bytes]] = []
        for leaf in self.leaves:
            os.makedirs(leaf)
        os.makedirs(os.path.join(self.root, self.id))
        status = {"pid": 1, "process-start-time": 1, "cgroup-path": self.relative, "systemd-cgroup": True,
                  "scope": f"cri-containerd-{self.id}.scope", "bundle": ""}  # fmt: skip
        with open(os.path.join(self.root, self.id, "status"), "w") as f:
            json.dump(status, f)
        with open(os.path.join(self.root, self.id, "config.json"), "w") as f:
            json.dump({"linux": {"namespaces": [{"type": "mount"}]}}, f)

    def add_process(self) -> subprocess.Popen[bytes]:
        """``sleep`` moved into the leaf in the memory and unified hierarchies (where they exist)."""
        proc = subprocess.Popen(["sleep", "600"])
        self.started.append(proc)
        for leaf in [d for d in self.leaves if "/memory/" in d or "/unified/" in d] or self.leaves:
            with open(os.path.join(leaf, "cgroup.procs"), "w") as f:
                f.write(str(proc.pid))
        return proc

    def cleanup(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for parent in self.parents:
            wait_for(lambda p=parent: not any(procs(d) for d, _, _ in os.walk(p)), 5)  # type: ignore[misc]
            remove_tree(parent)


@pytest.mark.parametrize("scope_of", ["own", "other"])
def test_crun_systemd_leaf_and_scope_on_the_real_kernel(
    shim_binary: str, workdir: str, scope_of: str
) -> None:
    """crun's ``<prefix>-<id>.scope/container`` on real cgroupfs (statfs, lstat, rmdir): the straggler in the
    leaf is killed and every leaf goes before its scope, the unit named after the status's ``scope``. A status
    naming another id's scope + ``container`` steps aside: the runtime alone, nothing killed or removed."""
    layout = CrunSystemdLayout(workdir, None if scope_of == "own" else unique("rgtest-other"))
    try:
        straggler = layout.add_process()
        runtime = script(os.path.join(workdir, "fake-crun"), f"rm -rf {layout.root}/{layout.id}")
        env = guard_env(workdir, RUNC_GUARD_RUNTIME=runtime)
        proc = subprocess.run([shim_binary, "--root", layout.root, "delete", "--force", layout.id],
                              capture_output=True, text=True, env=env, check=False, timeout=30)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        (entry,) = [e for e in reported_events(workdir) if e["event"] == "delete"]
        if scope_of == "other":
            assert entry["outcome"] == "stepped_aside" and "not named after" in entry["reason"], entry
            assert straggler.poll() is None and all(os.path.isdir(d) for d in layout.leaves)
            return
        assert wait_for(lambda: straggler.poll() is not None, 5)
        assert straggler.returncode == -signal.SIGKILL
        assert not any(os.path.exists(d) for d in layout.leaves + layout.scopes)
        assert entry["outcome"] == "removed" and entry["systemd_unit"] == f"cri-containerd-{layout.id}.scope"
        leaf_first = [p for pair in zip(layout.leaves, layout.scopes, strict=True) for p in pair]
        assert entry["cgroup_paths"] == leaf_first
        pending = os.path.join(workdir, "pending")
        assert not os.path.isdir(pending) or not os.listdir(pending)
    finally:
        layout.cleanup()
