"""The launcher's start-up admission of a known container's delete (launcher/runc-guard.c), through
the real binary: what it hands to the Python entry, what a step-aside writes, and that it
decides as the Python entry's admission (shim/entry.py _startup_slot) would."""

from __future__ import annotations

import codecs
import contextlib
import datetime
import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from labkit.scenario import every_slot_taken
from runc_guard.delete.aside import read_aside
from runc_guard.delete.pending import record_path
from runc_guard.overload import overload_reason
from runc_guard.shim import startup
from runc_guard.shim.startup import slots
from runc_guard.spool import HELPER_NICE
from tests.launcher import builds

STRACE = shutil.which("strace")


@pytest.fixture(scope="module")
def tracer(tmp_path_factory: pytest.TempPathFactory) -> str:
    return builds.tracer(str(tmp_path_factory.mktemp("tracer")))


class Node:
    """A settings *file* with everything the admission reads (as a node's /etc/runc-guard has it),
    a runtime root with one known container (c1) and a tracer runtime."""

    def __init__(self, tmp: str, launcher: str, tracer: str) -> None:
        self.tmp, self.launcher = tmp, launcher
        self.config = os.path.join(tmp, "config.toml")
        self.cache = os.path.join(tmp, "cache")
        self.root = os.path.join(tmp, "runc-root")
        self.events = os.path.join(tmp, "events.jsonl")
        self.runtime = os.path.join(tmp, "runtime-a")
        self.trace = os.path.join(tmp, "trace")
        shutil.copy2(tracer, self.runtime)
        self.known("c1")
        self.settings()

    def known(self, container_id: str, root: str | None = None) -> None:
        directory = os.path.join(root or self.root, container_id)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "state.json"), "w") as f:
            f.write("{}")

    def settings(self, extra: str = "", delete_timeout: float = 1.0, finish_window: float = 0.0) -> None:
        with open(self.config, "w") as f:
            f.write(
                f'runtime = "{self.runtime}"\npending_dir = "{self.tmp}/pending"\n'
                f'journal_socket = "{self.tmp}/no-journald"\nlog_file = "{self.events}"\n'
                f'stats_file = "{self.tmp}/stats.jsonl"\nreporter_linger = 0.0\n'
                f"delete_timeout = {delete_timeout}\nfinish_window = {finish_window}\n{extra}"
            )
        self.call(["state", "c1"])  # the Python entry writes the routing cache for this version

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": os.environ["PATH"], "RUNC_GUARD_CONFIG": self.config,
                "RUNC_GUARD_CACHE_DIR": self.cache, "TRACE_TO": self.trace, **extra}

    def call(self, args: list[str], parent: list[str] | None = None, cwd: str | None = None, lag: float = 0.0,
             **extra: str) -> tuple[int, dict[str, list[list[str]]]]:
        """(exit status, {"main": argvs exec'd by the called process after the first, "helpers": argvs
        exec'd by its children}); ``parent``: run it from a process with that command line, ``lag`` s after
        that process started (a shim that waited for a CPU)."""
        assert STRACE, "strace is an apt dependency of the tests (make deps)"
        log = os.path.join(self.tmp, "strace", "log")
        os.makedirs(os.path.dirname(log), exist_ok=True)
        env, command = self.env(**extra), [self.launcher, *args]
        if parent is not None:  # bash under the shim's name; the launcher runs as its child (not exec'd)
            env.update(RG_LAG=str(lag), RG_COMMAND=shlex.join(command))
            script = 'sleep "$RG_LAG"; eval "$RG_COMMAND"; exit $?'
            command = ["bash", "-c", f'exec -a "$0" bash -c {shlex.quote(script)} "$@"', *parent]
        traced = [STRACE, "-ff", "-qq", "-s", "256", "-e", "trace=execve", "-e", "signal=none", "-o", log,
                  *command]
        proc = subprocess.run(traced, env=env, capture_output=True, text=True, timeout=60, check=False,
                              cwd=cwd)
        execs: dict[int, list[list[str]]] = {}
        for name in os.listdir(os.path.dirname(log)):  # -ff: one file per process, never interleaved
            path = os.path.join(os.path.dirname(log), name)
            with open(path) as f:
                argvs = [_strace_argv(line) for line in f if line.startswith("execve(") and "= 0" in line]
            os.unlink(path)
            execs[int(name.rpartition(".")[2])] = [[os.path.basename(a[0]), *a[1:]] for a in argvs]
        first = min(pid for pid, argvs in execs.items() if argvs and argvs[0][0] == "runc-guard")
        main = execs.pop(first)[1:]
        execs = {pid: argvs for pid, argvs in execs.items() if pid > first}  # its helpers, not the shim
        return proc.returncode, {"main": main, "helpers": [a for argvs in execs.values() for a in argvs]}

    def delete(self, container_id: str = "c1", **kw: object) -> tuple[int, dict[str, list[list[str]]]]:
        return self.call(["--root", self.root, "delete", "--force", container_id], **kw)  # type: ignore[arg-type]

    def slots_taken(self) -> contextlib.AbstractContextManager[None]:
        return every_slot_taken(self.cache)

    def aside(self, container_id: str = "c1", root: str | None = None) -> dict[str, object] | None:
        """The aside record, once the reporter a step-aside started has written it (runc_guard.stepaside)."""
        _wait_for_helpers(self.tmp, ("cache/spool/.reporter.lock",))
        return read_aside(record_path(os.path.join(self.cache, "aside"), root or self.root, container_id))

    def entries(self, event: str, timeout: float = 20.0) -> list[dict[str, object]]:
        """The reporter's entries of ``event`` in the log file (journald absent), waited for."""
        until = time.monotonic() + timeout
        while True:
            found = []
            if os.path.exists(self.events):
                with open(self.events) as f:
                    found = [e for e in map(json.loads, f) if e.get("event") == event]
            if found or time.monotonic() > until:
                return found
            time.sleep(0.1)


def _strace_argv(line: str) -> list[str]:
    """The argv array of one strace ``execve("p", ["a", "b"...], ...)`` line (strings may hold ``]``)."""
    words, i = [], line.index("[") + 1
    while line[i] != "]":
        if line[i] == '"':
            end = i + 1
            while line[end] != '"':
                end += 2 if line[end] == "\\" else 1
            words.append(codecs.escape_decode(line[i + 1:end].encode())[0].decode("utf-8", "surrogateescape"))
            i = end + 1
        else:
            i += 1
    return words


@pytest.fixture
def node(tmp_path: os.PathLike[str], shim_binary: str, tracer: str) -> Iterator[Node]:
    yield Node(str(tmp_path), shim_binary, tracer)
    _wait_for_helpers(str(tmp_path))


HELPER_LOCKS = ("cache/spool/.reporter.lock", "cache/finisher.lock")


def _wait_for_helpers(tmp: str, locks: tuple[str, ...] = HELPER_LOCKS) -> None:
    """The helpers a test's deletes started exit on their own (linger 0); wait for their locks."""
    for lock in locks:
        path = os.path.join(tmp, lock)
        if not os.path.exists(path):
            continue
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # the helper lets go as it exits
        finally:
            os.close(fd)


PY = "runc-guard.py"


def test_an_admitted_delete_loads_the_delete_path_with_the_slot_handed_over(node: Node) -> None:
    status, execs = node.delete()
    assert status == 0
    assert [a[0] for a in execs["main"]] == [PY]  # the delete path then runs the runtime in a child
    assert ["runtime-a", "--root", node.root, "delete", "--force", "c1"] in execs["helpers"]
    with open(node.trace) as f:
        fds = [line.split()[2] for line in f if line.startswith("fd ")]
    assert not any("startup" in target for target in fds), fds  # the slot never reaches the runtime
    assert node.aside() is None
    assert node.entries("delete", timeout=10)[0]["outcome"] == "no_state"


def test_an_admitted_delete_holds_its_slot_until_it_ends(node: Node) -> None:
    """The slot is the delete's for its whole run, not only while it loads: with every other
    slot held, the runtime the delete runs finds none free (a storm runs at most 2 x CPUs
    deletes on runc-guard's path), and the slot is free again once the delete has ended."""
    directory = os.path.join(node.cache, "startup")
    os.makedirs(directory, exist_ok=True)
    seen = os.path.join(node.tmp, "seen")
    with open(node.runtime, "w") as f:  # a runtime that looks at every slot while it runs
        f.write(f'#!/bin/sh\nfor i in $(seq 0 {slots() - 1}); do\n'
                f'  flock -n -E 9 "{directory}/slot-$i" true; echo "$?" >> "{seen}"\ndone\n')
    os.chmod(node.runtime, 0o755)
    held = [os.open(os.path.join(directory, f"slot-{i}"), os.O_RDWR | os.O_CREAT, 0o600)
            for i in range(slots() - 1)]
    try:
        for fd in held:
            fcntl.flock(fd, fcntl.LOCK_EX)
        status, execs = node.delete()
    finally:
        for fd in held:
            os.close(fd)
    assert status == 0 and [a[0] for a in execs["main"]] == [PY]
    with open(seen) as f:
        assert f.read().split() == ["9"] * slots()  # every slot held, the delete's own included
    assert node.aside() is None
    for i in range(slots()):
        fd = os.open(os.path.join(directory, f"slot-{i}"), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once the delete ended
        finally:
            os.close(fd)


def test_all_slots_taken_steps_aside_in_c(node: Node) -> None:
    """No interpreter in the call: the runtime alone, the aside record and the entry written, a reporter."""
    with node.slots_taken():
        status, execs = node.delete()
    assert status == 0
    assert execs["main"] == [["runtime-a", "--root", node.root, "delete", "--force", "c1"]]
    assert [a[:2] for a in execs["helpers"] if a[0] == PY] == [[PY, "reporter"]]  # no finisher: window 0
    record = node.aside()
    assert record is not None
    assert (record["kind"], record["runtime"], record["cgroup_paths"]) == ("overload", node.runtime, [])
    assert str(record["reason"]).startswith(f"{slots()} deletes were already running at once; runc-guard")
    [entry] = node.entries("startup_overloaded")
    assert (entry["container_id"], entry["runtime_root"]) == ("c1", node.root)
    assert entry["reason"] == record["reason"]
    # the launcher's own civil-date arithmetic (no tzset): EventLog's format, UTC, now
    stamp = datetime.datetime.strptime(str(entry["timestamp"]), "%Y-%m-%dT%H:%M:%S.%fZ")
    assert abs(stamp.replace(tzinfo=datetime.UTC) - datetime.datetime.now(datetime.UTC)).total_seconds() < 60


@pytest.mark.parametrize("door", ["launcher", "python"])
def test_a_full_set_of_slots_marks_a_storm_for_five_seconds(node: Node, door: str) -> None:
    """Once a delete found every slot held, the deletes of the next STORM_HOLD seconds step
    aside at once even when a slot is free (a storm's full path stays its first few deletes);
    a dead-shim cleanup stepping aside renews the mark, another caller does not; a mark older
    than that, or in the future (the clock stepped back), admits as usual. The Python entry (a
    RUNC_GUARD_* timeout makes the launcher leave it the decision) alike."""
    extra = {} if door == "launcher" else {"RUNC_GUARD_DELETE_TIMEOUT": "1.0"}
    mark = os.path.join(node.cache, "startup", startup.STORM_MARK)
    aside = ([] if door == "launcher" else [PY]) + ["runtime-a"]
    with node.slots_taken():
        status, execs = node.delete(**extra)
        assert status == 0 and [a[0] for a in execs["main"]] == aside
        marked = os.stat(mark).st_mtime
    with open(mark, "a"):  # slots_taken removed it: back as the storm's delete left it
        pass
    os.utime(mark, (marked, marked))
    os.unlink(record_path(os.path.join(node.cache, "aside"), node.root, "c1"))
    status, execs = node.delete(**extra)
    assert status == 0 and [a[0] for a in execs["main"]] == aside, (status, execs)
    record = node.aside()
    assert record is not None and str(record["reason"]).startswith(
        f"a storm of deletes is running (every slot was held less than {startup.STORM_HOLD:g} s ago);")
    assert os.stat(mark).st_mtime == marked  # an unknown caller's step-aside does not renew it
    shim = ["containerd-shim-runc-v2", "-namespace", "k8s.io", "-id", "c1", "-address", "/x", "delete"]
    status, execs = node.delete(parent=shim, **extra)
    assert status == 0 and [a[0] for a in execs["main"]] == aside
    assert os.stat(mark).st_mtime > marked  # a dead-shim cleanup's does: the storm goes on
    for offset in (-startup.STORM_HOLD - 1, 3600.0):
        os.utime(mark, (time.time() + offset, time.time() + offset))
        status, execs = node.delete(**extra)
        assert status == 0 and [a[0] for a in execs["main"]] == [PY], offset


def _hold(directory: str, count: int) -> list[int]:
    fds = [os.open(os.path.join(directory, f"slot-{i}"), os.O_RDWR | os.O_CREAT, 0o600) for i in range(count)]
    for fd in fds:
        fcntl.flock(fd, fcntl.LOCK_EX)
    return fds


@pytest.mark.parametrize("door", ["launcher", "python"])
@pytest.mark.parametrize("cost", [b"60\n", b"62\n", b"100\n", b"7\n", b"bad\n", b"-5\n", b"1000001\n"])
def test_the_measured_cost_bounds_the_slots_in_c_as_in_python(node: Node, door: str, cost: bytes) -> None:
    """The path's measured CPU (overload.read_cost) gives both doors the same count: with one slot
    fewer held the delete is admitted, with that many held it steps aside naming the count; a cost
    that is no measurement leaves 2 x CPUs. A delete records its own cost as it ends, so each
    delete here starts from the file as written."""
    from runc_guard.overload import COST_FILE, read_cost

    extra = {} if door == "launcher" else {"RUNC_GUARD_DELETE_TIMEOUT": "1.0"}
    directory = os.path.join(node.cache, "startup")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, COST_FILE)
    with open(path, "wb") as f:
        f.write(cost)
    os.chmod(path, 0o600)
    count = slots(read_cost(directory), 1.0)
    fds = _hold(directory, count - 1)
    try:
        status, execs = node.delete(**extra)
    finally:
        for fd in fds:
            os.close(fd)
    assert status == 0 and [a[0] for a in execs["main"]] == [PY], (cost, count, execs)
    with open(path, "wb") as f:
        f.write(cost)
    fds = _hold(directory, count)
    try:
        status, execs = node.delete(**extra)
    finally:
        for fd in fds:
            os.close(fd)
    assert status == 0 and execs["main"][-1][0] == "runtime-a" and [PY, "delete"] not in execs["main"]
    record = node.aside()
    assert record is not None and record["reason"] == overload_reason("slots", count)


@contextlib.contextmanager
def _runnable(count: int) -> Iterator[None]:
    """``count`` busy loops: tasks the kernel counts runnable (/proc/loadavg), stopped by pid after."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.2)
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@pytest.mark.parametrize("door", ["launcher", "python"])
def test_a_path_too_costly_for_one_steps_aside_while_the_cpus_are_busy(node: Node, door: str) -> None:
    """A measured cost above COST_SHARE of the node's CPU for one delete (0 slots): with more than 2
    runnable tasks per CPU (busy loops here, a storm's shims and runtimes on a node) both doors step
    aside, name it and mark a storm, whatever slot is free."""
    from runc_guard.overload import COST_FILE

    # A 4 s deadline: under the busy loops (and a loaded CI machine) the launcher's start must not use
    # up a quarter of it, which steps aside for the budget instead (test_too_little_budget_left...).
    node.settings(delete_timeout=4.0)
    extra = {} if door == "launcher" else {"RUNC_GUARD_DELETE_TIMEOUT": "4.0"}
    directory = os.path.join(node.cache, "startup")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, COST_FILE), "wb") as f:
        f.write(b"100000\n")
    os.chmod(os.path.join(directory, COST_FILE), 0o600)
    assert slots(100000, 4.0) == 0
    before = time.time()
    with _runnable(3 * startup.cpus() + 2):
        status, execs = node.delete(**extra)
    assert status == 0 and execs["main"][-1][0] == "runtime-a" and [PY, "delete"] not in execs["main"]
    record = node.aside()
    assert record is not None
    assert str(record["reason"]).startswith("runc-guard's path costs more than 1/16"), record
    assert "tasks were runnable (more than 2 per CPU)" in str(record["reason"]), record
    assert os.stat(os.path.join(directory, startup.STORM_MARK)).st_mtime >= before - 1  # a storm marked


def test_a_helper_runs_below_the_runtimes_from_its_first_instruction(node: Node, tmp_path: Any) -> None:
    """The launcher lowers a helper's nice and its session's autogroup in the child, before its exec:
    the interpreter's start (a helper's largest cost) never competes with the storm's runtimes."""
    log = os.path.join(str(tmp_path), "nice", "log")
    os.makedirs(os.path.dirname(log))
    with node.slots_taken():
        command = [node.launcher, "--root", node.root, "delete", "--force", "c1"]
        subprocess.run([STRACE, "-ff", "-qq", "-s", "256", "-e", "trace=execve,setpriority,openat,write",
                        "-e", "signal=none", "-o", log, *command], env=node.env(), capture_output=True,
                       timeout=60, check=True)
    node.aside()  # the reporter is done
    helpers = []
    for name in os.listdir(os.path.dirname(log)):
        with open(os.path.join(os.path.dirname(log), name)) as f:
            lines = f.read().splitlines()
        execs = [i for i, line in enumerate(lines) if line.startswith("execve(") and '"reporter"' in line]
        if execs:
            helpers.append(lines[:execs[0]])
    assert len(helpers) == 1, helpers
    before = helpers[0]
    calls = [" ".join(line.split()) for line in before]  # strace pads before " = "
    assert f"setpriority(PRIO_PROCESS, 0, {HELPER_NICE}) = 0" in calls, before
    [group] = [i for i, call in enumerate(calls) if '"/proc/self/autogroup", O_WRONLY' in call]
    fd = calls[group].rpartition("= ")[2]
    assert f'write({fd}, "{HELPER_NICE}", 2) = 2' in calls[group:], before


def test_a_finish_window_starts_the_finisher_unless_one_runs(node: Node) -> None:
    """With a finish window the step-aside starts the finisher, unless one holds its lock already:
    one finisher serves every stepped-aside delete of a storm."""
    node.settings(finish_window=30.0)
    node.known("c2")
    lock = os.open(os.path.join(node.cache, "finisher.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as a running finisher holds it
        with node.slots_taken():
            held = node.delete("c1")[1]
    finally:
        os.close(lock)
    with node.slots_taken():
        free = node.delete("c2")[1]
    assert [a[1] for a in held["helpers"] if a[1] == "finisher"] == []
    assert [a[1] for a in free["helpers"] if a[1] == "finisher"] == ["finisher"]
    assert node.aside("c1") is not None  # the record waits for the finisher that runs


def test_too_little_budget_left_steps_aside_at_once(node: Node) -> None:
    """A dead-shim cleanup that waited 0.8 s of a 1 s budget for a CPU: no slot wait, no interpreter."""
    shim = ["containerd-shim-runc-v2", "-namespace", "k8s.io", "-id", "c1", "-address", "/x", "delete"]
    node.settings(delete_timeout=1.0)
    status, execs = node.call(["--root", node.root, "delete", "--force", "c1"], parent=shim, lag=0.8)
    assert status == 0
    assert [a[0] for a in execs["main"]] == ["runtime-a"]
    record = node.aside()
    assert record is not None and "old when runc-guard started" in str(record["reason"]), record
    # The same shim without the lag: admitted, the delete path loads.
    status, execs = node.call(["--root", node.root, "delete", "--force", "c1"], parent=shim)
    assert status == 0 and [a[0] for a in execs["main"]] == [PY]


@pytest.mark.parametrize("variable", ["RUNC_GUARD_DELETE_TIMEOUT", "RUNC_GUARD_FINISH_WINDOW",
                                      "RUNC_GUARD_REPORTER_LINGER", "RUNC_GUARD_LOG_FILE",
                                      "RUNC_GUARD_JOURNAL_SOCKET", "RUNC_GUARD_LOG_LEVEL",
                                      "RUNC_GUARD_STATS_FILE", "RUNC_GUARD_NOT_A_SETTING"])
def test_a_settings_variable_leaves_the_delete_to_python(node: Node, variable: str) -> None:
    """settings.py lets the variable win over the file; the launcher parses none: the Python entry
    admits (and, with every slot taken, steps aside itself)."""
    value = {"RUNC_GUARD_LOG_LEVEL": "info", "RUNC_GUARD_LOG_FILE": node.events,
             "RUNC_GUARD_JOURNAL_SOCKET": os.path.join(node.tmp, "no-journald"),
             "RUNC_GUARD_STATS_FILE": os.path.join(node.tmp, "stats.jsonl")}.get(variable, "0.5")
    with node.slots_taken():
        status, execs = node.delete(**{variable: value})
    assert status == 0
    assert [a[0] for a in execs["main"]] == [PY, "runtime-a"]
    assert node.aside() is not None


def test_what_c_cannot_write_exactly_goes_to_python(node: Node) -> None:
    """A root that is not printable ASCII; an aside directory crowded enough that the writer prunes."""
    odd = os.path.join(node.tmp, "r\u00e9-root")
    node.known("c1", root=odd)
    with node.slots_taken():
        status, execs = node.call(["--root", odd, "delete", "--force", "c1"])
    assert status == 0 and [a[0] for a in execs["main"]] == [PY, "runtime-a"]
    assert node.aside(root=odd) is not None  # the Python entry stepped aside and wrote it
    aside = os.path.join(node.cache, "aside")
    for i in range(4000):  # tmpfs counts ~20 bytes an entry: past bounds.CROWDED_DIR_BYTES
        with open(os.path.join(aside, f"x{i:04d}-{'y' * 40}@000000000000.json"), "w"):
            pass
    with node.slots_taken():
        assert [a[0] for a in node.delete()[1]["main"]] == [PY, "runtime-a"]
    assert len(os.listdir(aside)) <= 2001  # the Python writer pruned (delete.bounds)


@pytest.mark.parametrize("root", ["relative-root", "./x/../relative-root/", "/{tmp}//a/./b/..", "//{tmp}/c/"])
def test_the_record_is_named_as_the_python_side_names_it(node: Node, root: str) -> None:
    """abspath + normpath (two leading slashes stay two) + SHA-256 in C: the record lands where
    pending.record_path puts it, naming the root as os.path.abspath does."""
    root = root.format(tmp=node.tmp.lstrip("/"))
    os.makedirs(os.path.join(node.tmp, "x"), exist_ok=True)
    absolute = os.path.abspath(os.path.join(node.tmp, root))
    node.known("c1", root=absolute)
    os.makedirs(os.path.join(node.tmp, "a", "b"), exist_ok=True)
    with node.slots_taken():
        status, execs = node.call(["--root", root, "delete", "--force", "c1"], cwd=node.tmp)
    assert status == 0 and [a[0] for a in execs["main"]] == ["runtime-a"]
    record = node.aside(root=absolute)
    assert record is not None and record["runtime_root"] == absolute


def test_c_and_python_step_aside_alike(node: Node) -> None:
    """The same stepped-aside delete through the launcher's admission and the Python entry's."""
    found = []
    for extra in ({}, {"RUNC_GUARD_DELETE_TIMEOUT": "1.0"}):
        with node.slots_taken():
            node.delete(**extra)
        record = node.aside()
        assert record is not None
        os.unlink(record_path(os.path.join(node.cache, "aside"), node.root, "c1"))
        [entry] = node.entries("startup_overloaded")
        os.unlink(node.events)
        found.append(({k: v for k, v in record.items() if k not in ("created", "reason")},
                      sorted(entry), str(record["reason"]).split(";")[0].split(" after ")[0]))
    assert found[0] == found[1]


ADMIT_C = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "launcher",
                       "runc-guard.c")


def test_the_c_constants_are_the_python_ones() -> None:
    """launcher/runc-guard.c restates the deadline rule, startup.py's, and the writers' names and bounds."""
    from runc_guard import deadline
    from runc_guard.delete import bounds, report
    from runc_guard.shim import startup
    from runc_guard.spool import LOCK

    with open(ADMIT_C) as f:
        defined = dict(line.split(None, 2)[1:] for line in f
                       if line.startswith("#define ") and " " in line[8:])
    assert float(defined["MIN_BUDGET_SHARE"]) == deadline.MIN_BUDGET_SHARE
    assert float(defined["STORM_HOLD"]) == startup.STORM_HOLD
    assert defined["STORM_MARK"].strip() == f"\"{startup.STORM_MARK}\""
    assert defined["CROWDED_DIR_BYTES"].strip() == f"({bounds.CROWDED_DIR_BYTES >> 10} << 10)"
    assert defined["FINISHER_LOCK"].strip() == f"\"{report.FINISHER_LOCK}\""
    assert defined["REPORTER_LOCK"].strip() == f"\"{LOCK}\""
    # ... the path's measured cost (overload.read_cost, startup.slots) and the helpers' nice
    from fractions import Fraction

    from runc_guard import overload
    from runc_guard.spool import HELPER_NICE

    assert defined["COST_FILE"].strip() == f"\"{overload.COST_FILE}\""
    assert int(defined["COST_MAX_MS"]) == overload.COST_MAX_MS
    assert defined["COST_SHARE"].strip() == f"(1.0 / {Fraction(startup.COST_SHARE).denominator})"
    assert Fraction(startup.COST_SHARE).numerator == 1
    assert int(defined["HELPER_NICE"]) == HELPER_NICE
    # ... and the caller roles the hand-over names, which the shim restates to stay light
    from runc_guard import procinfo
    from runc_guard.shim.entry import CALLERS

    assert CALLERS == (procinfo.DEAD_SHIM, procinfo.SERVING_SHIM, procinfo.UNKNOWN_CALLER)
    with open(ADMIT_C) as f:
        source = f.read()
    assert all(f'"{role}"' in source for role in CALLERS)


def _as_caller() -> None:
    """A caller that ignores SIGINT and blocks SIGUSR1 (a Go shim passes what it inherited on)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})


def test_the_runtime_a_step_aside_starts_is_exactly_the_runtime_alone(node: Node) -> None:
    """After the step-aside's record, spool entry and helper: argv[1:], the environment's bytes, cwd,
    fds and the signal mask and dispositions the runtime sees are those of the runtime run alone."""
    args = ["--root", node.root, "delete", "--force", "c1"]
    traces = []
    with open(os.path.join(node.tmp, "output"), "w") as out:  # the same stdout/stderr for both runs
        for binary in (node.launcher, node.runtime):
            with node.slots_taken():
                subprocess.run([binary, *args], env=node.env(), cwd=node.tmp, preexec_fn=_as_caller,
                               stdout=out, stderr=out, timeout=60, check=True)
            traces.append(_trace_of(node))
    assert node.aside() is not None  # the launcher's run stepped aside
    assert traces[0] == traces[1]
    assert any(line.startswith("SigIgn:") and int(line.split()[1], 16) & 1 << (signal.SIGINT - 1)
               for line in traces[0])


def _trace_of(node: Node) -> list[str]:
    """The tracer's record without what differs by design: its pid and argv[0] (the path run)."""
    with open(node.trace) as f:
        lines = [line for line in f if not line.startswith("pid ")]
    os.unlink(node.trace)
    return lines[1:] if lines[0].startswith("argv ") else lines
