"""structlog for the operator's tools: pure processors, one sink that writes to journald or a file.

``runc-guardctl`` commands that act on the node (the sweep) log one canonical
entry per run through structlog, whose last processor hands the event dict to
the reporter's sink (``reporter.send_entry``): the same journal fields as a
delete's entries (``container_id`` -> ``CONTAINER_ID``, ``EVENT``, ``PRIORITY``),
the same fallback file when journald is absent or refuses. Neither the shim, the
delete path nor the detached reporter import this module: structlog's import
costs ~50 ms of CPU, paid here once per command an operator or a timer runs.
Nothing is ever written to stdout.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import structlog

from runc_guard.reporter import send_entry


class Sink:
    """Final processor: journald first, then the JSON-lines file; always drops the event."""

    def __init__(self, journal_socket: str, log_file: str) -> None:
        self.target = (journal_socket, log_file)

    def __call__(self, _logger: object, _name: str, event_dict: MutableMapping[str, Any]) -> Any:
        send_entry(event_dict, self.target)
        raise structlog.DropEvent


def operator_logger(journal_socket: str, log_file: str, log_level: str = "info", **context: object) -> Any:
    """A bound logger whose entries carry a level and an RFC 3339 UTC timestamp, as a delete's do."""
    return structlog.wrap_logger(
        None,
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%Y-%m-%dT%H:%M:%S.%fZ", utc=True),
            Sink(journal_socket, log_file),
        ],
        # structlog's filtering logger compares the stdlib's level numbers.
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(log_level.upper(), logging.INFO)
        ),
        cache_logger_on_first_use=False,
    ).bind(**context)
