"""Is a container's init still the process the runtime started? (stdlib only)

runc records ``init_process_pid`` and ``init_process_start`` (field 22 of
``/proc/<pid>/stat``: start time in clock ticks since boot) and crun its
``pid`` and ``process-start-time``; runc's own ``Status()`` compares the two
the same way, so a recycled pid is never taken for the container's init.
"""

from __future__ import annotations

#: Fields after the ``(comm)`` of /proc/<pid>/stat: state is field 3, starttime field 22.
_STATE = 0
_STARTTIME = 19


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


def init_alive(pid: int, start: int, proc: str = "/proc") -> bool:
    """True while ``pid`` is the process that started at ``start`` and is not a zombie.

    A zombie init has exited (runc's Status() calls it stopped too); its pid only
    waits for its parent (the shim) to reap it. ``start == 0`` means the state
    did not record a start time: then only the pid's existence counts.
    """
    if pid <= 0:
        return False
    fields = _stat_fields(pid, proc)
    if fields is None or len(fields) <= _STARTTIME:
        return False
    if fields[_STATE] in ("Z", "X", "x"):
        return False
    return start == 0 or int(fields[_STARTTIME]) == start
