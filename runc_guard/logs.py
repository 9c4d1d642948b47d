"""structlog set-up: pure processors, one sink that writes to journald or a JSON-lines file.

Event names are fixed strings (``delete``, ``state_unreadable`` ...); facts go in
keys. The sink maps keys to journal fields (``container_id`` ->
``CONTAINER_ID``) so ``journalctl CONTAINER_ID=<id>`` finds every entry of a
container. If journald is absent or refuses, the entry goes to ``log_file``
instead; if that fails too it is dropped. Nothing is ever written to stdout.
"""

from __future__ import annotations

import json
import os
from collections.abc import MutableMapping
from typing import Any

import structlog

from runc_guard import journal

_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


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
        if not journal.send(journal_fields(event_dict), self.journal_socket):
            self._append_file(event_dict)
        raise structlog.DropEvent

    def _append_file(self, event_dict: MutableMapping[str, Any]) -> None:
        line = json.dumps(dict(event_dict), default=str, sort_keys=True) + "\n"
        try:
            os.makedirs(os.path.dirname(self.log_file), mode=0o755, exist_ok=True)
            fd = os.open(self.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError:
            pass  # no journald and no writable file: logging must not fail the delete


def make_logger(journal_socket: str, log_file: str, log_level: str, **context: Any) -> Any:
    """A bound logger whose entries all carry ``context`` (e.g. container_id, runtime)."""
    logger = structlog.wrap_logger(
        None,
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
            Sink(journal_socket, log_file),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(log_level, 20)),
        cache_logger_on_first_use=False,
    )
    return logger.bind(**context)
