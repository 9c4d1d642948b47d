"""Is a container's init still the process the runtime started? (stdlib only)

runc records ``init_process_pid`` and ``init_process_start`` (field 22 of
``/proc/<pid>/stat``: start time in clock ticks since boot) and crun its
``pid`` and ``process-start-time``; runc's own ``Status()`` compares the two
the same way, so a recycled pid is never taken for the container's init.
"""

from __future__ import annotations

import os
import time

#: Fields after the ``(comm)`` of /proc/<pid>/stat: state (3), flags (9), starttime (22).
_STATE = 0
_FLAGS = 6
_STARTTIME = 19
#: include/linux/sched.h: set by do_exit() before the task releases anything.
PF_EXITING = 0x00000004
#: SIGKILL's bit in the hex masks of /proc/<pid>/status (bit N-1 for signal N).
_SIGKILL_BIT = 1 << 8


def _stat_fields(pid: int, proc: str) -> list[str] | None:
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:  # ENOENT/ESRCH: gone; anything else: we cannot say it is alive
        return None
    # comm may hold spaces and parentheses: the fields start after the *last* ')'.
    return raw[raw.rfind(b")") + 2 :].decode("ascii", "replace").split()


def start_time(pid: int, proc: str = "/proc") -> int | None:
    """The process's start time in clock ticks since boot, or None when it is gone."""
    if pid <= 0:
        return None
    fields = _stat_fields(pid, proc)
    if fields is None or len(fields) <= _STARTTIME:
        return None
    return int(fields[_STARTTIME])


def _exiting(fields: list[str]) -> bool:
    return fields[_STATE] in ("Z", "X", "x") or bool(int(fields[_FLAGS]) & PF_EXITING)


def init_alive(pid: int, start: int, proc: str = "/proc") -> bool:
    """True while ``pid`` is the process that started at ``start`` and is not exiting.

    A zombie init has exited (runc's Status() calls it stopped too); its pid only
    waits for its parent (the shim) to reap it. An init with PF_EXITING is dying:
    the init of a PID namespace stays in do_exit() (zap_pid_ns_processes) until
    every other process of its namespace is gone, which is exactly the slow
    teardown runc 1.1's ``delete --force`` blocks on for up to 10 s.
    ``start == 0`` means the state did not record a start time: the pid alone counts.
    """
    if pid <= 0:
        return False
    fields = _stat_fields(pid, proc)
    if fields is None or len(fields) <= _STARTTIME or _exiting(fields):
        return False
    return start == 0 or int(fields[_STARTTIME]) == start


def dying(pid: int, proc: str = "/proc") -> bool:
    """True when ``pid`` is on its way out: exiting, a zombie, gone, or SIGKILL pending.

    A process killed while frozen (cgroup freezer) or in uninterruptible sleep
    keeps SIGKILL pending (ShdPnd for a group kill, SigPnd for the thread) until
    it can run; the kernel's zap of a PID namespace sends exactly that.
    """
    fields = _stat_fields(pid, proc)
    if fields is None or len(fields) <= _STARTTIME or _exiting(fields):
        return True
    try:
        with open(f"{proc}/{pid}/status", "rb") as f:
            status = f.read()
    except OSError:
        return True
    for line in status.splitlines():
        if line.startswith((b"ShdPnd:", b"SigPnd:")) and int(line.split()[1], 16) & _SIGKILL_BIT:
            return True
    return False


def start_wall_time(start: int) -> float:
    """Wall-clock seconds of a /proc start time (clock ticks since boot, CLOCK_BOOTTIME).

    Precise to a tick plus any step of the wall clock since; callers allow a margin.
    """
    ticks = os.sysconf("SC_CLK_TCK")
    booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return booted + start / ticks


def started_monotonic(pid: int | None = None, proc: str = "/proc") -> float | None:
    """When ``pid`` (default: this process) started, on the time.monotonic() clock.

    The delete's deadline counts from the moment containerd started runc-guard,
    not from when its imports were done: containerd's budget counts from then too.
    """
    start = start_time(os.getpid() if pid is None else pid, proc)
    if start is None:
        return None
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - start / os.sysconf("SC_CLK_TCK")
    return time.monotonic() - max(0.0, age)


def deadline_origin(proc: str = "/proc") -> float | None:
    """When containerd's budget for this call started, on the time.monotonic() clock.

    containerd times its dead-shim cleanup (``containerd-shim-runc-v2 ... delete``,
    ``io.containerd.timeout.shim.cleanup``) from the moment it starts that shim,
    which then runs us; in a crash storm the shim itself can wait seconds for a CPU
    before it gets to exec runc-guard. So when our parent is such a shim ``delete``
    the budget counts from its start, else from ours. The parent's command line
    can only move the deadline earlier, never later.
    """
    own = started_monotonic(None, proc)
    parent = os.getppid()
    try:
        with open(f"{proc}/{parent}/cmdline", "rb") as f:
            args = [a for a in f.read().split(b"\0") if a]
    except OSError:
        return own
    if len(args) < 2 or args[-1] != b"delete" or not os.path.basename(args[0]).startswith(b"containerd-shim"):
        return own
    shim = started_monotonic(parent, proc)
    return shim if own is None else min(own, shim if shim is not None else own)
