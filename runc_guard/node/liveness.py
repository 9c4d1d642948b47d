"""Is a runtime state's init alive, dead, or can we not tell? Three values, never a guess.

The sweep acts on "dead" alone (it re-runs the runtime's ``delete --force``),
so only what proves death counts as dead, as runc's own ``Status()`` does:
the pid is gone (ENOENT/ESRCH from ``/proc/<pid>/stat``), it is a zombie, or
it now belongs to a process with another start time (a recycled pid). Any
other failure to read ``/proc`` (EMFILE, ENFILE, ENOMEM under the memory
pressure this tool exists for, EACCES under a hardened ``/proc``) is
``unknown``, and unknown is never acted on. An init that is exiting but not
yet a zombie (PF_EXITING: a PID namespace's init waits in do_exit() for its
namespace to empty) is still alive here: the next sweep sees it dead.
"""

from __future__ import annotations

import errno

ALIVE = "alive"
DEAD = "dead"
UNKNOWN = "unknown"

#: Fields after the ``(comm)`` of /proc/<pid>/stat: state (3) and starttime (22).
_STATE = 0
_STARTTIME = 19
#: The errors that mean "no such process": everything else says nothing about it.
_GONE = (errno.ENOENT, errno.ESRCH)


def judge_stat(raw: bytes, start: int) -> str:
    """Liveness from the bytes of ``/proc/<pid>/stat`` and the recorded start time (pure).

    ``start == 0``: the state recorded no start time; the pid alone counts.
    A line that cannot be parsed is ``unknown``.
    """
    # comm may hold spaces and parentheses: the fields start after the *last* ')'.
    close = raw.rfind(b")")
    fields = raw[close + 2 :].split() if close >= 0 else []
    if len(fields) <= _STARTTIME or not fields[_STARTTIME].isdigit():
        return UNKNOWN
    if fields[_STATE] in (b"Z", b"X", b"x"):
        return DEAD
    if start != 0 and int(fields[_STARTTIME]) != start:
        return DEAD
    return ALIVE


def init_liveness(pid: int, start: int, proc: str = "/proc") -> str:
    """``alive``, ``dead`` or ``unknown`` for the init a runtime state records.

    A pid that is not a pid (0 or negative: the state never had a running init,
    or was written half) is ``unknown``: nothing proves a process died.
    """
    if pid <= 0:
        return UNKNOWN
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError as exc:
        return DEAD if exc.errno in _GONE else UNKNOWN
    return judge_stat(raw, start)
