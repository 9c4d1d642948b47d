"""The detached reporter: send the spooled entries of deletes to journald, or to the fallback file.

A delete spools its entries (``runc_guard.delete.report``) and, unless one is
running, starts a reporter in a fresh interpreter after it has replied. The
entries are final by then (stamped and filtered by ``report.EventLog``), so
sending them is one pure mapping to journal fields and one datagram each; no
logging framework is loaded for it. That matters: on a node whose deletes come
one at a time every delete starts its own reporter, and structlog's import
alone (it loads asyncio, ssl and logging) cost ~50 ms of CPU, twice the delete's
own (docs/benchmarks.md). The operator's tools log through structlog
(``runc_guard.logs``), whose last processor is :func:`send_entry` here.
Stdlib only; ``json`` loads only for a value ``cjson`` cannot encode.
"""

from __future__ import annotations

import os
import time

from runc_guard import cjson, journal
from runc_guard.atomic import append_line
from runc_guard.spool import (
    HELPER_STAYED,
    STAYED_REASON,
    keep_only_stdio_and,
    note_once,
    pending_files,
    read_spooled,
    step_back,
    try_lock,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

#: How long the reporter lets a full journald keep it per entry before it uses the file.
JOURNAL_WAIT = 2.0
#: How long a reporter waits for more entries before it exits (a storm shares one).
LINGER = 2.0
POLL = 0.02
#: The launcher's step-asides in the spool (delete.stepaside): a ``take`` turns them into entries.
STEP_ASIDE_SUFFIX = ".aside"

_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}

#: Where an entry goes: (journal socket, fallback file).
Target = tuple[str, str]


def _dumps(value: object, sort_keys: bool = False) -> str:
    """``json.dumps(value, default=str, sort_keys=...)``; ``json`` itself only for what cjson refuses."""
    try:
        return cjson.dumps(value, sort_keys=sort_keys)
    except (TypeError, ValueError):
        import json

        return json.dumps(value, default=str, sort_keys=sort_keys)


def _message(entry: Mapping[str, object]) -> str:
    """A human line for ``journalctl`` without ``-o json``: event, then the key facts."""
    parts = [str(entry.get("event", ""))]
    for key in ("container_id", "outcome", "waited_ms", "reason"):
        if key in entry and entry[key] not in (None, ""):
            parts.append(f"{key}={entry[key]}")
    return " ".join(parts)


def journal_fields(entry: Mapping[str, object]) -> dict[str, object]:
    """Pure: the journald entry for one event dict."""
    fields: dict[str, object] = {
        "MESSAGE": _message(entry),
        "PRIORITY": _PRIORITY.get(str(entry.get("level", "info")), 6),
        "SYSLOG_IDENTIFIER": journal.IDENTIFIER,
    }
    for key, value in entry.items():
        if key == "level":
            continue
        name = "EVENT" if key == "event" else key
        fields[name] = value if isinstance(value, str | int | float) else _dumps(value)
    return fields


def send_entry(entry: Mapping[str, object], target: Target) -> bool:
    """journald first, then the JSON-lines file; False when neither took it (the entry is dropped)."""
    journal_socket, log_file = target
    if journal.send(journal_fields(entry), journal_socket, wait=JOURNAL_WAIT):
        return True
    line = _dumps(dict(entry), sort_keys=True) + "\n"
    return append_line(log_file, line, 0o640, make_dirs=True)


def send_entries(entries: object, target: Target) -> int:
    """Send entries collected by ``report.EventLog``; returns how many were handed to a sink."""
    sent = 0
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict):
            fields = dict(entry)
            event = str(fields.pop("event", "event"))
            send_entry({**fields, "event": event}, target)
            sent += 1
    return sent


def send_spooled(path: str) -> int:
    """Send one spool file's entries, then unlink it; returns how many were sent.

    A file that does not parse or is not ours (it cannot be half-written: it
    came by rename) is reported as ``spool_unreadable`` and removed, so it
    cannot stall the spool.
    """
    try:
        doc = read_spooled(path)
        sink, entries = doc["sink"], doc["entries"]
        if not isinstance(sink, dict):
            raise TypeError("sink is not a table")
        target = (str(sink["journal_socket"]), str(sink["log_file"]))
    except FileNotFoundError:
        return 0  # another reporter (a sweep) sent it
    except (OSError, ValueError, KeyError, TypeError) as exc:
        journal.send({"MESSAGE": f"spool_unreadable: {path}: {exc}", "PRIORITY": 3,
                      "SYSLOG_IDENTIFIER": journal.IDENTIFIER, "EVENT": "spool_unreadable"})
        entries, target = [], ("", "")
    sent = send_entries(entries, target)
    try:
        os.unlink(path)
    except OSError:
        pass
    return sent


def _step_asides(directory: str) -> bool:
    try:
        return any(n.endswith(STEP_ASIDE_SUFFIX) and not n.startswith(".") for n in os.listdir(directory))
    except OSError:
        return False


def reporter_main(directory: str, linger: float, held: int, take: Callable[[str], int] | None = None) -> None:
    """The detached reporter (``delete.report.detach_reporter`` starts it in a session of its own).

    ``held`` is the spool's lock, taken for it by the delete that started it; ``take``: as in drain_spool.
    """
    keep_only_stdio_and(held)
    if step_back() is None and note_once(directory, HELPER_STAYED):
        journal.send({"MESSAGE": f"helper_cgroup_unknown: reporter: {STAYED_REASON}", "PRIORITY": 4,
                      "SYSLOG_IDENTIFIER": journal.IDENTIFIER, "EVENT": "helper_cgroup_unknown"})
    drain_spool(directory, linger, held=held, take=take)


def drain_spool(
    directory: str, linger: float = LINGER, poll: float = POLL, held: int | None = None,
    take: Callable[[str], int] | None = None,
) -> int:
    """Send every spooled entry, lingering ``linger`` s for more; returns how many were sent.

    Only one reporter drains at a time (flock). One that finds the lock held
    returns at once: the holder re-checks the spool after it lets go, so an
    entry spooled just before is never stranded. ``held``: the lock, already taken.
    ``take``: under the lock, first turns the launcher's step-asides into entries
    (delete.stepaside.take: a leaf does not load the delete's writers itself).
    """
    sent = 0
    while True:
        lock = held if held is not None else try_lock(directory)
        held = None
        if lock is None:
            return sent
        try:
            idle_until = time.monotonic() + linger
            while True:
                if take is not None:
                    take(directory)
                files = pending_files(directory)
                for path in files:
                    sent += send_spooled(path)
                if files:
                    idle_until = time.monotonic() + linger
                elif time.monotonic() >= idle_until:
                    break
                else:
                    time.sleep(poll)
        finally:
            os.close(lock)
        if not pending_files(directory) and not (take is not None and _step_asides(directory)):
            return sent
