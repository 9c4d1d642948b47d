"""Why a delete stepped aside at start-up: the storm's hold, the path's measured cost, the reasons' words.

The shim's admission (``shim.startup``), the Python side of the launcher's step-aside
(``delete.stepaside``) and the launcher itself name the same reasons; the delete
records what its path cost (``delete.run``) for the admission to read. This shared
leaf holds them once. Stdlib only: it is on the hot path.
"""

from __future__ import annotations

import os

#: How long after a delete found every slot held the others step aside at once: containerd's
#: dead-shim cleanup budget. A full set of slots renews it, and so does a dead-shim cleanup
#: that steps aside for it (a storm's own deletes keep arriving for longer than 5 s: with a
#: full set alone renewing it, the slots freed between arrivals put 55 of 200 on the full
#: path); a serving shim's delete never does, so a node's steady churn of ordinary deletes
#: never keeps it on.
STORM_HOLD = 5.0


#: shim.startup.COST_SHARE, as the reasons name it.
COST_SHARE_TEXT = "1/16"


def overload_reason(why: str, count: int) -> str:
    """Why a delete stepped aside at start-up, for its aside record and entry: ``budget`` (``count``:
    ms of it spent), ``storm`` (marked), ``slots`` (``count``: every one of them held), or ``cpu``
    (``count``: tasks runnable, 0 unknown, on a node where one path costs too much: shim.startup)."""
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
    if why == "cpu":
        seen = f"{count} tasks were runnable" if count else "the node's load was unreadable"
        return (
            f"runc-guard's path costs more than {COST_SHARE_TEXT} of this node's CPU over a deadline"
            f" and {seen} (more than 2 per CPU); runc-guard stepped aside and ran the runtime alone"
            " (the finisher or the sweep completes what it leaves)"
        )
    running = "delete was" if count == 1 else "deletes were"
    return (
        f"{count} {running} already running at once; runc-guard stepped aside and ran"
        " the runtime alone (the finisher or the sweep completes what it leaves)"
    )


#: The full path's own CPU per delete, in ms (decimal, one line), among the slot files: a moving
#: average of what the deletes that took it measured as they ended (:func:`record_cost`).
COST_FILE = "cost"
#: Costs outside 1 ms .. 1000 s are no measurement: the file is ignored.
COST_MAX_MS = 1_000_000


def read_cost(directory: str) -> int | None:
    """The full path's measured CPU per delete (ms), or None: never measured, foreign, unreadable."""
    from runc_guard.atomic import read_trusted

    data = read_trusted(os.path.join(directory, COST_FILE), 32)
    if not data or not data.endswith(b"\n") or not data[:-1].isdigit():
        return None
    cost = int(data[:-1])
    return cost if 0 < cost <= COST_MAX_MS else None


def record_cost(directory: str, cpu_ms: int) -> None:
    """Fold one full-path delete's own CPU into the node's measure: a quarter of the new one.

    On every delete's reply path, so written only when the measure moves by more than an
    eighth (the admission compares it at a 1/16 share; a few percent change no count):
    most deletes only read it.
    """
    from runc_guard.atomic import write_atomic

    if cpu_ms <= 0:
        return
    old = read_cost(directory)
    cost = min(COST_MAX_MS, cpu_ms if old is None else (3 * old + cpu_ms + 2) // 4)
    if old is not None and abs(cost - old) * 8 <= old:
        return
    try:
        write_atomic(os.path.join(directory, COST_FILE), b"%d\n" % cost, 0o600, durable=False, dir_mode=0o700)
    except OSError:
        pass
