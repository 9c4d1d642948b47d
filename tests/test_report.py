"""Report after replying: the spool, the detached reporter, and what the caller sees."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labkit.kernel import read_jsonl, script, spool_lock_holder, spool_reporters, wait_for, wait_reported
from labkit.scenario import guard_env
from runc_guard.delete.report import EventLog
from runc_guard.reporter import drain_spool
from runc_guard.spool import pending_files, spool_dir, try_lock, write_spool

# -- the spool, in process ------------------------------------------------------------------


def test_event_log_filters_by_level_and_binds_context() -> None:
    """Entries below the level are dropped as structlog's filtering logger would; bind shares the list."""
    log = EventLog("warning", {"container_id": "a"})
    log.info("quiet")
    log.warning("step_aside", reason="x")
    log.bind(container_id="b").error("delete", outcome="deadline")
    assert [(e["event"], e["level"], e["container_id"]) for e in log.entries] == [
        ("step_aside", "warning", "a"),
        ("delete", "error", "b"),
    ]
    assert all(str(e["timestamp"]).endswith("Z") for e in log.entries)


def _sink(tmp: str) -> dict[str, str]:
    return {"journal_socket": os.path.join(tmp, "no-journald"), "log_file": os.path.join(tmp, "events.jsonl")}


def test_spooled_entries_are_sent_then_unlinked(tmp_path: Any) -> None:
    """drain_spool sends every file's entries (here to the fallback file: no journald) and removes it."""
    tmp = str(tmp_path)
    spool = spool_dir(os.path.join(tmp, "cache"))
    log = EventLog("info", {"container_id": "c1"})
    log.info("delete", outcome="removed", cgroup_paths=["/sys/fs/cgroup/memory/x"])
    write_spool(spool, log.entries, _sink(tmp))
    assert len(pending_files(spool)) == 1
    assert drain_spool(spool, linger=0) == 1
    (entry,) = read_jsonl(os.path.join(tmp, "events.jsonl"))
    assert (entry["event"], entry["outcome"], entry["container_id"]) == ("delete", "removed", "c1")
    assert entry["timestamp"] == log.entries[0]["timestamp"], "the time it happened, not when it was sent"
    assert pending_files(spool) == []


def test_a_detached_reporter_sends_without_the_site(tmp_path: Any) -> None:
    """The reporter a delete detaches runs ``python -IS`` (no site, no third-party package) and
    still finds runc-guard where its caller did: the entry arrives, the spool empties."""
    from runc_guard.delete.report import _REPORTER, _helper_argv, detach_reporter

    assert _helper_argv(_REPORTER, [])[1] == "-IS"
    tmp = str(tmp_path)
    spool = spool_dir(os.path.join(tmp, "cache"))
    log = EventLog("info", {"container_id": "c2"})
    log.info("delete", outcome="removed")
    write_spool(spool, log.entries, _sink(tmp))
    pid = detach_reporter(spool, 0.0)
    assert pid > 0
    os.waitpid(pid, 0)
    (entry,) = read_jsonl(os.path.join(tmp, "events.jsonl"))
    assert (entry["event"], entry["container_id"]) == ("delete", "c2")
    assert pending_files(spool) == []


def test_unreadable_or_foreign_spool_files_are_dropped_not_stuck(tmp_path: Any) -> None:
    """A spool file that does not parse, or that others could have written (never unmarshalled),
    is removed, so it cannot stall every later entry."""
    tmp = str(tmp_path)
    spool = spool_dir(os.path.join(tmp, "cache"))
    os.makedirs(spool)
    with open(os.path.join(spool, "0001-1.entries"), "w") as f:
        f.write("{not marshal")
    foreign = write_spool(spool, [{"event": "planted", "level": "info"}], _sink(tmp))
    os.chmod(foreign, 0o666)
    write_spool(spool, [{"event": "delete", "level": "info"}], _sink(tmp))
    assert drain_spool(spool, linger=0) == 1
    assert pending_files(spool) == []
    assert [e["event"] for e in read_jsonl(os.path.join(tmp, "events.jsonl"))] == ["delete"]


def test_a_held_lock_means_another_reporter_drains(tmp_path: Any) -> None:
    """While one reporter holds the spool's lock, another returns at once and leaves the files to it."""
    tmp = str(tmp_path)
    spool = spool_dir(os.path.join(tmp, "cache"))
    write_spool(spool, [{"event": "delete", "level": "info"}], _sink(tmp))
    held = try_lock(spool)
    assert held is not None
    try:
        assert drain_spool(spool, linger=0) == 0
        assert len(pending_files(spool)) == 1
    finally:
        os.close(held)
    assert drain_spool(spool, linger=0) == 1


# -- the real shim: status first, entries after ---------------------------------------------


def _dead_container(root: str, cid: str) -> None:
    """State of a container whose init is gone (no pid is above PID_MAX_LIMIT) and that has no cgroups."""
    os.makedirs(os.path.join(root, cid))
    with open(os.path.join(root, cid, "state.json"), "w") as f:
        doc = {"id": cid, "init_process_pid": (4 << 20) + 7, "init_process_start": 1, "cgroup_paths": {}}
        json.dump(doc, f)


def _env(workdir: str, linger: str) -> dict[str, str]:
    runtime = script(os.path.join(workdir, "runtime"), 'for id; do :; done\nrm -rf "$RT_ROOT/$id"')
    return guard_env(workdir, RUNC_GUARD_RUNTIME=runtime, RUNC_GUARD_REPORTER_LINGER=linger,
                     RT_ROOT=os.path.join(workdir, "root"))


def test_reporter_leaves_the_callers_session_and_pipes(shim_binary: str, workdir: str) -> None:
    """The caller gets status 0 and empty stdout/stderr; the lingering reporter is in its own session
    and holds none of the caller's pipes (go-runc waits for them to close): stdio is /dev/null."""
    root = os.path.join(workdir, "root")
    _dead_container(root, "c1")
    proc = subprocess.run([shim_binary, "--root", root, "delete", "--force", "c1"], capture_output=True,
                          env=_env(workdir, "3"), timeout=30, check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")
    spool = spool_dir(os.path.join(workdir, "cache"))
    assert wait_for(lambda: spool_lock_holder(spool) != 0 and bool(spool_reporters(spool)), 10, 0.005)
    (reporter,) = spool_reporters(spool)
    try:
        assert os.getsid(reporter) == reporter != os.getsid(0)
        assert [os.readlink(f"/proc/{reporter}/fd/{fd}") for fd in (0, 1, 2)] == ["/dev/null"] * 3
        targets = []
        for fd in os.listdir(f"/proc/{reporter}/fd"):
            with contextlib.suppress(FileNotFoundError):  # a spool file it has open for a moment
                targets.append(os.readlink(f"/proc/{reporter}/fd/{fd}"))
        assert not [t for t in targets if t.startswith(("pipe:", "socket:"))], targets
    finally:
        wait_reported(os.path.join(workdir, "cache"))
    (entry,) = [e for e in read_jsonl(os.path.join(workdir, "events.jsonl")) if e["event"] == "delete"]
    assert (entry["container_id"], entry["exit_status"]) == ("c1", 0)


def test_a_sigkill_of_the_callers_group_loses_no_entry(shim_binary: str, workdir: str) -> None:
    """containerd's shim (the caller) and its process group are SIGKILLed right after the delete
    returned: the reporter, in its own session, still sends the entry."""
    root = os.path.join(workdir, "root")
    _dead_container(root, "c1")
    done = os.path.join(workdir, "done")
    caller = subprocess.Popen(
        ["sh", "-c", '"$0" --root "$1" delete --force c1; echo $? > "$2"; exec sleep 60',
         shim_binary, root, done],
        env=_env(workdir, "1"), start_new_session=True,
    )
    try:
        assert wait_for(lambda: os.path.exists(done) and os.path.getsize(done) > 0, 30, 0.005)
        os.killpg(caller.pid, signal.SIGKILL)
    finally:
        caller.kill()
        caller.wait()
    with open(done) as f:
        assert f.read().strip() == "0"
    (entry,) = [e for e in _reported(workdir) if e["event"] == "delete"]
    assert entry["container_id"] == "c1"


def test_an_entry_stranded_in_the_spool_goes_with_the_next_delete(shim_binary: str, workdir: str) -> None:
    """A reporter that never ran (here: the spool's lock held, as by one killed mid-way) strands the
    entry; the next delete's reporter sends it too."""
    root = os.path.join(workdir, "root")
    env = _env(workdir, "0")
    spool = spool_dir(os.path.join(workdir, "cache"))
    os.makedirs(spool)
    held = try_lock(spool)
    assert held is not None
    try:
        _dead_container(root, "c1")
        assert subprocess.run([shim_binary, "--root", root, "delete", "--force", "c1"], env=env,
                              timeout=30, check=False).returncode == 0
        assert len(pending_files(spool)) == 1
    finally:
        os.close(held)
    _dead_container(root, "c2")
    assert subprocess.run([shim_binary, "--root", root, "delete", "--force", "c2"], env=env,
                          timeout=30, check=False).returncode == 0
    ids = sorted(e["container_id"] for e in _reported(workdir) if e["event"] == "delete")
    assert ids == ["c1", "c2"]


@pytest.mark.parametrize("count", [50])
def test_a_storm_of_deletes_loses_no_entry(shim_binary: str, workdir: str, count: int) -> None:
    """50 deletes at once with the default linger: every caller gets 0 and empty output, and every
    delete's entry (canonical, or startup_overloaded for one that stepped aside) arrives exactly once."""
    root = os.path.join(workdir, "root")
    env = _env(workdir, "2")
    ids = [f"s{i:02d}" for i in range(count)]
    for cid in ids:
        _dead_container(root, cid)
    procs = [
        subprocess.Popen([shim_binary, "--root", root, "delete", "--force", cid], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for cid in ids
    ]
    results = [(p.communicate(timeout=60), p.returncode) for p in procs]
    assert all(r == ((b"", b""), 0) for r in results), results
    # a delete that found every delete slot held stepped aside: its entry says so
    ended = ("delete", "startup_overloaded")
    got = sorted(e["container_id"] for e in _reported(workdir) if e["event"] in ended)
    assert got == ids


def _reported(workdir: str) -> list[dict[str, Any]]:
    assert wait_reported(os.path.join(workdir, "cache"), timeout=30)
    return read_jsonl(os.path.join(workdir, "events.jsonl"))


@pytest.mark.kernel
def test_a_detached_helper_runs_below_containerds_session(tmp_path: Any) -> None:
    """Reporter and finisher start a session of their own; under sched_autogroup that session
    would share the CPU as an equal of containerd's (shims and runtimes included) whatever the
    helper's nice. The spawner lowers both the helper's nice and its autogroup's as its interpreter
    starts: the helper's first statement finds them lowered, on the real kernel."""
    from labkit import prereq
    from runc_guard.delete.report import spawn_detached
    from runc_guard.spool import HELPER_NICE

    prereq.require(os.path.exists("/proc/self/autogroup"), "sched_autogroup (/proc/self/autogroup)")
    out = str(tmp_path / "seen")
    program = "; ".join([
        "import os, sys",
        "group = open('/proc/self/autogroup').read().strip()",
        "nice = os.getpriority(os.PRIO_PROCESS, 0)",
        "open(sys.argv[2] + '.tmp', 'w').write(f'{group}|{nice}')",
        "os.rename(sys.argv[2] + '.tmp', sys.argv[2])",
    ])
    lock = os.open(str(tmp_path / "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    pid = spawn_detached(program, [out], lock)
    assert pid > 0
    os.waitpid(pid, 0)
    with open(out) as f:
        group, nice = f.read().split("|")
    with open("/proc/self/autogroup") as f:
        # Empty for a task still in the root autogroup (its session never called setsid).
        ours = (f.read().split() or ["<root autogroup>"])[0]
    assert group, "setsid gives the helper an autogroup of its own, so the file names it"
    assert group.split()[0] != ours, "a session of its own: an autogroup of its own"
    assert group.split()[-1] == str(HELPER_NICE) and int(nice) == HELPER_NICE, (group, nice)


def _make_cgroup(mount: str, name: str, cpus: str | None = None) -> str:
    """``<mount>/<name>``; in a v1 cpuset, with ``cpus`` (the parent's by default) and the parent's mems."""
    path = os.path.join(mount, name)
    os.mkdir(path)
    if os.path.exists(os.path.join(path, "cpuset.cpus")):
        for knob, value in (("cpuset.cpus", cpus), ("cpuset.mems", None)):
            wanted = Path(mount, knob).read_text().strip() if value is None else value
            Path(path, knob).write_text(wanted)
    return path


@contextlib.contextmanager
def _helper_started_from_a_pod(
    tmp_path: Any, leave: bool, containerd: bool = True
) -> Iterator[tuple[list[str], list[str], dict[str, Any]]]:
    """A caller in a pod's cgroups (every hierarchy; its v1 cpuset narrowed to CPU 0) with its cwd
    in a bundle directory starts a detached helper, as a serving shim under ``ShimCgroup`` would.
    ``containerd``: the caller is the child of a process named ``containerd`` that lives in a service
    cgroup of its own in every hierarchy (what containerd.service is under systemd). Yields (the
    pod's cgroups, the service's, what the helper saw: cwd, /proc/self/cgroup, CPU affinity).
    ``leave``: the helper runs step_back first. Everything is let go and removed afterwards."""
    from labkit.kernel import cgroup_mount_points, exited, remove_tree, unique

    # a kubepods level, as kubelet names its (no sweep looks below this one: not kubepods[.slice])
    pod_name, svc_name = unique("kubepods-rgtest-pod"), unique("rg-helper-svc")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    seen, go = str(tmp_path / "seen"), str(tmp_path / "go")
    program = "\n".join([
        "import json, os, sys, time",
        "sys.path.insert(0, sys.argv[1])",
        "from runc_guard.spool import step_back",
        f"landing = {'step_back()' if leave else 'False'}",
        "here = {'cwd': os.getcwd(), 'cgroup': open('/proc/self/cgroup').read(),",
        "        'cpus': sorted(os.sched_getaffinity(0)), 'landing': landing}",
        "open(sys.argv[2] + '.tmp', 'w').write(json.dumps(here))",
        "os.rename(sys.argv[2] + '.tmp', sys.argv[2])",
        "end = time.monotonic() + 30",
        "while not os.path.exists(sys.argv[3]) and time.monotonic() < end:",
        "    time.sleep(0.02)",
    ])
    pods: list[str] = []
    services: list[str] = []
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pid = 0
    try:
        for mount in cgroup_mount_points():
            pods.append(_make_cgroup(mount, pod_name, cpus="0"))
            services.append(_make_cgroup(mount, svc_name))
        caller = "\n".join([
            "import os, sys",
            "from runc_guard.delete.report import spawn_detached",
            f"for p in {pods!r}:",
            "    open(os.path.join(p, 'cgroup.procs'), 'w').write(str(os.getpid()))",
            f"os.chdir({str(bundle)!r})",
            f"lock = os.open({str(tmp_path / 'lock')!r}, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)",
            f"print(spawn_detached({program!r}, [{seen!r}, {go!r}], lock))",
        ])
        argv = [sys.executable, "-c", caller]
        if containerd:  # the caller's parent: a process named containerd in the service's cgroups
            fake = tmp_path / "containerd"
            fake.symlink_to(os.path.realpath(sys.executable))
            parent = "\n".join([
                "import os, subprocess, sys",
                f"for p in {services!r}:",
                "    open(os.path.join(p, 'cgroup.procs'), 'w').write(str(os.getpid()))",
                "sys.exit(subprocess.run(sys.argv[1:], check=False).returncode)",
            ])
            argv = [str(fake), "-I", "-c", parent, *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False, cwd=repo)
        assert done.returncode == 0, done.stderr
        pid = int(done.stdout)
        assert pid > 0 and wait_for(lambda: os.path.exists(seen), timeout=20), done.stderr
        with open(seen) as f:
            yield pods, services, json.load(f)
    finally:
        Path(go).write_text("")
        if pid > 0 and not wait_for(lambda: exited(pid), timeout=20):
            os.kill(pid, signal.SIGKILL)
        for path in [*pods, *services]:
            remove_tree(path)


def _removable(paths: list[str]) -> list[bool]:
    removable = []
    for path in paths:
        try:
            os.rmdir(path)
            removable.append(True)
        except OSError:
            removable.append(False)
    return removable


@pytest.mark.kernel
@pytest.mark.parametrize("leave", [False, True], ids=["control-stays", "step_back-leaves"])
def test_a_detached_helper_leaves_its_callers_cwd_and_cgroup(tmp_path: Any, leave: bool) -> None:
    """A helper started from a pod's cgroup, in the bundle directory, holds neither once it has
    stepped back: the pod's cgroups can be removed while it lingers (kubelet's pod cleanup), and
    its cwd is ``/``. The control (no step_back) shows the caller's place is inherited."""
    with _helper_started_from_a_pod(tmp_path, leave) as (pods, _services, seen):
        name = os.path.basename(pods[0])
        removable = _removable(pods)
        if leave:
            assert seen["cwd"] == "/" and name not in seen["cgroup"], seen
            assert all(removable), "the helper keeps none of the caller's cgroups populated"
        else:
            assert seen["cwd"] == str(tmp_path / "bundle") and name in seen["cgroup"], seen
            assert not any(removable), "the control: an inherited cgroup stays populated"


@pytest.mark.kernel
def test_a_helper_lands_where_containerd_is_bounded_never_wider(tmp_path: Any) -> None:
    """Issue 42 case 6: a helper that steps back joins, in every hierarchy, the cgroup of the
    containerd it was started under (its service cgroup: the admin's memory, pids and CPU bounds),
    never a hierarchy's root, and its CPU affinity is never wider than its caller's (a cpuset move
    resets affinity to the new cpuset's CPUs: given back). Before: the root of every hierarchy,
    affinity widened from the pod's CPU 0 to every CPU."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs to tell a wider affinity")
    with _helper_started_from_a_pod(tmp_path, leave=True) as (pods, services, seen):
        svc = "/" + os.path.basename(services[0])
        paths = [line.split(":", 2)[2] for line in seen["cgroup"].splitlines()]
        in_service = sum(p == svc for p in paths)
        print(f"helper after step_back: {in_service} of {len(paths)} hierarchies in containerd's service "
              f"cgroup, {sum(p == '/' for p in paths)} in a root; CPUs {seen['cpus']} (caller: [0])")
        assert paths and all(p == svc for p in paths), seen["cgroup"]
        assert sorted(seen["landing"]) == sorted(services), seen
        assert seen["cpus"] == [0], seen
        assert all(_removable(pods))


@pytest.mark.kernel
def test_a_helper_with_no_containerd_above_it_stays_where_it_is(tmp_path: Any) -> None:
    """No containerd (nor a shim containerd left in its own cgroup) among its ancestors: where the
    admin bounds it is unknown, so the helper stays where it was started, as the runtime it runs
    would (finisher_main and reporter_main say so once); it never lands in a root."""
    with _helper_started_from_a_pod(tmp_path, leave=True, containerd=False) as (pods, _services, seen):
        pod = "/" + os.path.basename(pods[0])
        paths = [line.split(":", 2)[2] for line in seen["cgroup"].splitlines()]
        assert paths and all(p == pod for p in paths), seen["cgroup"]
        assert seen["cwd"] == "/" and seen["cpus"] == [0], seen
        assert seen["landing"] is None, "stayed in a pod's cgroups: the helper says so (once)"


def _proc_tree(tmp_path: Any, tree: dict[int, tuple[int, str, str]]) -> str:
    """A /proc with ``pid: (ppid, comm, cgroup text)`` for each process."""
    proc = tmp_path / "proc"
    for pid, (ppid, comm, cgroup) in tree.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0 -1\n")
        (proc / str(pid) / "comm").write_text(comm[:15] + "\n")
        (proc / str(pid) / "cgroup").write_text(cgroup)
    return str(proc)


SERVICE = "4:memory:/system.slice/containerd.service\n0::/system.slice/containerd.service\n"
POD = "4:memory:/kubepods/burstable/pod1234abcd\n0::/kubepods/burstable/pod1234abcd\n"


@pytest.mark.parametrize(
    ("tree", "home"),
    [
        # dead-shim cleanup: containerd -> shim delete -> runc-guard (-> the helper's spawner)
        ({1: (0, "systemd", "0::/init.scope\n"), 10: (1, "containerd", SERVICE),
          20: (10, "containerd-shim-runc-v2", SERVICE), 30: (20, "runc-guard", SERVICE)}, SERVICE),
        # serving shim, re-parented to PID 1, where containerd started it
        ({1: (0, "systemd", "0::/init.scope\n"), 20: (1, "containerd-shim-runc-v2", SERVICE),
          30: (20, "runc-guard", SERVICE)}, SERVICE),
        # serving shim moved into the pod (ShimCgroup): unknown
        ({1: (0, "systemd", "0::/init.scope\n"), 20: (1, "containerd-shim-runc-v2", POD),
          30: (20, "runc-guard", POD)}, None),
        # no containerd at all (a runtime called by hand): unknown
        ({1: (0, "systemd", "0::/init.scope\n"), 30: (1, "bash", "0::/user.slice\n")}, None),
    ],
    ids=["containerd-ancestor", "serving-shim", "shim-in-a-pod", "no-containerd"],
)
def test_helper_home_is_containerds_cgroups_or_unknown(tmp_path: Any, tree: Any, home: str | None) -> None:
    """containerd's cgroups when it is an ancestor; a shim's when containerd left it in its own;
    else unknown (the helper stays where it is)."""
    from runc_guard.spool import helper_home

    assert helper_home(30, _proc_tree(tmp_path, tree)) == home


def test_home_paths_skip_what_leaves_the_cgroup_namespace() -> None:
    """Each hierarchy's path by its controllers; ``/..`` (outside our cgroup namespace) never joined."""
    from runc_guard.spool import _home_paths

    unified, v1 = _home_paths("5:cpu,cpuacct:/system.slice/x\n3:name=systemd:/..\n0::/system.slice/x\n")
    assert unified == "/system.slice/x"
    assert v1 == [(frozenset({"cpu", "cpuacct"}), "/system.slice/x")]
