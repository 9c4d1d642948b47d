"""Every branch of DeleteRun's decision table, with a fake runtime and a fake cgroupfs (issue 11).

The runtime is a small /bin/sh script that deletes ``<root>/<id>`` like runc (or
not) and exits N; the cgroups are FakeCgroupFs directories; the state root and
every runc-guard path live under tmp_path. ``init_process_pid`` is either a pid
that cannot exist (above the kernel's PID_MAX_LIMIT) or this test process itself
with its real start time, so ``init_alive`` reads the real /proc both ways.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

import runc_guard.delete.paths as paths_mod
import runc_guard.delete.report as report_mod
import runc_guard.delete.run as delete_mod
import runc_guard.delete.siblings as siblings_mod
from runc_guard.delete.pending import PendingRecord, record_path, write_record
from runc_guard.delete.run import DeleteRun, run_delete
from runc_guard.invocation import parse
from runc_guard.procinfo import start_time
from runc_guard.reporter import drain_spool
from runc_guard.settings import Settings, load
from runc_guard.spool import spool_dir, write_spool
from tests.fakes import FakeCgroupFs, FakeClock

#: include/linux/threads.h PID_MAX_LIMIT is 4 Mi: no process can ever have this pid.
DEAD_PID = (4 << 20) + 7
DEAD_START = 12345
MOUNTS = {"/sys/fs/cgroup/memory": "cgroup", "/sys/fs/cgroup/unified": "cgroup2"}
SANDBOX_ID_LABEL = "io.kubernetes.cri.sandbox-id"
CONTAINER_TYPE_LABEL = "io.kubernetes.cri.container-type"


def mounts() -> Mapping[str, str]:
    return MOUNTS


def cgroup_dirs(relative: str) -> dict[str, str]:
    """runc's ``cgroup_paths`` for ``relative`` in the fake's two hierarchies."""
    return {"memory": f"/sys/fs/cgroup/memory{relative}", "": f"/sys/fs/cgroup/unified{relative}"}


class Lab:
    """A state root, settings in tmp_path, a fake kernel and a journal of what happened in order."""

    def __init__(self, tmp: str, fs: FakeCgroupFs, clock: FakeClock) -> None:
        self.tmp = tmp
        self.fs = fs
        self.clock = clock
        self.root = os.path.join(tmp, "state")
        os.makedirs(self.root)
        self.order = os.path.join(tmp, "order")
        # the mount points and the containers' parent, which the kernel always has
        for mount in MOUNTS:
            fs.add(mount)
            fs.add(f"{mount}/rgt")
        self.runc_log = os.path.join(tmp, "runc-log.json")
        self.spool = spool_dir(os.path.join(tmp, "cache"))
        self.settings = Settings(
            pending_dir=os.path.join(tmp, "pending"),
            cache_dir=os.path.join(tmp, "cache"),
            journal_socket=os.path.join(tmp, "no-journald.socket"),
            log_file=os.path.join(tmp, "events.jsonl"),
            stats_file=os.path.join(tmp, "stats.jsonl"),
            delete_timeout=2.0,
            poll_interval=0.02,
        )

    # -- inputs -----------------------------------------------------------------

    def container(
        self,
        cid: str,
        *,
        alive: bool = False,
        pidns: str = "host",
        relative: str | None = None,
        labels: Mapping[str, str] | None = None,
        pids: tuple[int, ...] = (),
        mtime: float | None = None,
    ) -> list[str]:
        """A state.json as runc writes it, and its cgroup dirs in the fake; returns the dirs."""
        relative = relative or f"/rgt/{cid}"
        paths = cgroup_dirs(relative)
        pid, start = (os.getpid(), start_time(os.getpid())) if alive else (DEAD_PID, DEAD_START)
        namespaces: list[dict[str, str]] = [{"type": "NEWNS", "path": ""}]
        if pidns == "private":
            namespaces.append({"type": "NEWPID", "path": ""})
        elif pidns == "joined":
            namespaces.append({"type": "NEWPID", "path": "/proc/1/ns/pid"})
        doc = {
            "id": cid,
            "init_process_pid": pid,
            "init_process_start": start,
            "created": "2026-11-30T10:00:00.123456789Z",
            "cgroup_paths": paths,
            "config": {
                "cgroups": {"path": relative},
                "namespaces": namespaces,
                "labels": [f"bundle=/run/bundles/{cid}", *(f"{k}={v}" for k, v in (labels or {}).items())],
            },
        }
        os.makedirs(os.path.join(self.root, cid))
        with open(os.path.join(self.root, cid, "state.json"), "w") as f:
            json.dump(doc, f)
        # kernfs stamps a cgroup dir at mkdir: "now", i.e. after the init started
        stamp = time.time() if mtime is None else mtime
        for path in paths.values():
            self.fs.add(path, pids, mtime=stamp)
        return sorted(paths.values())

    def runtime(self, status: int = 0, *, removes_state: bool = True, body: str = "") -> str:
        """A stand-in runtime: logs its call, deletes ``<root>/<last arg>`` as runc does, exits."""
        path = os.path.join(self.tmp, f"runtime-{len(os.listdir(self.tmp))}")
        remove = f'rm -rf "{self.root}/$id"' if removes_state else ":"
        with open(path, "w") as f:
            f.write(
                "#!/bin/sh\n"
                "for id; do :; done\n"  # the last argument: the container id
                f'echo "runtime $id" >> {self.order}\n'
                f"{body}\n{remove}\nexit {status}\n"
            )
        os.chmod(path, 0o755)
        # routed, as the shim's own runtime is (a record naming a runtime no route names is not trusted)
        routes = {**self.settings.runtimes, os.path.basename(path): path}
        self.settings = self.settings.replace(runtimes=routes)
        return path

    def invocation_args(self, cid: str) -> list[str]:
        return ["--root", self.root, "--log", self.runc_log, "--log-format", "json", "delete", "--force", cid]

    def run(self, cid: str, runtime: str, settings: Settings | None = None, **kw: Any) -> int:
        args = self.invocation_args(cid)
        settings = settings or self.settings
        run = DeleteRun(parse(args), args, runtime, settings, fs=self.fs, mounts=mounts, clock=self.clock)
        status = run.run(**kw)
        self.report(run.log.entries, settings)
        return status

    def report(self, entries: list[dict[str, Any]], settings: Settings) -> None:
        """What the detached reporter does, here and now: spool the entries, drain the spool."""
        if entries:
            write_spool(self.spool, entries, {"journal_socket": settings.journal_socket,
                                              "log_file": settings.log_file})
            drain_spool(self.spool, linger=0)

    # -- outputs ----------------------------------------------------------------

    def events(self) -> list[dict[str, Any]]:
        try:
            with open(self.settings.log_file) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def entry(self) -> dict[str, Any]:
        """The one canonical ``delete`` entry of the (last) delete."""
        entries = [e for e in self.events() if e["event"] == "delete"]
        assert entries, self.events()
        return entries[-1]

    def stats(self) -> list[dict[str, Any]]:
        try:
            with open(self.settings.stats_file) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def runs(self) -> list[str]:
        """Lines of the shared order file: ``runtime <id>``, ``wait``, ``kill N``, ``rmdir P``."""
        try:
            with open(self.order) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def records(self) -> list[str]:
        try:
            return sorted(os.listdir(self.settings.pending_dir))
        except FileNotFoundError:
            return []

    def has_state(self, cid: str) -> bool:
        return os.path.exists(os.path.join(self.root, cid, "state.json"))


class OrderedFs(FakeCgroupFs):
    """The fake kernel, writing its waits, kills and rmdirs into the runtime's order file."""

    order: str = ""

    def _note(self, line: str) -> None:
        with open(self.order, "a") as f:
            f.write(line + "\n")

    def kill_if_member(self, pid: int, path: str) -> bool:
        done = super().kill_if_member(pid, path)
        if done:
            self._note(f"kill {pid}")
        return done

    def rmdir(self, path: str) -> None:
        super().rmdir(path)
        self._note(f"rmdir {path}")

    def wait_for_change(self, paths: Any, timeout: float, event_timeout: float) -> None:
        self._note("wait")
        super().wait_for_change(paths, timeout, event_timeout)


def _test_handler(_signum: int, _frame: object) -> None:
    """Stands in for the process's own handlers while a test runs."""


@pytest.fixture(autouse=True)
def _restore_signals() -> Iterator[None]:
    """DeleteRun installs handlers for SIGTERM/SIGINT/SIGHUP (and leaves "note only" ones
    after reporting, as the shim exits right after): give pytest its own back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    # The tests send themselves SIGTERM: whatever handler the delete leaves or restores, it must
    # never be the default one, which would end pytest.
    for sig in saved:
        signal.signal(sig, _test_handler)
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.fixture
def lab(tmp_path: Any, clock: FakeClock) -> Lab:
    fs = OrderedFs(clock)
    made = Lab(str(tmp_path), fs, clock)
    fs.order = made.order
    return made


# -- refused / stepped aside --------------------------------------------------------------


def test_refused_when_state_escapes_cgroupfs(lab: Lab) -> None:
    """A state naming a path outside every cgroup mount: exit 65, the runtime is not run, nothing touched."""
    dirs = lab.container("c1", pids=(4242,))
    with open(os.path.join(lab.root, "c1", "state.json")) as f:
        doc = json.load(f)
    doc["cgroup_paths"]["memory"] = "/etc/rgt/c1"
    with open(os.path.join(lab.root, "c1", "state.json"), "w") as f:
        json.dump(doc, f)
    assert lab.run("c1", lab.runtime()) == 65
    assert lab.runs() == [] and lab.fs.killed == [] and lab.fs.rmdirs == []
    assert all(lab.fs.exists(d) for d in dirs) and lab.has_state("c1")
    entry = lab.entry()
    assert (entry["outcome"], entry["level"]) == ("refused", "error")
    assert "not below any cgroup mount point" in entry["reason"]
    assert lab.records() == []


@pytest.mark.parametrize(
    "case",
    ["named_otherwise", "pre_existing", "foreign_process"],
)
def test_stepped_aside(lab: Lab, case: str) -> None:
    """A cgroup that is not provably the container's: the runtime runs unchanged, its status is
    returned, runc-guard kills and removes nothing, the warning says why, no record is left."""
    if case == "named_otherwise":
        # cgroupsPath names a shared service cgroup (issue 11 case 1)
        dirs = lab.container("c1", relative="/system.slice/web.service", pids=(4242,))
        why = "not named after container c1"
    elif case == "pre_existing":
        dirs = lab.container("c1", alive=True, mtime=time.time() - 3600 * 24 * 365, pids=(4242,))
        why = "existed before the container was started"
    else:
        # private PID namespace, init dead: a live process that is not dying is not the container's
        dirs = lab.container("c1", pidns="private", pids=(4242,))
        why = "is alive and not the container's"
    status = lab.run("c1", lab.runtime(3, removes_state=False))
    assert status == 3
    assert lab.runs().count("runtime c1") == 1
    assert lab.fs.killed == [] and lab.fs.rmdirs == []
    assert all(lab.fs.exists(d) for d in dirs) and 4242 in lab.fs.alive
    events = lab.events()
    assert [e["event"] for e in events] == ["step_aside", "delete"]
    assert why in events[0]["reason"] and events[0]["level"] == "warning"
    entry = lab.entry()
    assert (entry["outcome"], entry["exit_status"], entry["level"]) == ("stepped_aside", 3, "warning")
    assert lab.records() == []


# -- no state -----------------------------------------------------------------------------


def test_unknown_container_is_a_quiet_passthrough(lab: Lab) -> None:
    """Neither the runtime nor a record knows the id: the runtime's status, no entry at info, no metric."""
    runtime = lab.runtime(1, body='echo "container does not exist" >&2')
    assert lab.run("ghost", runtime) == 1
    assert lab.runs() == ["runtime ghost"]
    assert lab.events() == [] and lab.stats() == []


def test_unknown_container_is_logged_at_debug(lab: Lab) -> None:
    """At log_level=debug the same passthrough leaves one debug entry (outcome unknown), still no metric."""
    settings = Settings(**{**lab.settings.as_dict(), "log_level": "debug"})
    assert lab.run("ghost", lab.runtime(0), settings) == 0
    (entry,) = lab.events()
    assert (entry["outcome"], entry["level"]) == ("unknown", "debug")
    assert lab.stats() == []


def test_pending_record_is_finished_without_state(lab: Lab) -> None:
    """No state but a record (an earlier delete hit its deadline): the runtime's status passes through,
    the recorded dirs are removed, the record is dropped."""
    dirs = sorted(cgroup_dirs("/rgt/c1").values())
    for d in dirs:
        lab.fs.add(d, ())
    write_record(
        lab.settings.pending_dir,
        PendingRecord("c1", lab.root, dirs, DEAD_PID, DEAD_START, "/usr/sbin/runc", time.time()),
    )
    assert lab.run("c1", lab.runtime(1, body='echo "container does not exist" >&2')) == 1
    assert not any(lab.fs.exists(d) for d in dirs)
    assert lab.entry()["outcome"] == "record_finished"
    assert lab.records() == []
    assert [s["outcome"] for s in lab.stats()] == ["record_finished"]


# -- the decision table -------------------------------------------------------------------


def test_init_dead_waits_first_then_runs_runtime(lab: Lab) -> None:
    """Init dead (the dead-shim path): stragglers (host PID) killed and the cgroups emptied *before*
    the runtime runs, so its own removal succeeds; then what is left is removed; exit 0."""
    dirs = lab.container("c1", pids=(4242,))
    lab.fs.dies_on_kill = False
    lab.fs.on_wait = lambda fs: fs.exit(4242)
    assert lab.run("c1", lab.runtime(0)) == 0
    order = lab.runs()
    assert order.index("kill 4242") < order.index("wait") < order.index("runtime c1")
    assert all(line.startswith("rmdir") for line in order[order.index("runtime c1") + 1 :])
    assert not any(lab.fs.exists(d) for d in dirs)
    entry = lab.entry()
    assert (entry["outcome"], entry["init_alive"], entry["stragglers_killed"]) == ("removed", False, [4242])
    assert entry["runtime_runs"] == 1 and lab.records() == []


def test_init_alive_runs_runtime_first(lab: Lab) -> None:
    """Init alive (``delete --force`` of a running container): the runtime runs before any wait or rmdir."""
    dirs = lab.container("c1", alive=True, pidns="private")
    assert lab.run("c1", lab.runtime(0)) == 0
    order = lab.runs()
    assert order[0] == "runtime c1" and "wait" not in order
    assert not any(lab.fs.exists(d) for d in dirs)
    assert lab.fs.killed == []
    entry = lab.entry()
    assert (entry["outcome"], entry["init_alive"], entry["pid_namespace"]) == ("removed", True, "private")


def test_runtime_failed_state_kept_passes_through(lab: Lab) -> None:
    """The runtime exits 1 and keeps its state (it still owns the container): status 1, nothing removed."""
    dirs = lab.container("c1", alive=True)
    assert lab.run("c1", lab.runtime(1, removes_state=False)) == 1
    assert lab.has_state("c1") and all(lab.fs.exists(d) for d in dirs)
    assert lab.fs.rmdirs == [] and lab.fs.killed == []
    entry = lab.entry()
    assert (entry["outcome"], entry["exit_status"], entry["level"]) == ("runtime_failed", 1, "warning")
    assert lab.records() == []


def test_runtime_failed_after_removing_state_cleans_leftovers(lab: Lab) -> None:
    """The runtime removes its state, exits 1, leaves the cgroups: they are removed, status 1 stays."""
    dirs = lab.container("c1", alive=True)
    assert lab.run("c1", lab.runtime(1)) == 1
    assert not any(lab.fs.exists(d) for d in dirs)
    assert (lab.entry()["outcome"], lab.entry()["exit_status"]) == ("removed", 1)
    assert lab.records() == []


def test_runtime_failed_after_removing_state_and_cgroups(lab: Lab) -> None:
    """The runtime removed its state and nothing is left but it still failed: status passed on."""
    dirs = lab.container("c1", alive=True)
    for d in dirs:
        del lab.fs.dirs[d]
    assert lab.run("c1", lab.runtime(2)) == 2
    entry = lab.entry()
    assert (entry["outcome"], entry["exit_status"]) == ("runtime_failed", 2)


def test_state_kept_after_exit_0_removes_nothing(lab: Lab) -> None:
    """Exit 0 but the state is still there (``delete`` of a running container without --force):
    its cgroups are the runtime's; nothing removed."""
    dirs = lab.container("c1", alive=True)
    assert lab.run("c1", lab.runtime(0, removes_state=False)) == 0
    assert all(lab.fs.exists(d) for d in dirs) and lab.fs.rmdirs == []
    assert lab.entry()["outcome"] == "state_kept" and lab.records() == []


def test_busy_cgroup_reruns_the_runtime(lab: Lab) -> None:
    """runc >= 1.2: the first delete exits 1 and keeps its state while a cgroup is busy; runc-guard
    waits for the cgroups and runs it again, which then succeeds; exit 0, 0 dirs, 2 runtime runs."""
    dirs = lab.container("c1", pidns="private", pids=(4242,))
    lab.fs.dying.add(4242)  # the kernel's zap of the PID namespace is under way
    waits = {"n": 0}

    def exit_later(fs: FakeCgroupFs) -> None:
        waits["n"] += 1
        if waits["n"] == 2:
            fs.exit(4242)

    lab.fs.on_wait = exit_later
    first = os.path.join(lab.tmp, "ran-once")
    body = (
        f"if [ ! -e {first} ]; then touch {first}; "
        "echo 'unable to remove container cgroup: device or resource busy' >&2; exit 1; fi"
    )
    assert lab.run("c1", lab.runtime(0, body=body)) == 0
    assert lab.runs().count("runtime c1") == 2
    assert not lab.has_state("c1") and not any(lab.fs.exists(d) for d in dirs)
    entry = lab.entry()
    assert (entry["outcome"], entry["runtime_runs"]) == ("removed", 2)
    assert lab.fs.killed == []  # private PID namespace: never ours to kill
    assert lab.records() == []


def test_busy_cgroup_reruns_are_bounded(lab: Lab) -> None:
    """A runtime that keeps failing with its state kept is re-run a bounded number of times, then its
    own status is passed on and nothing is removed (the container is still the runtime's)."""
    dirs = lab.container("c1")
    assert lab.run("c1", lab.runtime(1, removes_state=False)) == 1
    assert lab.runs().count("runtime c1") == 1 + delete_mod.MAX_RUNTIME_RERUNS
    assert lab.has_state("c1") and all(lab.fs.exists(d) for d in dirs)
    assert lab.entry()["outcome"] == "runtime_failed"


# -- deadlines ----------------------------------------------------------------------------


def test_no_kill_runs_the_runtime_first(lab: Lab) -> None:
    """kill_stragglers = false, init dead: the runtime runs first (its own kill applies, as runc alone
    would SIGKILL a host-PID container's stragglers); a process it leaves keeps the cgroup busy: exit 75
    at the deadline, the record is kept, stderr and --log say why."""
    settings = Settings(**{**lab.settings.as_dict(), "kill_stragglers": False, "delete_timeout": 1.0})
    dirs = lab.container("c1", pids=(4242,))
    assert lab.run("c1", lab.runtime(0), settings) == 75
    assert lab.runs()[0] == "runtime c1" and lab.runs().count("runtime c1") == 1
    assert all(lab.fs.exists(d) for d in dirs) and 4242 in lab.fs.alive
    assert len(lab.records()) == 1
    entry = lab.entry()
    assert (entry["outcome"], entry["level"], entry["stragglers_killed"]) == ("deadline", "error", [])
    assert entry["pending_record"] == record_path(lab.settings.pending_dir, lab.root, "c1")
    with open(lab.runc_log) as f:
        (line,) = [json.loads(x) for x in f]
    assert line["level"] == "error" and line["msg"].startswith("runc-guard: ")


def test_deadline_before_the_runtime(lab: Lab) -> None:
    """Init dead, stragglers that runc-guard kills but that do not die: exit 75 at the deadline,
    the runtime never ran (its state stays for a retry), the record is kept."""
    settings = Settings(**{**lab.settings.as_dict(), "delete_timeout": 1.0})
    dirs = lab.container("c1", pids=(4242,))
    lab.fs.dies_on_kill = False
    assert lab.run("c1", lab.runtime(0), settings) == 75
    assert lab.runs().count("runtime c1") == 0 and lab.has_state("c1")
    assert all(lab.fs.exists(d) for d in dirs) and 4242 in lab.fs.alive
    assert len(lab.records()) == 1
    assert lab.entry()["outcome"] == "deadline"


@pytest.mark.parametrize(
    ("caller", "timeout", "budget"),
    [
        ("dead_shim", 4.0, 4.0),
        ("unknown", 4.0, 4.0),
        ("serving_shim", 4.0, 7.0),
        ("serving_shim", 12.0, 12.0),
        ("dead_shim", 2.0, 2.0),
    ],
)
def test_the_budget_follows_the_caller(lab: Lab, caller: str, timeout: float, budget: float) -> None:
    """The serving shim (CRI's 10 s per exit event) gets at least 7 s; the dead shim and an unknown
    caller get delete_timeout (issue 30, case 9)."""
    settings = Settings(**{**lab.settings.as_dict(), "delete_timeout": timeout})
    args = lab.invocation_args("c1")
    run = DeleteRun(
        parse(args), args, lab.runtime(0), settings, fs=lab.fs, mounts=mounts, clock=lab.clock, caller=caller
    )
    assert run.deadline == pytest.approx(lab.clock() + budget)
    assert run.canonical.get("caller") == (None if caller == "unknown" else caller)


def test_runtime_deadline_stops_the_runtime(lab: Lab) -> None:
    """A runtime that hangs is stopped at delete_timeout (SIGTERM): exit 75 in time, record kept."""
    settings = Settings(**{**lab.settings.as_dict(), "delete_timeout": 0.5})
    lab.container("c1", alive=True)
    started = time.monotonic()
    assert lab.run("c1", lab.runtime(0, body="exec sleep 30"), settings) == 75
    assert time.monotonic() - started < 3
    assert len(lab.records()) == 1 and lab.has_state("c1")
    entry = lab.entry()
    assert entry["outcome"] == "deadline" and "still running after" in entry["reason"]


# -- settings, signals, internal errors (through run_delete, the shim's boundary) ----------


@pytest.fixture
def wired(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """run_delete builds its own DeleteRun: give it the fake kernel, and an environment into tmp."""

    class Wired(DeleteRun):
        def __init__(self, *args: Any, **kw: Any) -> None:
            kw.setdefault("fs", lab.fs)
            kw.setdefault("mounts", mounts)
            kw.setdefault("clock", lab.clock)
            super().__init__(*args, **kw)

    monkeypatch.setattr(delete_mod, "DeleteRun", Wired)
    # The deadline counts on the fake clock: the real process start (a monotonic time that is below
    # the fake clock's 1000 s on a machine up for less than that) would put it in the past.
    monkeypatch.setattr(delete_mod, "delete_caller", lambda: ("unknown", None))
    # the reporter, without the fork: this is pytest's process (the fork is proven on the kernel)
    monkeypatch.setattr(report_mod, "detach_reporter", lambda d, _linger: drain_spool(d, linger=0))
    # ... and no detached finisher from pytest's process (on by default; its own tests start it)
    monkeypatch.setattr(delete_mod, "detach_finisher", lambda _cache_dir: 0)
    config = os.path.join(lab.tmp, "config.toml")
    with open(config, "w") as f:
        f.write("delete_timout = 5\n")
    return {
        "RUNC_GUARD_CONFIG": config,
        "RUNC_GUARD_CACHE_DIR": os.path.join(lab.tmp, "cache"),
        "RUNC_GUARD_PENDING_DIR": lab.settings.pending_dir,
        "RUNC_GUARD_LOG_FILE": lab.settings.log_file,
        "RUNC_GUARD_STATS_FILE": lab.settings.stats_file,
        "RUNC_GUARD_JOURNAL_SOCKET": lab.settings.journal_socket,
    }


def _run_delete(
    lab: Lab, cid: str, runtime: str, raw: Mapping[str, object], env: Mapping[str, str], **kw: Any
) -> int:
    args = lab.invocation_args(cid)
    text = "".join(f"{k} = {json.dumps(v)}\n" for k, v in raw.items())
    with open(env["RUNC_GUARD_CONFIG"], "a+") as f:  # the settings file this delete reads
        f.seek(0)
        if f.read() != text:  # rewritten only when it changes: a new version is reported anew
            f.truncate(0)
            f.write(text)
    return run_delete(parse(args), args, runtime, load(env), env, **kw)


def test_settings_error_never_changes_the_outcome(
    lab: Lab, wired: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo'd key: two deletes end exactly as with a clean file (exit 0, cgroups removed, nothing on
    stderr); the problem is reported once for this version of the file, not per delete."""
    for cid in ("c1", "c2"):
        dirs = lab.container(cid)
        assert _run_delete(lab, cid, lab.runtime(0), {"delete_timout": 5}, wired) == 0
        assert not any(lab.fs.exists(d) for d in dirs)
    assert capsys.readouterr().err == ""
    events = lab.events()
    problems = [e for e in events if e["event"] == "config_invalid"]
    assert len(problems) == 1 and "delete_timout" in problems[0]["reason"]
    assert [e["outcome"] for e in events if e["event"] == "delete"] == ["removed", "removed"]


def test_settings_bad_value_keeps_the_default(lab: Lab, wired: dict[str, str]) -> None:
    """A valid key with a bad value keeps its default; the other keys still apply."""
    dirs = lab.container("c1")
    raw = {"delete_timeout": "soon", "kill_stragglers": True}
    assert _run_delete(lab, "c1", lab.runtime(0), raw, wired) == 0
    assert not any(lab.fs.exists(d) for d in dirs)
    (problem,) = [e for e in lab.events() if e["event"] == "config_invalid"]
    assert "delete_timeout" in problem["reason"]


def test_interrupted_before_the_delete(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    """A signal that arrived while the shim was still loading the delete path: exit 128+N, said on
    stderr, nothing run or removed."""
    dirs = lab.container("c1", pids=(4242,))
    assert lab.run("c1", lab.runtime(0), early_signals=[signal.SIGTERM]) == 128 + signal.SIGTERM
    assert lab.runs() == [] and lab.fs.killed == [] and all(lab.fs.exists(d) for d in dirs)
    assert "interrupted by SIGTERM" in capsys.readouterr().err
    entry = lab.entry()
    assert (entry["outcome"], entry["exit_status"]) == ("interrupted", 143)


def test_internal_error_takes_the_failure_path(
    lab: Lab, wired: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """An unexpected exception deep inside (the fake kernel raises): exit 70, one stderr line, a --log
    line, a canonical entry with outcome internal_error, the record kept for the sweep, no traceback."""

    def broken(_path: str) -> list[int]:
        raise RuntimeError("kernel said something odd")

    lab.fs.read_procs = broken  # type: ignore[method-assign]
    lab.container("c1")
    assert _run_delete(lab, "c1", lab.runtime(0), {}, wired) == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: RuntimeError: kernel said something odd" in err
    assert "Traceback" not in err
    with open(lab.runc_log) as f:
        (line,) = [json.loads(x) for x in f]
    assert line["level"] == "error" and "internal error" in line["msg"]
    entry = lab.entry()
    assert (entry["outcome"], entry["exit_status"], entry["level"]) == ("internal_error", 70, "error")
    assert len(lab.records()) == 1 and entry["pending_record"] is not None
    assert lab.runs() == [] and lab.has_state("c1")


# -- a CRI sandbox's dead siblings ----------------------------------------------------------


def test_a_sandbox_replies_first_and_records_its_dead_siblings(lab: Lab) -> None:
    """Deleting a sandbox runs only the sandbox's own delete before the reply (issue 30 case 1): the
    pod's containers whose init is dead get an aside record of kind ``sibling`` each (their own
    deletes follow in the finisher); a sibling with a live init and another pod's container get none.
    With finish_window 0 as with any: their deletes are the sandbox's own job (node.finisher_process.run)."""
    from runc_guard.delete.aside import SIBLING, iter_aside

    pod = {CONTAINER_TYPE_LABEL: "sandbox", SANDBOX_ID_LABEL: "sb"}
    sandbox_dirs = lab.container("sb", labels=pod)
    dead = lab.container("app", labels={CONTAINER_TYPE_LABEL: "container", SANDBOX_ID_LABEL: "sb"})
    lab.container("live", alive=True, labels={CONTAINER_TYPE_LABEL: "container", SANDBOX_ID_LABEL: "sb"})
    lab.container("other", labels={CONTAINER_TYPE_LABEL: "container", SANDBOX_ID_LABEL: "sb2"})
    assert lab.run("sb", lab.runtime(0)) == 0
    assert not any(lab.fs.exists(d) for d in sandbox_dirs) and not lab.has_state("sb")
    assert [r for r in lab.runs() if r.startswith("runtime")] == ["runtime sb"], "only the sandbox ran"
    assert all(lab.fs.exists(d) for d in dead) and lab.has_state("app")
    entries = {e["container_id"]: e for e in lab.events() if e["event"] == "delete"}
    assert set(entries) == {"sb"}
    assert entries["sb"]["siblings"] == [{"id": "app", "left_for": "finisher"}]
    ((_, doc),) = list(iter_aside(lab.settings.cache_dir))
    assert doc is not None and (doc["kind"], doc["container_id"], doc["sandbox_id"]) == (SIBLING, "app", "sb")
    assert doc["cgroup_paths"] == dead and doc["args"][-3:] == ["delete", "--force", "app"]
    assert lab.records() == []


def test_a_sibling_scan_that_fails_never_changes_the_sandbox_status(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any exception while the sandbox's siblings are looked for (here EAGAIN from a /proc read, not
    an Outcome) is noted in the sandbox's entry; the sandbox's own success stands. Before: exit 70."""
    pod = {CONTAINER_TYPE_LABEL: "sandbox", SANDBOX_ID_LABEL: "sb"}
    lab.container("sb", labels=pod)
    lab.container("app", labels={CONTAINER_TYPE_LABEL: "container", SANDBOX_ID_LABEL: "sb"})
    real = delete_mod.init_liveness
    calls: list[int] = []

    def eagain_for_the_sibling(pid: int, start: int) -> str:
        calls.append(pid)
        if len(calls) > 1:  # the sandbox's own look went through; the sibling's fails
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        return real(pid, start)

    monkeypatch.setattr(delete_mod, "init_liveness", eagain_for_the_sibling)
    monkeypatch.setattr(siblings_mod, "init_liveness", eagain_for_the_sibling)
    assert lab.run("sb", lab.runtime(0)) == 0
    entry = lab.entry()
    assert (entry["outcome"], entry["exit_status"]) == ("removed", 0)
    assert "EAGAIN" in entry["siblings_error"] or "temporarily" in entry["siblings_error"]
    assert lab.has_state("app")


def test_non_sandbox_never_touches_its_pod(lab: Lab) -> None:
    """A pod's ordinary container being deleted does not reach its dead siblings."""
    lab.container("app", labels={CONTAINER_TYPE_LABEL: "container", SANDBOX_ID_LABEL: "sb"})
    sib = lab.container("app2", labels={CONTAINER_TYPE_LABEL: "container", SANDBOX_ID_LABEL: "sb"})
    assert lab.run("app", lab.runtime(0)) == 0
    assert lab.has_state("app2") and all(lab.fs.exists(d) for d in sib)


# -- drain and records (issue 11 case 7, unit level) -----------------------------------------


def test_pid_zero_is_waited_for_never_killed(lab: Lab) -> None:
    """A 0 in a v2 cgroup.procs (a task outside our PID namespace) keeps the cgroup populated but is
    never signalled: drain waits for it and ends at the deadline, killing only real pids."""
    from runc_guard.delete.cleanup import drain
    from runc_guard.errors import CgroupBusy

    lab.fs.add("/sys/fs/cgroup/unified/rgt/c1", [0, 4242])
    lab.fs.dies_on_kill = True
    kills: list[int] = []
    original: Callable[[int, str], bool] = lab.fs.kill_if_member

    def recording(pid: int, path: str) -> bool:
        kills.append(pid)
        return original(pid, path)

    lab.fs.kill_if_member = recording  # type: ignore[method-assign]
    with pytest.raises(CgroupBusy) as busy:
        drain(
            ["/sys/fs/cgroup/unified/rgt/c1"], lab.fs, lab.clock() + 0.5, 0.02, may_kill=True, clock=lab.clock
        )
    assert kills == [4242] and 0 not in lab.fs.killed
    assert busy.value.report is not None and busy.value.report.remaining == {
        "/sys/fs/cgroup/unified/rgt/c1": (0,)
    }
    assert len(lab.fs.waits) > 1  # it waited instead of failing


def test_record_vanishing_between_listdir_and_read_is_skipped(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record a finishing delete removes between the listing and the read is not a problem."""
    from runc_guard.delete import pending

    pending_dir = str(tmp_path / "pending")
    for cid in ("a", "b"):
        paths = [f"/sys/fs/cgroup/memory/{cid}"]
        write_record(pending_dir, PendingRecord(cid, "/run/runc", paths, 1, 1, "runc", time.time()))
    real_read = pending.read_record
    gone = record_path(pending_dir, "/run/runc", "a")

    def racing(path: str, rule: pending.RecordRule) -> PendingRecord:
        if path == gone:
            os.unlink(path)  # the other delete finished just now
        return real_read(path, rule)

    fs = FakeCgroupFs(FakeClock())
    fs.add("/sys/fs/cgroup/memory")
    rule = pending.RecordRule(fs, MOUNTS, ["runc"])
    monkeypatch.setattr(pending, "read_record", racing)
    found = list(pending.iter_records(pending_dir, rule))
    assert [(os.path.basename(p), type(r).__name__) for p, r in found] == [
        (os.path.basename(record_path(pending_dir, "/run/runc", "b")), "PendingRecord")
    ]


# -- who may be killed, claims, reporting (issue 11 rules) -----------------------------------


@pytest.mark.parametrize(("pidns", "killed"), [("host", [4242]), ("joined", [4242]), ("private", [])])
def test_stragglers_killed_only_where_the_runtime_would(lab: Lab, pidns: str, killed: list[int]) -> None:
    """runc's destroy SIGKILLs a cgroup's processes only without a private PID namespace; so does
    runc-guard. In a private one a dying process is waited for, never signalled."""
    dirs = lab.container("c1", pidns=pidns, pids=(4242,))
    lab.fs.dies_on_kill = False
    lab.fs.dying.add(4242)  # as after the kernel's zap of the namespace
    lab.fs.on_wait = lambda fs: fs.exit(4242)
    assert lab.run("c1", lab.runtime(0)) == 0
    assert lab.fs.killed == killed
    assert not any(lab.fs.exists(d) for d in dirs)


def test_kill_stragglers_false_is_respected(lab: Lab) -> None:
    """kill_stragglers=false: even a host-PID straggler is only waited for."""
    settings = Settings(**{**lab.settings.as_dict(), "kill_stragglers": False})
    lab.container("c1", pids=(4242,))
    lab.fs.on_wait = lambda fs: fs.exit(4242)
    assert lab.run("c1", lab.runtime(0), settings) == 0
    assert lab.fs.killed == []


def test_second_delete_of_a_claimed_id_keeps_the_record(lab: Lab) -> None:
    """While another delete holds (root, id), a second one neither runs the runtime nor touches the
    record: exit 75 at its deadline, saying why."""
    from runc_guard.delete.pending import Claim

    settings = Settings(**{**lab.settings.as_dict(), "delete_timeout": 0.0})
    dirs = lab.container("c1", pids=(4242,))
    record = write_record(
        lab.settings.pending_dir,
        PendingRecord("c1", lab.root, dirs, DEAD_PID, DEAD_START, "/usr/sbin/runc", time.time()),
    )
    with Claim(lab.settings.pending_dir, lab.root, "c1", lab.clock() + 10, lab.clock) as held:
        assert held == "claimed"
        assert lab.run("c1", lab.runtime(0), settings) == 75
    assert os.path.exists(record) and lab.runs() == [] and lab.fs.killed == []
    entry = lab.entry()
    assert entry["outcome"] == "deadline" and "another delete of c1" in entry["reason"]


def test_a_signal_while_reporting_changes_nothing(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM arriving while the verdict is being reported (journal, stats) neither changes the exit
    status nor turns into an internal error."""
    real = delete_mod.append_stats

    def interrupted(*args: Any) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        real(*args)

    monkeypatch.setattr(delete_mod, "append_stats", interrupted)
    dirs = lab.container("c1")
    assert lab.run("c1", lab.runtime(0)) == 0
    assert not any(lab.fs.exists(d) for d in dirs)
    assert lab.entry()["outcome"] == "removed" and [s["outcome"] for s in lab.stats()] == ["removed"]


def test_signal_handlers_are_given_back_after_the_delete(lab: Lab) -> None:
    """DeleteRun.run leaves the process's SIGTERM/SIGINT/SIGHUP handlers as it found them."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    lab.container("c1")
    assert lab.run("c1", lab.runtime(0)) == 0
    assert {sig: signal.getsignal(sig) for sig in before} == before


# -- the remaining outcomes: one test each, so every branch of the table is proven here ----


def test_already_gone_when_the_runtime_alone_removed_everything(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Init dead, cgroups empty, and the runtime's own destroy removes them: runc-guard waited for
    nothing, killed nothing, removed nothing."""
    dirs = lab.container("c1")
    real = delete_mod.run_runtime_child

    def runtime_that_removes(*args: Any, **kw: Any) -> Any:
        run = real(*args, **kw)
        for d in dirs:  # what runc's destroy does on the kernel
            lab.fs.rmdir(d)
        return run

    monkeypatch.setattr(delete_mod, "run_runtime_child", runtime_that_removes)
    assert lab.run("c1", lab.runtime()) == 0
    entry = lab.entry()
    assert (entry["outcome"], entry["removed"], entry["level"]) == ("already_gone", 0, "info")
    assert entry["stragglers_killed"] == [] and lab.records() == []


def test_rmdir_failed_is_74_with_the_record_kept(lab: Lab) -> None:
    """An rmdir error waiting cannot fix (EROFS): exit 74 naming the path, the record kept for the sweep."""
    dirs = lab.container("c1")
    lab.fs.rmdir_errors[dirs[0]] = errno.EROFS
    assert lab.run("c1", lab.runtime()) == 74
    entry = lab.entry()
    assert (entry["outcome"], entry["exit_status"], entry["level"]) == ("rmdir_failed", 74, "error")
    assert dirs[0] in entry["reason"] and "EROFS" in entry["reason"]
    assert len(lab.records()) == 1


def test_no_state_when_the_state_is_unreadable(lab: Lab) -> None:
    """A state.json that does not parse: not ours to judge; the runtime runs and its status passes on."""
    os.makedirs(os.path.join(lab.root, "c1"))
    with open(os.path.join(lab.root, "c1", "state.json"), "w") as f:
        f.write("{not json")
    assert lab.run("c1", lab.runtime(1, removes_state=False)) == 1
    assert lab.runs() == ["runtime c1"]
    entry = lab.entry()
    assert (entry["outcome"], entry["exit_status"], entry["level"]) == ("no_state", 1, "warning")
    assert lab.fs.killed == [] and lab.fs.rmdirs == [] and lab.records() == []


def test_every_outcome_the_delete_can_raise_is_listed() -> None:
    """Each Outcome(...) the delete raises is in delete.outcomes (so metrics render it from zero)."""
    import ast

    from runc_guard.delete import outcomes

    with open(delete_mod.__file__) as f:
        tree = ast.parse(f.read())
    raised = {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Outcome"
        and node.args and isinstance(node.args[0], ast.Constant)
    }  # fmt: skip
    assert raised and raised <= set(outcomes.OUTCOMES)


# -- never more harm than the runtime when a fact fails (issue 21) ---------------------------


def test_unknown_liveness_steps_aside_and_leaves_an_aside_record(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A /proc read that fails (EMFILE, ENOMEM) says nothing about the init: runc-guard steps aside,
    kills nothing, the runtime runs alone and unbounded, and what it leaves is an aside record, not a
    pending one."""
    monkeypatch.setattr(delete_mod, "init_liveness", lambda _pid, _start: "unknown")
    dirs = lab.container("c1", pids=(4242,))
    assert lab.run("c1", lab.runtime(0)) == 0
    assert lab.runs() == ["runtime c1"] and lab.fs.killed == [] and lab.records() == []
    entry = lab.entry()
    assert entry["outcome"] == "stepped_aside" and "cannot tell whether init" in entry["reason"]
    from runc_guard.delete.aside import iter_aside

    ((path, doc),) = list(iter_aside(lab.settings.cache_dir))
    assert entry["aside_record"] == path and doc is not None and doc["cgroup_paths"] == dirs


def test_siblings_wait_for_the_sandbox_to_be_deleted(lab: Lab) -> None:
    """A sandbox whose own delete failed (the runtime kept its state) leaves its dead siblings alone."""
    lab.container("sb", labels={CONTAINER_TYPE_LABEL: "sandbox", SANDBOX_ID_LABEL: "sb"})
    sibling = lab.container("app1", labels={CONTAINER_TYPE_LABEL: "container", SANDBOX_ID_LABEL: "sb"})
    assert lab.run("sb", lab.runtime(1, removes_state=False)) == 1
    assert lab.has_state("app1") and all(lab.fs.exists(d) for d in sibling)
    assert "siblings" not in lab.entry()


def test_a_forward_clock_step_does_not_make_cgroups_look_older_than_the_init(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The init's wall-clock start rebuilt with today's clock is two hours late after a forward step:
    runc's 'created' (stamped after the cgroups were made) bounds it, so the delete goes through and
    notes the step. Control: without 'created' to bound it, the same directories look older and the
    delete steps aside, as every delete did before."""
    created = time.time()
    monkeypatch.setattr(paths_mod, "start_wall_time", lambda _start: created + 7200.0)
    dirs = lab.container("c1", alive=False, mtime=created - 0.2)
    state_file = os.path.join(lab.root, "c1", "state.json")
    with open(state_file) as f:
        doc = json.load(f)
    doc["init_process_start"] = 12345
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1e9):09d}Z"
    doc["created"] = stamp
    with open(state_file, "w") as f:
        json.dump(doc, f)
    assert lab.run("c1", lab.runtime(0)) == 0
    entry = lab.entry()
    assert entry["outcome"] == "removed" and 7199 < entry["clock_step_s"] < 7201
    assert not any(lab.fs.exists(d) for d in dirs)

    lab.container("c2", alive=False, mtime=created - 0.2)
    state_file = os.path.join(lab.root, "c2", "state.json")
    with open(state_file) as f:
        doc = json.load(f)
    doc["init_process_start"] = 12345
    del doc["created"]
    with open(state_file, "w") as f:
        json.dump(doc, f)
    assert lab.run("c2", lab.runtime(0)) == 0
    assert lab.entry()["outcome"] == "stepped_aside"


def test_a_signal_between_the_verdict_and_finish_changes_nothing(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM that lands after the outcome is decided but before finish() takes the handlers used to
    raise Interrupted on top of it: a finished delete reported exit 70. Now it is only noted."""
    dirs = lab.container("c1")
    real = DeleteRun.finish

    def late_signal(self: DeleteRun, end: Any, final: bool = True) -> int:
        os.kill(os.getpid(), signal.SIGTERM)  # delivered at once: the handler runs before the next line
        return real(self, end, final)

    monkeypatch.setattr(DeleteRun, "finish", late_signal)
    assert lab.run("c1", lab.runtime(0)) == 0
    assert not any(lab.fs.exists(d) for d in dirs)
    assert lab.entry()["outcome"] == "removed"


def test_a_signal_while_the_verdict_unwinds_changes_nothing(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM that lands while the Outcome is still on its way out (here in the claim's exit, a
    ``finally`` on the way to ``run``) is only noted: the runtime's status stands, not exit 70."""
    real = delete_mod.Claim.__exit__

    def late_signal(self: Any, *exc: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)  # delivered at once, inside the exit
        return real(self, *exc)

    monkeypatch.setattr(delete_mod.Claim, "__exit__", late_signal)
    assert lab.run("never-made", lab.runtime(3)) == 3


def test_entries_never_wait_on_journald_when_the_spool_is_unwritable(lab: Lab, tmp_path: Any) -> None:
    """No spool (a full /run): the entries go straight to the fallback file, with no journald wait; when
    that cannot be written either they are counted as lost for the metrics."""
    from runc_guard.delete.report import LOST_ENTRIES, EventLog, deliver

    blocker = os.path.join(str(tmp_path), "not-a-dir")
    open(blocker, "w").close()
    log = EventLog("info", {"container_id": "c1"})
    log.info("delete", outcome="removed")
    settings = lab.settings.replace(journal_socket=os.path.join(str(tmp_path), "slow.sock"))
    started = time.monotonic()
    deliver(log, settings, os.path.join(blocker, "spool"))
    assert time.monotonic() - started < 0.5
    assert [e["outcome"] for e in lab.events()] == ["removed"]

    lost_log = settings.replace(log_file=os.path.join(blocker, "events.jsonl"))
    deliver(log, lost_log, os.path.join(blocker, "spool"))
    with open(os.path.join(settings.cache_dir, LOST_ENTRIES)) as f:
        assert len(f.read()) == 1


def _systemd_container(lab: Lab, cid: str) -> list[str]:
    """A container whose state says runc's systemd driver made its cgroups (cri-containerd-<id>.scope)."""
    dirs = lab.container(cid, relative=f"/rgt/cri-containerd-{cid}.scope")
    state_file = os.path.join(lab.root, cid, "state.json")
    with open(state_file) as f:
        doc = json.load(f)
    doc["config"]["cgroups"].update(name=cid, scope_prefix="cri-containerd", parent="rgt.slice", Systemd=True)
    with open(state_file, "w") as f:
        json.dump(doc, f)
    return dirs


@pytest.mark.parametrize("loaded", [False, True])
def test_systemd_is_asked_only_while_it_holds_the_scope(
    lab: Lab, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, loaded: bool
) -> None:
    """systemd driver: when the scope's transient unit file is gone, systemd has freed the unit and a
    clean delete neither loads systemd_scope (json, re, subprocess) nor runs systemctl; while the file
    is there, systemd is asked (here it is not PID 1: no_systemd)."""
    import sys

    from runc_guard.delete import unit_name

    transient = os.path.join(str(tmp_path), "transient")
    os.makedirs(transient)
    monkeypatch.setattr(unit_name, "TRANSIENT_DIR", transient)
    if loaded:
        open(os.path.join(transient, "cri-containerd-c1.scope"), "w").close()
    else:
        monkeypatch.setitem(sys.modules, "runc_guard.delete.systemd_scope", None)  # importing it fails
    dirs = _systemd_container(lab, "c1")
    args = lab.invocation_args("c1")
    # systemd_scope's calls count on time.monotonic, not on the lab's fake clock
    run = DeleteRun(
        parse(args), args, lab.runtime(0), lab.settings, fs=lab.fs, mounts=mounts, clock=time.monotonic
    )
    assert run.run() == 0
    lab.report(run.log.entries, lab.settings)
    assert not any(lab.fs.exists(d) for d in dirs)
    entry = lab.entry()
    assert entry["outcome"] == "removed" and entry["systemd_unit"] == "cri-containerd-c1.scope"
    expected = "no_systemd" if loaded else "not_loaded"
    assert entry["systemd_scope_after"]["outcome"] == expected
    assert "systemd_scope" not in entry  # no stop job of runc-guard's own before the runtime (case 10)
