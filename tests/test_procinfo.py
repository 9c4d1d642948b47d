"""procinfo: a container's init is alive only as the same process (pid + start time)."""

from __future__ import annotations

import os
import subprocess

from runc_guard.procinfo import init_alive, start_time


def _fake_proc(tmp_path: object, pid: int, stat: str) -> str:
    root = os.path.join(str(tmp_path), "proc")
    os.makedirs(os.path.join(root, str(pid)), exist_ok=True)
    with open(os.path.join(root, str(pid), "stat"), "w") as f:
        f.write(stat)
    return root


def _stat_line(comm: str, state: str, start: int) -> str:
    # pid (comm) state, then fields 4..21, then starttime (22) and more.
    rest = " ".join(["0"] * 18)
    return f"42 ({comm}) {state} {rest} {start} 0 0\n"


def test_start_time_of_this_process_is_stable() -> None:
    """The real kernel: our own start time reads the same twice and we are alive."""
    me = os.getpid()
    first = start_time(me)
    assert first is not None and first == start_time(me)
    assert init_alive(me, first)
    assert not init_alive(me, first + 1)


def test_reaped_process_is_not_alive() -> None:
    """A process that exited and was reaped has no /proc entry: not alive."""
    child = subprocess.Popen(["true"])
    started = start_time(child.pid)
    child.wait()
    assert started is not None
    assert not init_alive(child.pid, started)


def test_comm_with_parentheses_and_spaces(tmp_path: object) -> None:
    """comm may contain ') (' : the fields are read after the last ')'."""
    proc = _fake_proc(tmp_path, 42, _stat_line("a) (b c", "S", 12345))
    assert start_time(42, proc) == 12345
    assert init_alive(42, 12345, proc)


def test_zombie_is_not_alive(tmp_path: object) -> None:
    """A zombie init has exited: runc's Status() says stopped, so do we."""
    proc = _fake_proc(tmp_path, 42, _stat_line("sh", "Z", 7))
    assert not init_alive(42, 7, proc)


def test_recycled_pid_is_not_alive(tmp_path: object) -> None:
    """Same pid, other start time: another process, not the container's init."""
    proc = _fake_proc(tmp_path, 42, _stat_line("sh", "S", 8))
    assert not init_alive(42, 7, proc)
    assert init_alive(42, 0, proc), "no recorded start time: the pid alone counts"


def test_non_positive_pids_are_never_alive() -> None:
    """pid 0 (outside our PID namespace in cgroup.procs) and negatives are never looked up."""
    assert not init_alive(0, 0)
    assert not init_alive(-1, 0)
    assert start_time(0) is None
