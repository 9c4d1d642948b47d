"""Why a delete stepped aside at start-up: the storm's hold and the reasons' words.

The shim's admission (``shim.startup``), the Python side of the launcher's step-aside
(``delete.stepaside``) and the launcher itself name the same reasons; this shared
leaf holds them once. Stdlib only: it is on the hot path.
"""

from __future__ import annotations

#: How long after a delete found every slot held the others step aside at once: containerd's
#: dead-shim cleanup budget. A full set of slots renews it, and so does a dead-shim cleanup
#: that steps aside for it (a storm's own deletes keep arriving for longer than 5 s: with a
#: full set alone renewing it, the slots freed between arrivals put 55 of 200 on the full
#: path); a serving shim's delete never does, so a node's steady churn of ordinary deletes
#: never keeps it on.
STORM_HOLD = 5.0


def overload_reason(why: str, count: int) -> str:
    """Why a delete stepped aside at start-up, for its aside record and entry: ``budget`` (``count``:
    ms of it spent), ``storm`` (marked), or ``slots`` (``count``: every one of them held)."""
    if why == "budget":
        return (
            f"containerd's budget for this delete was {count} ms old when runc-guard started"
            " (the node is overloaded); runc-guard stepped aside and ran the runtime alone"
        )
    if why == "storm":
        return (
            f"a storm of deletes is running (every slot was held less than {STORM_HOLD:g} s ago);"
            " runc-guard stepped aside and ran the runtime alone (the finisher or the sweep"
            " completes what it leaves)"
        )
    return (
        f"{count} deletes were already running at once; runc-guard stepped aside and ran"
        " the runtime alone (the finisher or the sweep completes what it leaves)"
    )
