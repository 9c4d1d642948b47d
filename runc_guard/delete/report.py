"""Report after replying: a delete's entries go to a spool, a detached reporter sends them.

containerd's shim waits for the runtime's exit status; the canonical entry is
for an operator, later. So the delete path collects its entries as plain dicts
(``EventLog``, no structlog on containerd's critical path), writes them into one
spool file (tmpfs, atomic rename) before it exits, and, unless a reporter is
already running, spawns one in a session of its own with /dev/null for stdio.
The reporter (``reporter.reporter_main``) sends them to journald.

One reporter drains for everybody: it holds the spool's lock, lingers for more
entries and re-checks after it lets go, so a delete that finds the lock held
starts none. An entry is unlinked only after it was sent, so a reporter
killed mid-way loses nothing (the next reporter, or ``runc-guardctl sweep``,
sends it; at worst twice). Stdlib only.
"""

from __future__ import annotations

import os
import time

from runc_guard.spool import HOME_ENV, helper_home, lower_priority, try_lock, write_spool

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

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


#: The reporter's program: a fresh interpreter, runc-guard found where this process found it.
_REPORTER = (
    "import sys; sys.path.insert(0, sys.argv[1]); from runc_guard.reporter import reporter_main;"
    " from runc_guard.delete.stepaside import take; reporter_main(sys.argv[2], float(sys.argv[3]), 3, take)"
)
#: The fd a detached helper finds its lock on, already taken for it.
_LOCK_FD = 3


def _helper_argv(program: str, args: list[str]) -> list[str]:
    """``python -I[S] -c program <root> args...``: a fresh interpreter finding runc-guard where this one did.

    The reporter needs only the stdlib and runc-guard (``<root>`` goes first on its path), so
    it skips ``site`` (~2.5 ms of CPU: .pth files, a venv's hooks), as the Python entry does;
    the finisher loads psutil and tenacity from the site's packages.
    """
    import sys

    import runc_guard

    root = os.path.dirname(os.path.dirname(os.path.abspath(runc_guard.__file__)))
    return [sys.executable, "-IS" if program == _REPORTER else "-I", "-c", program, root, *args]


def spawn_detached(program: str, args: list[str], lock: int) -> int:
    """Start ``python -I -c program <root> args...`` in a session of its own; its pid (0: not started).

    It inherits ``lock`` (a flock the caller took for it) as fd 3, the caller's copy
    closed here. posix_spawn: no copy of this process and no wait for the child to
    be scheduled; in a session of its own, so a kill of containerd's shim or of our
    process group does not reach it; /dev/null for stdio, since go-runc waits
    until the runtime's stdout/stderr pipes close; below every runtime while its
    interpreter starts (spool.lower_priority).
    """
    import sys

    argv = _helper_argv(program, args)
    environ = dict(os.environ)
    home = helper_home(os.getpid())  # found now, while our ancestry is still there (spool.step_back)
    if home:
        environ[HOME_ENV] = home  # else the helper looks from its own ancestry
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        actions = [(os.POSIX_SPAWN_DUP2, null, fd) for fd in (0, 1, 2)]
        actions.append((os.POSIX_SPAWN_DUP2, lock, _LOCK_FD))
        if not sys.executable:
            return 0
        pid = os.posix_spawn(sys.executable, argv, environ, file_actions=actions, setsid=True)
        lower_priority(pid)
        return pid
    except OSError:
        return 0
    finally:
        os.close(null)
        os.close(lock)  # the child's copy keeps the flock (one open file description)


def detach_reporter(directory: str, linger: float) -> int:
    """Start a reporter for ``directory`` unless one is running; returns its pid (0: none started).

    A reporter already holding the spool's lock re-checks the spool after it lets
    go, so it sends our entries too: in a crash storm one reporter serves them all
    and structlog is loaded once. Otherwise we take the lock and hand it to a
    reporter we spawn. If it cannot be started the entries wait in the spool for
    the next reporter or ``runc-guardctl sweep``.
    """
    lock = try_lock(directory)
    if lock is None:
        return 0
    return spawn_detached(_REPORTER, [directory, repr(linger)], lock)


#: The finisher's program (runc_guard.node.finisher_process): it reads the settings from the environment.
_FINISHER = (
    "import sys; sys.path.insert(0, sys.argv[1]); from runc_guard.node.finisher_process import finisher_main;"
    " finisher_main(3)"
)
#: The finisher's lock, under the cache directory: one finisher serves every delete of a storm.
FINISHER_LOCK = "finisher.lock"


def detach_finisher(cache_dir: str) -> int:
    """Start the finisher unless one is running; returns its pid (0: none started).

    For a delete whose deadline cut it short (its record kept): the finisher
    completes it after the reply (runc_guard.node.finisher). One already running
    looks at every pending record, ours included, before it exits.
    """
    lock = try_lock(cache_dir, FINISHER_LOCK)
    if lock is None:
        return 0
    return spawn_detached(_FINISHER, [], lock)


def exec_helper(args: list[str]) -> int:
    """Become the helper the launcher started through the Python entry (launcher/runc-guard.c), its lock
    on fd 3: ``["finisher"]`` or ``["reporter", <spool>, <linger>]``. The same fresh interpreter
    and program as :func:`spawn_detached` starts; returns only when ``args`` name no helper (exit 78)."""
    import sys

    programs = {("finisher", 1): _FINISHER, ("reporter", 3): _REPORTER}
    program = programs.get((args[0], len(args))) if args else None
    if program is None or not sys.executable:
        sys.stderr.write(f"runc-guard: not a helper: {args!r}\n")
        return 78
    os.execv(sys.executable, _helper_argv(program, args[1:]))


def deliver(log: EventLog, settings: Settings, directory: str) -> None:
    """Spool this delete's entries and leave the sending to a detached reporter.

    The verdict is final and stderr/``--log``/the stats line are written: what
    is left is for an operator, not for containerd, and must not delay its
    reply. No spool (full or read-only /run): the entries go straight to the
    fallback file as JSON lines, the format the reporter writes there when
    journald is absent; where even that fails they are counted as lost
    (``<cache_dir>/lost-entries``, one byte each, for the metrics). Never
    journald inline: its waits (up to 2 s an entry) and structlog's import
    would run on containerd's time.
    """
    if not log.entries:
        return
    sink = {"journal_socket": settings.journal_socket, "log_file": settings.log_file}
    try:
        write_spool(directory, log.entries, sink)
    except OSError:
        _fallback(log.entries, settings)
        return
    detach_reporter(directory, settings.reporter_linger)


#: Where entries that could be neither spooled nor written are counted, under the cache directory.
LOST_ENTRIES = "lost-entries"


def _fallback(entries: list[dict[str, object]], settings: Settings) -> None:
    """Append the entries to the fallback file; count the ones that cannot be written."""
    from runc_guard import cjson
    from runc_guard.atomic import append_line

    lost = 0
    for entry in entries:
        try:
            line = cjson.dumps(entry, sort_keys=True)
        except (TypeError, ValueError):
            line = cjson.dumps({str(k): str(v) for k, v in entry.items()}, sort_keys=True)
        if not append_line(settings.log_file, line + "\n", 0o640, make_dirs=True):
            lost += 1
    if lost:
        append_line(os.path.join(settings.cache_dir, LOST_ENTRIES), "x" * lost, 0o600, make_dirs=True)
