"""Records dated ahead of the clock: the sweep re-stamps them to now, audit calls them a problem.

Pending, aside and held-memcg records carry ``created``: the wall clock when a
delete wrote them. A clock stepped back after the write (or wrong at the write,
then corrected) dates a record in the future, and whatever waits for a record to
age would wait until the clock caught up, for a clock wrong by years for good and
unseen: the sweep's take-over of a held memcg (node.host.finish_held), audit's
stale pending and held records. How old such a record really is cannot be known,
so it ages from when runc-guard first saw it ahead: the sweep rewrites its
``created`` to now (the date as written kept in ``restamped``) and says so in its
entry, which makes the record the sweep's one threshold later like any other;
until then audit lists it, calls it a problem and counts it.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from runc_guard import cjson
from runc_guard.atomic import json_records, read_trusted_json
from runc_guard.delete.aside import MAX_ASIDE_BYTES, aside_dir
from runc_guard.delete.memcg_hold import MAX_RECORD_BYTES as MAX_HELD_BYTES
from runc_guard.delete.memcg_hold import held_dir
from runc_guard.delete.pending import CLAIMED, MAX_RECORD_BYTES, Claim, RecordRule, iter_records
from runc_guard.invocation import valid_container_id
from runc_guard.libc import exchange

#: A record dated more than this ahead of the clock is "ahead": ``created`` is rounded to the
#: millisecond, and a step this small delays nothing that matters.
AHEAD_SLACK = 1.0

PENDING, ASIDE, HELD = "pending", "aside", "held"


def ahead(created: object, now: float) -> float | None:
    """Seconds ``created`` lies ahead of ``now`` (beyond AHEAD_SLACK), or None when it does not.

    A date that is no finite number is "ahead" too (``inf``): nothing can age from it.
    Anything that is not a number at all is another reader's problem (unusable record).
    """
    if isinstance(created, bool) or not isinstance(created, int | float):
        return None
    if not math.isfinite(created):
        return math.inf
    step = float(created) - now
    return step if step > AHEAD_SLACK else None


def aged(created: object, now: float) -> dict[str, float | None]:
    """``age_seconds`` as audit reports it, and ``dated_ahead_seconds`` for a record dated ahead.

    A record dated ahead counts as just written (age 0), never as negative: its
    real age is unknown until the sweep re-stamps it (``dated_ahead_seconds`` None: no finite date).
    """
    step = ahead(created, now)
    if step is not None:
        return {"age_seconds": 0.0, "dated_ahead_seconds": round(step, 1) if math.isfinite(step) else None}
    if isinstance(created, bool) or not isinstance(created, int | float):
        return {}
    return {"age_seconds": round(max(0.0, now - float(created)), 1)}


def restamped(doc: Mapping[str, object], now: float) -> dict[str, object]:
    """``doc`` dated ``now``, with the date as first written and this step kept in ``restamped``."""
    created = doc.get("created")
    before = doc.get("restamped")
    written = before.get("written") if isinstance(before, dict) else created
    step = ahead(created, now)
    return {
        **doc,
        "created": round(now, 3),
        "restamped": {
            "written": written if isinstance(written, int | float) and math.isfinite(written) else None,
            "at": round(now, 3),
            "ahead_s": round(step, 3) if step is not None and math.isfinite(step) else None,
        },
    }


# -- replacing a record without ever bringing one back ---------------------------------

def replace_existing(path: str, data: bytes) -> bool:
    """Put ``data`` at ``path`` only if a file is there now; False when it is gone.

    A plain write-and-rename would bring back a record that its finisher or a delete
    removed between our read and our write; an exchange of names needs both, so a
    record removed meanwhile stays removed (and the old content goes with our temp file).
    """
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.restamp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        exchange(tmp, path)
        return True
    except FileNotFoundError:
        return False
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


# -- the sweep's re-stamp ----------------------------------------------------------------


@dataclass(frozen=True)
class Restamp:
    """One record the sweep re-stamped (or, ``done`` False, could not: claimed, gone, unwritable)."""

    kind: str
    record: str
    container_id: str
    #: How far ahead of the clock it was dated (None: not a finite number).
    ahead_s: float | None
    done: bool
    why: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rewrite(kind: str, path: str, limit: int, clock: Callable[[], float]) -> Restamp | None:
    """Re-read ``path`` (ours only) and re-stamp it if it is still dated ahead; None when it is not."""
    doc = read_trusted_json(path, limit)
    if doc is None:
        return None
    now = clock()
    step = ahead(doc.get("created"), now)
    if step is None:
        return None
    cid = str(doc.get("container_id", ""))
    shown = _shown(step)
    try:
        done = replace_existing(path, cjson.dumps(restamped(doc, now), sort_keys=True).encode())
    except OSError as exc:
        return Restamp(kind, path, cid, shown, False, f"cannot rewrite: {exc.strerror}")
    return Restamp(kind, path, cid, shown, done, "" if done else "gone meanwhile")


def _claimed(
    pending_dir: str, root: str, cid: str, act: Callable[[], Restamp | None], left: Restamp,
) -> Restamp | None:
    """``act`` while this sweep holds the container's claim (pending.Claim): no delete or finisher
    writes or removes its records meanwhile. A claim someone holds: ``left``, for the next sweep."""
    if not valid_container_id(cid) or not os.path.isabs(root):
        return None  # nothing a delete would ever claim: audit lists it, nothing is written
    with Claim(pending_dir, root, cid, time.monotonic()) as held:
        if held == CLAIMED:
            return act()
    return Restamp(left.kind, left.record, cid, left.ahead_s, False, f"claim {held}: left for the next sweep")


def _shown(step: float | None) -> float | None:
    return round(step, 3) if step is not None and math.isfinite(step) else None


def restamp_records(
    pending_dir: str, cache_dir: str, rule: RecordRule, now: Callable[[], float] = time.time,
) -> list[Restamp]:
    """Every pending, aside and held-memcg record dated ahead of ``now()``, re-stamped to it.

    Pending records are the trusted ones (``rule``); aside records those runc-guard wrote;
    both under their container's claim. Held records have no claim: the exchange alone keeps
    one a finisher just dropped from coming back, and a finisher that saw one gives it up
    HELD_GIVE_UP s after it first saw it, no later than the sweep takes it over.
    """
    done: list[Restamp] = []
    for path, record in iter_records(pending_dir, rule):
        if isinstance(record, ValueError) or (step := ahead(record.created, now())) is None:
            continue
        act = functools.partial(_rewrite, PENDING, path, MAX_RECORD_BYTES, now)
        left = Restamp(PENDING, path, record.container_id, _shown(step), False)
        found = _claimed(pending_dir, record.runtime_root, record.container_id, act, left)
        if found is not None:
            done.append(found)
    for path, doc in _docs(aside_dir(cache_dir), MAX_ASIDE_BYTES):
        if (step := ahead(doc.get("created"), now())) is None:
            continue
        act = functools.partial(_rewrite, ASIDE, path, MAX_ASIDE_BYTES, now)
        root, cid = str(doc.get("runtime_root", "")), str(doc.get("container_id", ""))
        found = _claimed(pending_dir, root, cid, act, Restamp(ASIDE, path, cid, _shown(step), False))
        if found is not None:
            done.append(found)
    for path, doc in _docs(held_dir(cache_dir), MAX_HELD_BYTES):
        if ahead(doc.get("created"), now()) is not None:
            found = _rewrite(HELD, path, MAX_HELD_BYTES, now)
            if found is not None:
                done.append(found)
    return done


def _docs(directory: str, limit: int) -> Iterator[tuple[str, dict[str, Any]]]:
    for path in json_records(directory):
        doc = read_trusted_json(path, limit)
        if doc is not None:
            yield path, doc
