"""One deadline rule for a delete: when its budget ends, and how much earlier it replies.

Shared by the start-up admission (``shim.startup``: step aside when too little of
*this* deadline is left) and the delete itself (``delete.run``), so the two never
disagree about how much time the runtime has. Stdlib only: it is on the hot path.
"""

from __future__ import annotations

#: Less than this share of the deadline left when a delete starts (its shim waited for
#: a CPU that long; 1 s of the default 4): step aside at once. Killed by containerd at
#: 5 s, a shim's delete leaves the task behind for good; the runtime alone is faster.
MIN_BUDGET_SHARE = 0.25


def reply_margin(timeout: float, finishing: bool, lag: float, left: float) -> float:
    """How much earlier than ``timeout`` a delete replies when a finisher completes the rest.

    ``lag``: how long containerd's budget ran before the delete could begin (the
    shim's start, the interpreter); the work containerd's shim
    still does after the reply waits for a CPU that long too, so half of it moves
    the reply earlier. ``left``: what is left of the un-margined budget. The
    margin never leaves the runtime less than MIN_BUDGET_SHARE of ``timeout``
    (nor moves the reply by more than half of it): a margin that ate the runtime's
    share spawned it and stopped it at once (exit 75, issue 30 case 3).
    """
    if not finishing or lag <= 0:
        return 0.0
    room = left - timeout * MIN_BUDGET_SHARE
    return max(0.0, min(lag / 2, timeout / 2, room))


def delete_deadline(origin: float, now: float, timeout: float, finishing: bool) -> tuple[float, float]:
    """(deadline, margin) of a delete whose budget started at ``origin`` (time.monotonic).

    The one rule for both the start-up admission (step aside when less than
    MIN_BUDGET_SHARE is left *of this deadline*) and the delete itself, so the two
    never disagree about how much time the runtime has.
    """
    margin = reply_margin(timeout, finishing, now - origin, origin + timeout - now)
    return origin + timeout - margin, margin
