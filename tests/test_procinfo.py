"""procinfo: a container's init is alive only as the same process (pid + start time)."""

from __future__ import annotations

import os
import subprocess

from runc_guard.procinfo import ALIVE, DEAD, UNKNOWN, init_liveness, start_time


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
    assert init_liveness(me, first) == ALIVE
    assert init_liveness(me, first + 1) == DEAD


def test_reaped_process_is_not_alive() -> None:
    """A process that exited and was reaped has no /proc entry: not alive."""
    child = subprocess.Popen(["true"])
    started = start_time(child.pid)
    child.wait()
    assert started is not None
    assert init_liveness(child.pid, started) == DEAD


def test_comm_with_parentheses_and_spaces(tmp_path: object) -> None:
    """comm may contain ') (' : the fields are read after the last ')'."""
    proc = _fake_proc(tmp_path, 42, _stat_line("a) (b c", "S", 12345))
    assert start_time(42, proc) == 12345
    assert init_liveness(42, 12345, proc) == ALIVE


def test_zombie_is_not_alive(tmp_path: object) -> None:
    """A zombie init has exited: runc's Status() says stopped, so do we."""
    proc = _fake_proc(tmp_path, 42, _stat_line("sh", "Z", 7))
    assert init_liveness(42, 7, proc) == DEAD


def test_recycled_pid_is_not_alive(tmp_path: object) -> None:
    """Same pid, other start time: another process, not the container's init."""
    proc = _fake_proc(tmp_path, 42, _stat_line("sh", "S", 8))
    assert init_liveness(42, 7, proc) == DEAD
    assert init_liveness(42, 0, proc) == ALIVE, "no recorded start time: the pid alone counts"


def test_non_positive_pids_are_unknown() -> None:
    """pid 0 (outside our PID namespace in cgroup.procs, or a state written half) and negatives are
    never looked up, and prove nothing: unknown, never dead."""
    assert init_liveness(0, 0) == UNKNOWN
    assert init_liveness(-1, 0) == UNKNOWN
    assert start_time(0) is None


def test_a_read_error_is_unknown_and_an_exiting_init_is_dead_for_the_delete_only(tmp_path: object) -> None:
    """EISDIR (any error but ENOENT/ESRCH) proves nothing: unknown. PF_EXITING is dead for the delete
    (it must not wait on a namespace's dying init) and alive for the sweep (the next one sees it)."""
    os.makedirs(os.path.join(str(tmp_path), "43", "stat"))
    assert init_liveness(43, 7, str(tmp_path)) == UNKNOWN
    exiting = _stat_line("sh", "S", 7).replace(" S 0 0 0 0 0 0 ", " S 0 0 0 0 0 4 ", 1)
    proc = _fake_proc(tmp_path, 42, exiting)
    assert init_liveness(42, 7, proc) == DEAD
    assert init_liveness(42, 7, proc, exiting_is_dead=False) == ALIVE


def test_unescape_mountinfo_decodes_octal_escapes_to_the_last_character() -> None:
    """mountinfo writes space, tab, newline and backslash as \\NNN; one at the very end is decoded too."""
    from runc_guard.procinfo import unescape_mountinfo

    assert unescape_mountinfo("/sys/fs/cgroup") == "/sys/fs/cgroup"
    assert unescape_mountinfo("/a\\040b\\011c") == "/a b\tc"
    assert unescape_mountinfo("/ends in\\040") == "/ends in "
    assert unescape_mountinfo("/not\\04") == "/not\\04"
