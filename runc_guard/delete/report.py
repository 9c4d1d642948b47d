"""Report after replying: a delete's entries go to a spool, a detached reporter sends them.

containerd's shim waits for the runtime's exit status; the canonical entry is
for an operator, later. So the delete path collects its entries as plain dicts
(``EventLog``, no structlog on containerd's critical path), writes them into one
spool file (tmpfs, atomic rename) before it exits, and forks a reporter that
leaves the caller's session and stdio before the status is returned. The
reporter (``logs.drain_spool``) renders them through structlog to journald.

One reporter drains for everybody: a reporter that cannot take the spool's
lock exits at once, the one holding it lingers for more entries and re-checks
after it lets go. An entry is unlinked only after it was sent, so a reporter
killed mid-way loses nothing (the next reporter, or ``runc-guardctl sweep``,
sends it; at worst twice). Stdlib only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from runc_guard.spool import try_lock, write_spool

TYPE_CHECKING = False
if TYPE_CHECKING:
    from runc_guard.settings import Settings

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


def _timestamp() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


class EventLog:
    """structlog's call shape (``log.warning("event", key=value)``), collected, not sent.

    Entries below ``log_level`` are dropped here, as structlog's filtering logger
    would; ``bind`` makes a child with more context that shares the entry list.
    """

    def __init__(self, log_level: str = "info", context: Mapping[str, object] | None = None) -> None:
        self.min_level = _LEVELS.get(log_level, 20)
        self.entries: list[dict[str, object]] = []
        self.context = dict(context or {})

    def bind(self, **context: object) -> EventLog:
        child = EventLog(context={**self.context, **context})
        child.min_level, child.entries = self.min_level, self.entries
        return child

    def _add(self, level: str, event: str, fields: Mapping[str, object]) -> None:
        if _LEVELS[level] >= self.min_level:
            entry: dict[str, object] = {**self.context, **fields, "event": event}
            entry.update(level=level, timestamp=_timestamp())
            self.entries.append(entry)

    def debug(self, event: str, **fields: object) -> None:
        self._add("debug", event, fields)

    def info(self, event: str, **fields: object) -> None:
        self._add("info", event, fields)

    def warning(self, event: str, **fields: object) -> None:
        self._add("warning", event, fields)

    def error(self, event: str, **fields: object) -> None:
        self._add("error", event, fields)


def detach_reporter(directory: str, linger: float) -> int:
    """Fork a reporter that drains ``directory`` (then waits ``linger`` s for more); returns its pid.

    0 if fork failed: the entries wait in the spool for the next reporter or sweep.

    The child leaves the caller's session (a kill of containerd's shim or of
    our process group does not reach it) and closes every inherited fd first:
    go-runc waits until the runtime's stdout/stderr pipes close, and a held
    flock (the per-id claim) must not outlive this process.
    """
    try:
        ready_r, ready_w = os.pipe()
        pid = os.fork()
    except OSError:
        return 0
    if pid:
        # Return (and so exit) only once the child has its own session: a kill of our
        # process group right after the caller has our status must not reach it.
        os.close(ready_w)
        os.read(ready_r, 1)
        os.close(ready_r)
        return pid
    status = 0
    try:
        os.setsid()
        os.close(ready_r)
        os.close(ready_w)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, _max_fd())
        import signal

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        lock = try_lock(directory)
        if lock is not None:  # else a reporter is draining: it will find our entries
            from runc_guard.logs import drain_spool

            drain_spool(directory, linger, held=lock)
    except BaseException:  # noqa: BLE001 - a detached child must never return into the caller's code
        status = 1
    os._exit(status)


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (OSError, ValueError):
        return 1024


def deliver(log: EventLog, settings: Settings, directory: str) -> None:
    """Spool this delete's entries and leave the sending to a detached reporter.

    The verdict is final and stderr/``--log``/the stats line are written: what
    is left is for an operator, not for containerd. No spool (full or
    read-only /run): send now, on the caller's time, rather than lose them.
    """
    if not log.entries:
        return
    sink = {"journal_socket": settings.journal_socket, "log_file": settings.log_file}
    try:
        write_spool(directory, log.entries, sink)
    except OSError:
        try:
            from runc_guard.logs import send_entries

            send_entries(log.entries, (settings.journal_socket, settings.log_file))
        except Exception:  # noqa: BLE001 - logging never changes the status
            pass
        return
    detach_reporter(directory, settings.reporter_linger)
