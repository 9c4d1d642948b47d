"""Is a runtime state's init alive, dead, or can we not tell? The sweep's reading of procinfo.

The sweep acts on "dead" alone (it re-runs the runtime's ``delete --force``),
so only what proves death counts as dead, as runc's own ``Status()`` does
(:func:`runc_guard.procinfo.init_liveness`): the pid is gone, a zombie, or now
another process's. One difference from the delete path: an init that is
exiting but not yet a zombie (PF_EXITING: a PID namespace's init waits in
do_exit() for its namespace to empty) is still alive here, since the sweep has
no reason to hurry: the next sweep sees it dead.
"""

from __future__ import annotations

from runc_guard import procinfo
from runc_guard.procinfo import ALIVE, DEAD, UNKNOWN

__all__ = ["ALIVE", "DEAD", "UNKNOWN", "init_liveness", "judge_stat"]


def judge_stat(raw: bytes, start: int) -> str:
    """Liveness from the bytes of ``/proc/<pid>/stat`` and the recorded start time (pure)."""
    return procinfo.judge_stat(raw, start, exiting_is_dead=False)


def init_liveness(pid: int, start: int, proc: str = "/proc") -> str:
    """``alive``, ``dead`` or ``unknown`` for the init a runtime state records; unknown is never acted on."""
    return procinfo.init_liveness(pid, start, proc, exiting_is_dead=False)
