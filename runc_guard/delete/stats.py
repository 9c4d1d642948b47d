"""The stats line: one small JSON line per delete (and per late finish) in ``stats_file``.

``runc-guardctl metrics`` aggregates these lines (there is no daemon); the delete and the
finisher both write them, so the writer stands apart from either.
"""

from __future__ import annotations

import time

from runc_guard import cjson
from runc_guard.atomic import append_line
from runc_guard.delete.bounds import STATS_CAP_BYTES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def own_cost() -> dict[str, int]:
    """What this delete cost so far: runc-guard's own CPU, the runtime children's, peak RSS."""
    import resource

    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "cpu_ms": round((me.ru_utime + me.ru_stime) * 1000),
        "runtime_cpu_ms": round((children.ru_utime + children.ru_stime) * 1000),
        "maxrss_kb": me.ru_maxrss,
    }


def append_stats(
    stats_file: str, outcome: str, entry: Mapping[str, Any], container_id: str, kind: str = ""
) -> None:
    """One small line per delete for ``runc-guardctl metrics`` to aggregate (no daemon).

    The container id lets a reader (a test on a shared lab) pick its own lines.
    ``kind``: MEMCG_LINE for a line that is not a delete's (metrics counts only its memory).
    """
    line = cjson.dumps(
        {
            **({"kind": kind} if kind else {}),
            "time": round(time.time(), 3),
            "container_id": container_id,
            "outcome": outcome,
            "waited_ms": entry.get("waited_ms", 0),
            "removed": entry.get("removed", 0),
            "killed": len(entry.get("stragglers_killed", ())),
            "cpu_ms": entry.get("cpu_ms", 0),
            # wall time from the process's start (or containerd's budget's), and the runtime's share
            "total_ms": entry.get("total_ms", 0),
            "runtime_ms": entry.get("runtime_ms", 0),
            # memory cgroups: KiB reclaimed before their rmdir, and how many were left charged (dying)
            "reclaimed_kb": entry.get("memcg_reclaimed_kb", 0),
            "memcg_left": len(entry.get("memcg_unreclaimed", ())),
        }
    )
    append_line(stats_file, line + "\n", make_dirs=True, rotate_at=STATS_CAP_BYTES)
