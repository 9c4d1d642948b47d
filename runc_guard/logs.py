"""structlog set-up: pure processors, one sink that writes to journald or a JSON-lines file.

The delete path does not import this module: it spools its entries
(``runc_guard.delete.report``) and a detached reporter sends them from here, off
containerd's critical path. Event names are fixed strings (``delete``, ``state_unreadable`` ...); facts go in
keys. The sink maps keys to journal fields (``container_id`` ->
``CONTAINER_ID``) so ``journalctl CONTAINER_ID=<id>`` finds every entry of a
container. If journald is absent or refuses, the entry goes to ``log_file``
instead; if that fails too it is dropped. Nothing is ever written to stdout.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import MutableMapping
from typing import Any

import structlog

from runc_guard import journal
from runc_guard.atomic import append_line
from runc_guard.spool import keep_only_stdio_and, pending_files, read_spooled, step_back, try_lock

#: How long the reporter lets a full journald keep it per entry before it uses the file.
JOURNAL_WAIT = 2.0
#: How long a reporter waits for more entries before it exits (a storm shares one).
LINGER = 2.0
POLL = 0.02

_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}


def _message(event_dict: MutableMapping[str, Any]) -> str:
    """A human line for ``journalctl`` without ``-o json``: event, then the key facts."""
    parts = [str(event_dict.get("event", ""))]
    for key in ("container_id", "outcome", "waited_ms", "reason"):
        if key in event_dict and event_dict[key] not in (None, ""):
            parts.append(f"{key}={event_dict[key]}")
    return " ".join(parts)


def journal_fields(event_dict: MutableMapping[str, Any]) -> dict[str, object]:
    """Pure: the journald entry for one event dict."""
    fields: dict[str, object] = {
        "MESSAGE": _message(event_dict),
        "PRIORITY": _PRIORITY.get(str(event_dict.get("level", "info")), 6),
        "SYSLOG_IDENTIFIER": journal.IDENTIFIER,
    }
    for key, value in event_dict.items():
        if key in ("level",):
            continue
        name = "EVENT" if key == "event" else key
        fields[name] = value if isinstance(value, str | int | float) else json.dumps(value, default=str)
    return fields


class Sink:
    """Final processor: journald first, then the JSON-lines file; always drops the event."""

    def __init__(self, journal_socket: str, log_file: str) -> None:
        self.journal_socket = journal_socket
        self.log_file = log_file

    def __call__(self, _logger: object, _name: str, event_dict: MutableMapping[str, Any]) -> Any:
        if not journal.send(journal_fields(event_dict), self.journal_socket, wait=JOURNAL_WAIT):
            self._append_file(event_dict)
        raise structlog.DropEvent

    def _append_file(self, event_dict: MutableMapping[str, Any]) -> None:
        line = json.dumps(dict(event_dict), default=str, sort_keys=True) + "\n"
        append_line(self.log_file, line, 0o640, make_dirs=True)  # neither: the entry is dropped


def _sink_logger(journal_socket: str, log_file: str) -> Any:
    """A logger that sends entries as they are: the delete already stamped and filtered them."""
    return structlog.wrap_logger(
        None,
        processors=[Sink(journal_socket, log_file)],
        wrapper_class=structlog.make_filtering_bound_logger(0),
        cache_logger_on_first_use=False,
    )


def send_entries(
    entries: object, target: tuple[str, str], loggers: dict[tuple[str, str], Any] | None = None
) -> int:
    """Send entries collected by ``report.EventLog`` to (journal socket, fallback file)."""
    loggers = {} if loggers is None else loggers
    sent = 0
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict):
            if target not in loggers:
                loggers[target] = _sink_logger(*target)
            fields = dict(entry)
            event = str(fields.pop("event", "event"))
            loggers[target].info(event, **fields)
            sent += 1
    return sent


def send_spooled(path: str, loggers: dict[tuple[str, str], Any]) -> int:
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
    sent = send_entries(entries, target, loggers)
    try:
        os.unlink(path)
    except OSError:
        pass
    return sent


def reporter_main(directory: str, linger: float, held: int) -> None:
    """The detached reporter (``delete.report.detach_reporter`` starts it in a session of its own).

    ``held`` is the spool's lock, taken for it by the delete that started it.
    """
    keep_only_stdio_and(held)
    step_back()
    drain_spool(directory, linger, held=held)


def drain_spool(directory: str, linger: float = LINGER, poll: float = POLL, held: int | None = None) -> int:
    """Send every spooled entry, lingering ``linger`` s for more; returns how many were sent.

    Only one reporter drains at a time (flock). One that finds the lock held
    returns at once: the holder re-checks the spool after it lets go, so an
    entry spooled just before is never stranded. ``held``: the lock, already taken.
    """
    sent = 0
    loggers: dict[tuple[str, str], Any] = {}
    while True:
        lock = held if held is not None else try_lock(directory)
        held = None
        if lock is None:
            return sent
        try:
            idle_until = time.monotonic() + linger
            while True:
                files = pending_files(directory)
                for path in files:
                    sent += send_spooled(path, loggers)
                if files:
                    idle_until = time.monotonic() + linger
                elif time.monotonic() >= idle_until:
                    break
                else:
                    time.sleep(poll)
        finally:
            os.close(lock)
        if not pending_files(directory):
            return sent
