"""Hold a container's large memory cgroup aside, to be reclaimed after the reply (cgroup v1 only).

delete.reclaim reclaims what fits in the delete's 0.1 s before the rmdir. A
larger or dirtier page cache (a container that wrote a GiB of log) would cost
the reply seconds; removed as it is, its memcg stays dying until the kernel's
own reclaim gets to those pages. On cgroup v1 the directory can instead be
renamed within its parent (cgroup1_rename: same parent only; cgroup2 has no
rename at all): the runtime's own rmdir then finds ENOENT, which every
runtime's RemovePath treats as done, and the finisher reclaims the held memcg
after the reply, paced, then removes it (node.late_reclaim).

The record is written before the rename and dropped if the rename fails, so a
crash between the two loses nothing: the finisher (or the sweep) finds either
the held directory or, if the rename never happened, the original one gone
with the runtime's delete and nothing to do.

Only an empty memory cgroup of the container's own (the caller proved both) is
held, never a systemd unit's (``.scope``/``.slice``: systemd owns and may
re-create those) nor one inside a scope, and only when a finisher will run. Empty includes what is
below it: the kernel renames a v1 directory with its child cgroups inside
(cgroup1_rename has no child check), which would hide them, and a process in
them, from the runtime's RemovePath (ENOENT: done) and from every look after
(issue 42); :func:`occupied` is looked at again right before the rename.
Stdlib only.
"""

from __future__ import annotations

import binascii
import os
import time

from runc_guard.atomic import json_records, read_trusted_json, write_json_record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

#: ``<cache_dir>/memcg-held``: in /run, as cgroups do not outlive a boot.
HELD_DIR = "memcg-held"
#: The held directory's name: this prefix and the original's, beside it. A dot-name, so
#: nothing that lists containers by their ids takes it for one.
PREFIX = ".runc-guard-held."
MAX_RECORD_BYTES = 64 << 10
NAME_MAX = 255

#: Systemd units' cgroups: systemd creates, watches and removes them itself.
UNIT_SUFFIXES = (".scope", ".slice")


def held_dir(cache_dir: str) -> str:
    return os.path.join(cache_dir, HELD_DIR)


def held_name(path: str) -> str | None:
    """The held directory's path for ``path`` (its sibling); None when no such name fits.

    Nor inside a scope (crun's systemd ``<scope>/container`` leaf): the held name would sit
    in the unit's cgroup, which systemd removes with the unit and the delete removes next.
    """
    base = os.path.basename(os.path.normpath(path))
    if not base or base.startswith(PREFIX) or base.endswith(UNIT_SUFFIXES) or len(PREFIX + base) > NAME_MAX:
        return None
    parent = os.path.dirname(os.path.normpath(path))
    if os.path.basename(parent).endswith(".scope"):
        return None
    return os.path.join(parent, PREFIX + base)


def record_file(cache_dir: str, held: str) -> str:
    """``<crc32 of the held path>-<its name>.json`` (no hashlib on the delete path: its import costs
    ~5 ms); :func:`hold` never overwrites a record another held path owns."""
    crc = binascii.crc32(held.encode("utf-8", "surrogateescape"))
    return os.path.join(held_dir(cache_dir), f"{crc:08x}-{os.path.basename(held)[:200]}.json")


def occupied(path: str) -> bool:
    """A process or a child cgroup in the cgroup directory ``path`` (or it cannot be read: as good as one)."""
    try:
        with open(os.path.join(path, "cgroup.procs"), "rb") as f:
            if f.read().strip():
                return True
        with os.scandir(path) as entries:
            return any(entry.is_dir(follow_symlinks=False) for entry in entries)
    except OSError:
        return True


def hold(path: str, cache_dir: str, container_id: str, runtime_root: str, reason: str) -> str | None:
    """Record, then rename the empty memory cgroup ``path`` aside; the held path, or None (not held).

    None leaves ``path`` exactly as it was: the runtime removes it as it would alone.
    """
    held = held_name(path)
    if held is None or not os.path.exists(os.path.join(path, "memory.usage_in_bytes")):
        return None  # cgroup2 (no rename), or not a memory cgroup
    if occupied(path):
        return None  # the rename would take a child cgroup (and any process in it) out of every view
    record = record_file(cache_dir, held)
    if os.path.lexists(record):
        return None  # another held memcg's record of that name (or this one's, held already)
    doc = {
        "container_id": container_id,
        "runtime_root": runtime_root,
        "original": path,
        "held": held,
        "reason": reason,
        "created": round(time.time(), 3),
    }
    if not write_json_record(record, doc):
        return None
    try:
        os.rename(path, held)
    except OSError:
        drop(record)
        return None
    return held


def read_held(path: str) -> dict[str, str | float] | None:
    """One record as :func:`hold` wrote it; None when unusable. Input: the finisher re-checks every path."""
    doc = read_trusted_json(path, MAX_RECORD_BYTES)
    strings = ("container_id", "runtime_root", "original", "held", "reason")
    if doc is None or not all(isinstance(doc.get(k), str) for k in strings):
        return None
    created = doc.get("created")
    if not isinstance(created, (int, float)):
        return None
    return {**{k: str(doc[k]) for k in strings}, "created": float(created)}


def iter_held(cache_dir: str) -> Iterator[tuple[str, dict[str, str | float] | None]]:
    """Every held-memcg record file and its content (None when unusable), by name."""
    for path in json_records(held_dir(cache_dir)):
        yield path, read_held(path)


def drop(record: str) -> None:
    try:
        os.unlink(record)
    except FileNotFoundError:
        pass
