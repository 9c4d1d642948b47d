"""Reclaim the memory cgroups deletes held aside (delete.memcg_hold) after their reply, paced; remove them.

A held memcg is a container's own, empty, renamed within its parent on cgroup v1
because its page cache was too large or too dirty to reclaim on the reply's
time. The finisher calls :func:`step` on each held record once per pass (every
POLL s at most): one step reclaims at most STEP bytes, so the reclaim's CPU is
paced, and only cold page cache, never by swap, through delete.reclaim's
bounded requests (reclaim_cold: a lowered limit; force_empty only for a tiny
clean rest). Page cache on the active list (more than ACTIVE_SLACK) is in use,
maybe by a running container: once nothing cold is left the memcg is removed
with it, as the runtime alone would; dirty pages are left to the kernel's
flusher (runc-guard adds no I/O of its own: the flusher writes them back
within ``dirty_expire_centisecs`` as it would have anyway),
and nothing is done while PSI says the node waits on its memory or its disk.
Once no page cache is charged, the directory is removed and the kernel frees
the memcg; after LATE_MAX it is removed as it is (dying, as the runtime alone
would have left it), and the entry says why.

Every record is input: the held path must be the original's sibling under the
held name, on a cgroup v1 hierarchy, not a symlink, with a memory controller.
A process or child cgroup in it (it was empty when held) is waited for and never
signalled. Stdlib only.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from runc_guard.delete.cgroupfs import CGROUP_SUPER_MAGIC
from runc_guard.delete.memcg_hold import PREFIX, drop, occupied
from runc_guard.delete.reclaim import (
    IO_PRESSURE,
    IO_PRESSURE_MAX,
    MAX_DIRTY,
    PAGE,
    RATE,
    V1,
    cache_of,
    forbid_swap,
    in_use,
    io_pressure,
    page_cache,
    read_int,
    reclaim_cold,
    reclaimable,
)
from runc_guard.libc import statfs_type

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

#: At most this much page cache reclaimed per step (per held memcg, per finisher pass).
STEP = 128 << 20
#: A held memcg is removed this long after it was held, reclaimed or not.
LATE_MAX = 120.0
#: PSI's ``some avg10`` for memory (percent) above which no step runs: the kernel is reclaiming
#: already, and a step would compete with it for the same CPU and locks.
MEMORY_PRESSURE_MAX = 10.0
MEMORY_PRESSURE = "/proc/pressure/memory"


@dataclass
class Step:
    """What one step did: ``done`` (the record is dropped), bytes reclaimed, page cache left, why it waits
    or why it was removed charged (``""``: freed)."""

    done: bool
    reclaimed: int = 0
    left: int = 0
    why: str = ""


def _usage(held: str) -> tuple[int, int, int] | None:
    """(usage, page cache, of which dirty or under writeback) in bytes; None: unreadable (gone)."""
    usage, cache = read_int(os.path.join(held, "memory.usage_in_bytes")), page_cache(held, V1)
    if usage is None or cache is None:
        return None
    return usage, cache[0], cache[1]


def trusted(doc: Mapping[str, object], fs_type: Callable[[str], int] = statfs_type) -> str | None:
    """The record's held path when it is what :func:`delete.memcg_hold.hold` makes; else None."""
    original, held = doc.get("original"), doc.get("held")
    if not isinstance(original, str) or not isinstance(held, str) or not os.path.isabs(original):
        return None
    original = os.path.normpath(original)
    if held != os.path.join(os.path.dirname(original), PREFIX + os.path.basename(original)):
        return None
    try:
        if os.path.islink(held) or fs_type(os.path.dirname(held)) != CGROUP_SUPER_MAGIC:
            return None
    except OSError:
        return None
    return held


def _pressure(io: str, memory: str) -> str:
    stalled = io_pressure(memory)
    if stalled is not None and stalled > MEMORY_PRESSURE_MAX:
        return f"memory pressure (some avg10 {stalled:.0f}%)"
    stalled = io_pressure(io)
    if stalled is not None and stalled > IO_PRESSURE_MAX:
        return f"I/O pressure (some avg10 {stalled:.0f}%)"
    return ""


def step(
    record: str, doc: Mapping[str, object], *, final: bool = False, now: Callable[[], float] = time.time,
    io: str = IO_PRESSURE, memory: str = MEMORY_PRESSURE, fs_type: Callable[[str], int] = statfs_type,
    reparents: bool = False,
) -> Step:
    """One paced step on the held memcg ``doc`` names (``record``: its file, dropped when done).

    ``final``: the sweep's call, once: reclaim what can be reclaimed now, then remove it
    (charged or not) unless a process or child cgroup is in it. ``reparents``: the kernel moves a
    removed memcg's page cache to its parent (node.memcg_probe): removed at once, nothing reclaimed.
    """
    held = trusted(doc, fs_type)
    if held is None:
        if not os.path.lexists(str(doc.get("held", ""))):
            drop(record)  # gone (removed by hand, or the rename never happened): nothing to finish
            return Step(True, why="gone")
        return Step(False, why="not a held memory cgroup this finisher may touch")
    found = _usage(held)
    if found is None:
        if not os.path.lexists(held):
            drop(record)
            return Step(True, why="gone")
        return Step(False, why="memory.stat unreadable")
    _, cache, dirty = found
    if occupied(held):
        return Step(False, left=cache, why="a process or cgroup appeared in it")
    created = doc.get("created")
    late = final or not isinstance(created, (int, float)) or now() - float(created) >= LATE_MAX
    waits = _pressure(io, memory) or ("dirty pages waiting for writeback" if dirty > MAX_DIRTY else "")
    reclaimed = 0
    if reparents:
        cache, late, waits = 0, True, ""  # removed, its pages move to the parent: it is not left dying
    if cache and not waits:
        lru = cache_of(held, V1)
        if lru is not None and reclaimable(lru) < PAGE:
            waits, late = in_use(lru), True  # nothing cold: what is left is in use, it stays as it is
        else:
            waits = forbid_swap(held, V1)
        if not waits and lru is not None:
            # one STEP of cold page cache at most, in delete.reclaim's bounded requests
            budget = min(STEP, reclaimable(lru))
            result = reclaim_cold(held, V1, budget, time.monotonic() + 2 * budget / RATE + 0.1)
            after = _usage(held)
            if after is not None:
                reclaimed = max(0, cache - after[1])
                cache = after[1]
            waits = result.skipped if cache else ""
    if cache and not late:
        return Step(False, reclaimed, cache, waits or "reclaiming")
    try:
        os.rmdir(held)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return Step(False, reclaimed, cache, f"rmdir: {os.strerror(exc.errno or 0)}")
    drop(record)
    return Step(True, reclaimed, cache, (waits or "not reclaimed in time") if cache else "")
