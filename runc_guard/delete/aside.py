"""Aside records: what a delete that stepped aside left behind, kept visible for audit.

A delete steps aside when it cannot prove the cgroups are the container's own,
cannot read a fact (an init's liveness), meets a process that is not the
container's, or starts on an overloaded node: the runtime then acts alone, as if
runc-guard were not there. Whatever that leaves must not vanish silently, but it
must not be finished as a pending record either (nothing proved it ours), so it
goes here, beside the pending records: ``audit`` lists these, and the sweep
judges the cgroups by its own rules and drops a record once nothing it names is left.
"""

from __future__ import annotations

import os
import time

from runc_guard.atomic import json_records, read_trusted_json, write_json_record
from runc_guard.delete.bounds import MAX_ASIDE_RECORDS, crowded, drop_oldest, unlink_all
from runc_guard.delete.pending import record_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

#: ``<cache_dir>/aside``: in /run, as cgroups do not outlive a boot.
ASIDE_DIR = "aside"
MAX_ASIDE_BYTES = 1 << 20


def aside_dir(cache_dir: str) -> str:
    return os.path.join(cache_dir, ASIDE_DIR)


#: ``kind`` of an aside record written at start-up overload: nothing was judged, only the
#: load was too high. The finisher may finish these (node.finisher); every other kind means
#: runc-guard could not prove something, and only the sweep's own rules act on it.
OVERLOAD = "overload"
#: ``kind`` of a CRI sandbox's dead sibling, recorded by the sandbox's delete so that its reply
#: never waits on the sibling: the finisher runs the sibling's own delete after that reply.
SIBLING = "sibling"


def write_aside(
    cache_dir: str, runtime_root: str, container_id: str, cgroup_paths: list[str], reason: str,
    kind: str = "unsure", runtime: str = "", extra: Mapping[str, object] | None = None,
) -> str | None:
    """Record a stepped-aside delete's leftovers; the file's path, or None if it cannot be written.

    Best effort and small: the delete's own entry already says it stepped aside.
    ``cgroup_paths`` may be empty when the delete stepped aside before reading any
    state (start-up overload): audit then looks the id up itself. ``runtime``: the
    runtime it ran alone, for a finisher that re-runs its delete; ``extra``: what a
    kind needs besides (a sibling's sandbox, argv and init).
    """
    path = record_path(aside_dir(cache_dir), runtime_root, container_id)
    doc = {
        "container_id": container_id,
        "runtime_root": runtime_root,
        "cgroup_paths": cgroup_paths,
        "reason": reason,
        "kind": kind,
        "runtime": runtime,
        "created": round(time.time(), 3),
        **(extra or {}),
    }
    if not write_json_record(path, doc):
        return None
    if crowded(os.path.dirname(path)):  # /run stays bounded without the sweep's timer (delete.bounds)
        prune_aside(cache_dir)
        drop_oldest(os.path.dirname(path), MAX_ASIDE_RECORDS, ".json")
    return path


def read_aside(path: str) -> dict[str, object] | None:
    """One aside record as written by :func:`write_aside`; None when unusable (never trusted)."""
    doc = read_trusted_json(path, MAX_ASIDE_BYTES)
    if doc is None or not isinstance(doc.get("container_id"), str):
        return None
    paths = doc.get("cgroup_paths")
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        return None
    return doc


def iter_aside(cache_dir: str) -> Iterator[tuple[str, dict[str, object] | None]]:
    """Every aside record file and its content (None when unusable), in name order."""
    for path in json_records(aside_dir(cache_dir)):
        yield path, read_aside(path)


def prune_aside(cache_dir: str, exists: Callable[[str], bool] = os.path.lexists) -> int:
    """Drop aside records whose cgroups are all gone (or, naming none, whose runtime state is); the count.

    For the sweep, so that /run does not fill with records of a node's crash loops.
    An unusable record is dropped too: audit has had its chance to report it.
    """
    done = []
    for path, doc in iter_aside(cache_dir):
        if doc is not None:
            listed = doc["cgroup_paths"]
            paths = [p for p in listed if isinstance(p, str)] if isinstance(listed, list) else []
            state_dir = os.path.join(str(doc.get("runtime_root", "")), str(doc["container_id"]))
            if any(exists(p) for p in paths) or (not paths and exists(state_dir)):
                continue
        done.append(path)
    return unlink_all(done)
