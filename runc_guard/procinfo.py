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


#: What a /proc read can say of a process: three values, because a read can fail.
ALIVE = "alive"
DEAD = "dead"
UNKNOWN = "unknown"


def _fields(raw: bytes) -> list[bytes]:
    """The fields of a /proc/<pid>/stat line after ``(comm)``, which may hold spaces and ')'."""
    close = raw.rfind(b")")
    return raw[close + 2 :].split() if close >= 0 else []


def _stat_fields(pid: int, proc: str) -> list[bytes] | None:
    """The fields after ``(comm)``; None only when the process is gone (ENOENT, ESRCH).

    Any other error (EMFILE, ENFILE, ENOMEM under the memory pressure runc-guard
    exists for, EACCES) says nothing about the process and is raised: the caller
    must not read it as "dead".
    """
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            return _fields(f.read())
    except (FileNotFoundError, ProcessLookupError):
        return None


def pid_exists(pid: int) -> bool:
    """kill(pid, 0): ESRCH means gone; EPERM (someone else's process) still means it exists.

    pid <= 0 would address a process group (kill(0, 0) is our own): never asked, never alive.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_time(pid: int, proc: str = "/proc") -> int | None:
    """The process's start time in clock ticks since boot, or None when it is gone or unreadable."""
    if pid <= 0:
        return None
    try:
        fields = _stat_fields(pid, proc)
        return None if fields is None else int(fields[_STARTTIME])
    except (OSError, IndexError, ValueError):
        return None


def _exiting(fields: list[bytes]) -> bool:
    return fields[_STATE] in (b"Z", b"X", b"x") or bool(int(fields[_FLAGS]) & PF_EXITING)


def judge_stat(raw: bytes, start: int, exiting_is_dead: bool = True) -> str:
    """Liveness from the bytes of ``/proc/<pid>/stat`` and the recorded start time (pure).

    DEAD for a zombie, or another start time (a recycled pid); with
    ``exiting_is_dead`` also for a task in do_exit() (PF_EXITING). A line that
    does not parse is UNKNOWN. ``start == 0``: no recorded start time, the pid
    alone counts.
    """
    fields = _fields(raw)
    if len(fields) <= _STARTTIME or not fields[_STARTTIME].isdigit() or not fields[_FLAGS].isdigit():
        return UNKNOWN
    if fields[_STATE] in (b"Z", b"X", b"x") or (exiting_is_dead and int(fields[_FLAGS]) & PF_EXITING):
        return DEAD
    return ALIVE if start == 0 or int(fields[_STARTTIME]) == start else DEAD


def init_liveness(pid: int, start: int, proc: str = "/proc", *, exiting_is_dead: bool = True) -> str:
    """ALIVE while ``pid`` is the process that started at ``start``; DEAD only on proof.

    Proof is: the pid is gone (ENOENT/ESRCH), a zombie, another process now
    holds it (start time differs), or, with ``exiting_is_dead`` (the delete's
    view), it is exiting: the init of a PID namespace stays in do_exit()
    (zap_pid_ns_processes) until every other process of its namespace is gone,
    which is exactly the slow teardown runc 1.1's ``delete --force`` blocks on
    for up to 10 s. A zombie init has exited (runc's Status() calls it stopped
    too); its pid only waits for the shim to reap it. Any other read error
    (EMFILE, ENFILE, ENOMEM, EACCES), a line that does not parse, or a pid that
    is not one (0 or negative: a state written half) is UNKNOWN.
    """
    if pid <= 0:
        return UNKNOWN
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return DEAD
    except OSError:
        return UNKNOWN
    return judge_stat(raw, start, exiting_is_dead)


def dying(pid: int, proc: str = "/proc") -> bool:
    """True when ``pid`` is provably on its way out: exiting, a zombie, gone, or SIGKILL pending.

    A process killed while frozen (cgroup freezer) or in uninterruptible sleep
    keeps SIGKILL pending (ShdPnd for a group kill, SigPnd for the thread) until
    it can run; the kernel's zap of a PID namespace sends exactly that. A read
    that fails otherwise proves nothing: False, so the caller treats the process
    as live and steps aside rather than wait on a guess.
    """
    try:
        fields = _stat_fields(pid, proc)
        if fields is None or _exiting(fields):
            return True
        with open(f"{proc}/{pid}/status", "rb") as f:
            status = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return True
    except (OSError, IndexError, ValueError):
        return False
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


#: Who runs this delete, as the parent's command line says (delete_caller).
#: containerd's dead-shim cleanup: ``containerd-shim-runc-v2 ... -id <id> ... delete``.
DEAD_SHIM = "dead_shim"
#: The shim serving the task (``containerd-shim-runc-v2 -namespace <ns> -id <id> -address <a>``):
#: containerd's Delete over ttrpc, bounded by its caller's context (CRI: 10 s per exit event).
SERVING_SHIM = "serving_shim"
#: Anything else (ctr, nerdctl, a human, a parent that is gone or unreadable).
UNKNOWN_CALLER = "unknown"
#: The shim's actions (``start``, ``delete``) end its command line; the serving shim has none.
_SHIM_ACTIONS = (b"start", b"delete")


def shim_role(args: list[bytes]) -> str:
    """DEAD_SHIM, SERVING_SHIM or UNKNOWN_CALLER for a parent's command line (pure).

    Only what containerd's shims put there (docs/deadline.md): the dead-shim cleanup
    ends with the ``delete`` action; the serving shim is the runc v2 shim with an
    ``-id`` and no action at all. Anything else is unknown.
    """
    if len(args) < 2 or not os.path.basename(args[0]).startswith(b"containerd-shim"):
        return UNKNOWN_CALLER
    if args[-1] == b"delete":
        return DEAD_SHIM
    if os.path.basename(args[0]).startswith(b"containerd-shim-runc-v") and b"-id" in args:
        return UNKNOWN_CALLER if args[-1] in _SHIM_ACTIONS else SERVING_SHIM
    return UNKNOWN_CALLER


def delete_caller(proc: str = "/proc") -> tuple[str, float | None]:
    """Who runs this delete (shim_role of the parent) and when its budget started (deadline_origin).

    Every read can fail: an unreadable parent is UNKNOWN_CALLER, whose budget is
    today's default, and the origin falls back to our own start.
    """
    own = started_monotonic(None, proc)
    parent = os.getppid()
    try:
        with open(f"{proc}/{parent}/cmdline", "rb") as f:
            args = [a for a in f.read().split(b"\0") if a]
    except OSError:
        return UNKNOWN_CALLER, own
    role = shim_role(args)
    if role != DEAD_SHIM:
        return role, own
    shim = started_monotonic(parent, proc)
    return role, shim if own is None else min(own, shim if shim is not None else own)


def deadline_origin(proc: str = "/proc") -> float | None:
    """When containerd's budget for this call started, on the time.monotonic() clock.

    containerd times its dead-shim cleanup (``containerd-shim-runc-v2 ... delete``,
    ``io.containerd.timeout.shim.cleanup``) from the moment it starts that shim,
    which then runs us; in a crash storm the shim itself can wait seconds for a CPU
    before it gets to exec runc-guard. So when our parent is such a shim ``delete``
    the budget counts from its start, else from ours. The parent's command line
    can only move the deadline earlier, never later.
    """
    return delete_caller(proc)[1]


def unescape_mountinfo(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal ``\\NNN``."""
    if "\\" not in field:
        return field
    out = []
    i = 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)
