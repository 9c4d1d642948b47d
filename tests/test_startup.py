"""Delete slots: at most N deletes run runc-guard's path at once; the rest step aside at once."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from runc_guard.deadline import MIN_BUDGET_SHARE, delete_deadline
from runc_guard.settings import DEFAULT_DELETE_TIMEOUT, load
from runc_guard.shim.startup import acquire, slots
from tests.hermetic import own_env


def test_slots_are_taken_and_given_back(tmp_path: object) -> None:
    """Two slots: two holders get one each, a third finds none at once, a freed slot is taken
    again; a slot is close-on-exec (no runtime or helper inherits it)."""
    directory = os.path.join(str(tmp_path), "startup")
    first = acquire(directory, count=2)
    second = acquire(directory, count=2)
    assert first is not None and second is not None and first >= 0 and second >= 0
    assert not os.get_inheritable(first)
    started = time.monotonic()
    assert acquire(directory, count=2) is None
    assert time.monotonic() - started < 0.5, "no wait for a slot"
    os.close(first)
    third = acquire(directory, count=2)
    assert third is not None and third >= 0
    os.close(second)
    os.close(third)
    assert sorted(os.listdir(directory)) == ["slot-0", "slot-1"]


def test_unusable_directory_never_blocks_a_delete(tmp_path: object) -> None:
    """No writable place for the slot files: the delete goes on without a slot (-1)."""
    blocker = os.path.join(str(tmp_path), "file")
    open(blocker, "w").close()
    assert acquire(os.path.join(blocker, "startup")) == -1


def test_at_least_two_slots() -> None:
    """Two per CPU this process may run on, never fewer than two."""
    assert slots() >= 2


def test_a_costly_path_gets_fewer_slots_never_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """The deletes on the full path at once may cost COST_SHARE of the node's CPU over one timeout:
    ~45 ms of CPU keeps 2 x CPUs on a 2-core node; unmeasured, 2 x CPUs as ever; an emulated CPU's
    655 ms (the sid VM lab's, measured) is more than one may cost: 0, cpu_to_spare decides."""
    from fractions import Fraction

    from runc_guard.overload import COST_SHARE_TEXT
    from runc_guard.shim import startup

    assert Fraction(startup.COST_SHARE) == Fraction(COST_SHARE_TEXT)
    monkeypatch.setattr(startup, "cpus", lambda: 2)
    assert slots(None, 4.0) == 4 and slots(45, 4.0) == 4
    assert slots(125, 4.0) == 4 and slots(126, 4.0) == 3  # 500 ms of the 8 CPU s per delete at most
    assert slots(500, 4.0) == 1 and slots(501, 4.0) == 0 and slots(500_000, 4.0) == 0
    monkeypatch.setattr(startup, "cpus", lambda: 1)
    assert slots(None, 4.0) == 2 and slots(100, 4.0) == 2 and slots(250, 4.0) == 1 and slots(655, 4.0) == 0


def test_a_costly_path_runs_alone_only_with_cpu_to_spare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most 2 runnable tasks per CPU (this one included) by the kernel's own count; more, or a count
    that cannot be read, is a node without CPU to spare."""
    from runc_guard.shim import startup

    monkeypatch.setattr(startup, "cpus", lambda: 2)
    loadavg = tmp_path / "loadavg"
    cases = (("0.21 0.55 0.72 1/110 2211\n", 1, True), ("9.0 3.0 1.0 4/300 77\n", 4, True),
             ("9.0 3.0 1.0 5/300 77\n", 5, False), ("9.0 3.0 1.0 x/300 77\n", None, False), ("", None, False))
    for text, running, spare in cases:
        loadavg.write_text(text)
        assert startup.runnable(str(loadavg)) == running, text
        assert startup.cpu_to_spare(running) is spare, text
    assert startup.runnable(str(tmp_path / "absent")) is None
    assert isinstance(startup.runnable(), int)  # the real file


def test_the_cost_is_a_moving_measure_of_the_paths_own_cpu(tmp_path: object) -> None:
    """Each full delete folds its CPU in (a quarter of it), written when the measure moves by more
    than an eighth; a file that is not ours, not one number, or out of range is no measurement."""
    from runc_guard.overload import COST_FILE, read_cost, record_cost

    directory = os.path.join(str(tmp_path), "startup")
    assert read_cost(directory) is None
    record_cost(directory, 0)
    assert read_cost(directory) is None
    record_cost(directory, 40)
    assert read_cost(directory) == 40
    record_cost(directory, 440)
    assert read_cost(directory) == 140
    record_cost(directory, 180)  # 150: within an eighth, not written (most deletes only read it)
    assert read_cost(directory) == 140
    record_cost(directory, 300)  # 180: written
    assert read_cost(directory) == 180
    path = os.path.join(directory, COST_FILE)
    assert os.stat(path).st_mode & 0o777 == 0o600
    for text in (b"", b"140", b"-1\n", b"0\n", b"1e3\n", b"1000001\n", b" 140\n", b"14 0\n"):
        with open(path, "wb") as f:
            f.write(text)
        assert read_cost(directory) is None, text
    with open(path, "wb") as f:
        f.write(b"140\n")
    os.chmod(path, 0o622)
    assert read_cost(directory) is None  # writable by others: not a fact to admit by


def test_delete_timeout_is_read_like_the_delete_path(tmp_path: object) -> None:
    """The shim's slot deadline is the delete's own: environment over file; a bad value keeps the
    default (the delete path reports it)."""
    config = os.path.join(str(tmp_path), "config.toml")
    env = {"RUNC_GUARD_CONFIG": config, "RUNC_GUARD_CACHE_DIR": os.path.join(str(tmp_path), "cache")}
    assert load(env).delete_timeout == DEFAULT_DELETE_TIMEOUT
    for text, extra, expected in (
        ("delete_timeout = 2\n", {}, 2.0),
        ("delete_timeout = 2\n", {"RUNC_GUARD_DELETE_TIMEOUT": "3.5"}, 3.5),
        ('delete_timeout = "soon"\n', {}, DEFAULT_DELETE_TIMEOUT),
        ("delete_timeout = true\n", {}, DEFAULT_DELETE_TIMEOUT),
        ("delete_timeout = -1\n", {}, DEFAULT_DELETE_TIMEOUT),
        ("delete_timeout = 10000\n", {}, DEFAULT_DELETE_TIMEOUT),
    ):
        with open(config, "w") as f:
            f.write(text)
        assert load({**env, **extra}).delete_timeout == expected


def test_overloaded_delete_steps_aside_to_the_runtime(shim_binary: str, tmp_path: object) -> None:
    """Every slot held (a storm): the delete steps aside at once and execs the runtime exactly as
    it would have run alone: its argv and status, nothing of runc-guard's on stderr."""
    import fcntl
    import json
    import subprocess

    tmp = str(tmp_path)
    cache = os.path.join(tmp, "cache")
    held = []
    os.makedirs(os.path.join(cache, "startup"))
    for i in range(slots()):
        fd = os.open(os.path.join(cache, "startup", f"slot-{i}"), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.append(fd)
    root = os.path.join(tmp, "root")
    os.makedirs(os.path.join(root, "c1"))
    with open(os.path.join(root, "c1", "state.json"), "w") as f:
        json.dump({"id": "c1", "init_process_pid": 1, "cgroup_paths": {}}, f)
    argv_file = os.path.join(tmp, "runtime-argv")
    runtime = os.path.join(tmp, "rt")
    with open(runtime, "w") as f:
        f.write(f'#!/bin/sh\necho "$@" > {argv_file}\nexit 3\n')
    os.chmod(runtime, 0o755)
    # Every path in tmp (the step-aside's entry must not reach the node's own log file).
    env = own_env(
        tmp, {"PATH": os.environ["PATH"]},
        RUNC_GUARD_RUNTIME=runtime,
        RUNC_GUARD_CACHE_DIR=cache,
        RUNC_GUARD_PENDING_DIR=os.path.join(tmp, "pending"),
        RUNC_GUARD_JOURNAL_SOCKET=os.path.join(tmp, "no-journald"),
    )
    try:
        started = time.monotonic()
        proc = subprocess.run(
            [shim_binary, "--root", root, "delete", "--force", "c1"],
            capture_output=True, text=True, env=env, check=False, timeout=30,
        )
        elapsed = time.monotonic() - started
    finally:
        for fd in held:
            os.close(fd)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "", "")
    assert elapsed < 2.0, "no wait for a slot"
    with open(argv_file) as f:
        assert f.read().split() == ["--root", root, "delete", "--force", "c1"]
    assert not os.path.exists(os.path.join(tmp, "pending")), "stepping aside records nothing"
    # ... but an aside record, naming the runtime that ran alone, for audit and a finisher
    from runc_guard.delete.aside import OVERLOAD, iter_aside

    ((_, doc),) = list(iter_aside(cache))
    assert doc is not None
    assert (doc["kind"], doc["runtime"], doc["container_id"]) == (OVERLOAD, runtime, "c1")


@pytest.mark.parametrize("finishing", [False, True])
def test_the_runtime_keeps_its_share_of_the_deadline_at_every_lag(finishing: bool) -> None:
    """Lag 0-5 s into a 4 s budget (issue 30 case 3): admitted exactly while a quarter of *the
    delete's own deadline* (its reply margin included) is left, and then that deadline leaves the
    runtime at least 1 s. Before: with a finisher, lag 2.67-3.0 s was admitted with a deadline
    already past (the runtime spawned and stopped at once, exit 75)."""
    timeout = 4.0
    for step in range(501):
        lag = step / 100
        now = 100.0 + lag
        deadline, margin = delete_deadline(100.0, now, timeout, finishing)
        admitted = deadline - now >= timeout * MIN_BUDGET_SHARE
        assert admitted == (lag <= 3.0), lag
        if admitted:
            assert deadline - now >= 1.0 - 1e-9, lag
        assert 0.0 <= margin <= timeout / 2
        if not finishing or lag <= 2.0:  # room for the whole half-lag margin
            assert margin == pytest.approx(lag / 2 if finishing else 0.0), lag


@pytest.mark.parametrize(("lag", "admitted"), [(0.5, True), (2.5, True), (2.8, True), (2.95, True),
                                               (3.2, False)])
def test_what_the_admission_admits_the_delete_can_still_run(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, lag: float, admitted: bool
) -> None:
    """Through the shim's own admission (``_startup_slot``) and the delete's constructor, with a
    finisher on: an admitted delete's deadline is at least 1 s away; the rest step aside at once."""
    from runc_guard.delete.run import DeleteRun
    from runc_guard.invocation import parse
    from runc_guard.settings import Settings
    from runc_guard.shim import entry, startup

    stepped: list[str] = []
    monkeypatch.setattr(startup, "acquire", lambda *_a, **_k: -1)
    monkeypatch.setattr(entry, "_report_overloaded", lambda *a: stepped.append(a[-1]))
    cache = os.path.join(str(tmp_path), "cache")
    settings = Settings(cache_dir=cache, delete_timeout=4.0, finish_window=30.0)
    args = ["--root", str(tmp_path), "delete", "--force", "c1"]
    origin = time.monotonic() - lag
    slot = entry._startup_slot(parse(args), settings, os.environ, origin, "/bin/true", "unknown")
    assert (slot is not None, bool(stepped)) == (admitted, not admitted)
    if admitted:
        run = DeleteRun(parse(args), args, "/bin/true", settings, started=origin)
        assert run.deadline - time.monotonic() >= 0.95, (lag, run.deadline - time.monotonic())


def test_a_fault_in_the_admission_runs_the_runtime_alone(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runc-guard's own bug in the admission (here: a NameError, as a lost import once made it)
    never ends the delete: the entry execs the runtime with the same argv and journals why."""
    import gc
    import json
    import sys

    from runc_guard.shim import entry

    tmp = str(tmp_path)
    root = os.path.join(tmp, "root")
    os.makedirs(os.path.join(root, "c1"))
    with open(os.path.join(root, "c1", "state.json"), "w") as f:
        json.dump({"id": "c1"}, f)
    monkeypatch.setenv("RUNC_GUARD_RUNTIME", "/bin/true")
    monkeypatch.setenv("RUNC_GUARD_CONFIG", os.path.join(tmp, "none.toml"))
    monkeypatch.setenv("RUNC_GUARD_CACHE_DIR", os.path.join(tmp, "cache"))
    args = ["--root", root, "delete", "--force", "c1"]
    monkeypatch.setattr(sys, "argv", ["runc-guard", *args])

    def broken(*_a: object) -> int:
        raise NameError("name 'time' is not defined")

    execs: list[tuple[str, list[str]]] = []
    journal: list[tuple[str, str]] = []
    monkeypatch.setattr(entry, "_startup_slot", broken)
    monkeypatch.setattr(entry, "exec_runtime", lambda path, argv: execs.append((path, argv)))
    monkeypatch.setattr(entry, "_journal", lambda _e, event, message, _p: journal.append((event, message)))
    try:
        entry.main()
    finally:
        gc.enable()
    assert execs == [("/bin/true", args)]
    assert [event for event, _ in journal] == ["startup_failed"]
    assert "NameError" in journal[0][1]
