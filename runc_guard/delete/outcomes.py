"""How an interposed delete can end: the ``outcome`` of its canonical entry and stats line.

One list for the delete path, the metrics (rendered even at zero, so that
``rate()`` works from the first scrape) and the tests. The level of the entry:
error when runc-guard itself failed, warning when the runtime decided, else info.
"""

from __future__ import annotations

#: runc-guard had work to do (waited for or killed processes, removed directories).
REMOVED = "removed"
#: The runtime alone left nothing behind.
ALREADY_GONE = "already_gone"
#: No state, and a pending record that fails the trust rule: left as it is, the runtime ran alone.
RECORD_UNTRUSTED = "record_untrusted"

OUTCOMES = (
    REMOVED,
    ALREADY_GONE,
    "deadline",  # still busy (or the runtime still running) at the deadline: exit 75, record kept
    "rmdir_failed",  # an rmdir error waiting cannot fix: exit 74, record kept
    "interrupted",  # SIGTERM/SIGINT/SIGHUP: 128+N, record kept
    "refused",  # a path escapes cgroupfs: exit 65, nothing touched
    "runtime_failed",  # the runtime's own failure, its status passed on
    "no_state",  # state unreadable: the runtime decided
    "stepped_aside",  # not provably the container's own: the runtime ran alone
    "state_kept",  # exit 0 and the runtime kept its state (a running container)
    "record_finished",  # no state, a pending record: finished
    RECORD_UNTRUSTED,  # no state, a record runc-guard may not act on (pending.RecordRule): left
    "internal_error",  # a bug: exit 70, record kept
    "finished_late",  # after the reply, the finisher completed what a deadline cut short
)
#: A stats line's ``kind`` for a held memcg's late reclaim (node.finisher): metrics counts its
#: memory, not a delete.
MEMCG_LINE = "memcg"
#: No state and no record: nothing happened; logged at debug only, no stats line.
UNKNOWN = "unknown"
#: Outcomes where the runtime decided, not runc-guard: worth a look, not an alarm.
WARNING_OUTCOMES = frozenset({"stepped_aside", "runtime_failed", "state_kept", "no_state", RECORD_UNTRUSTED})
