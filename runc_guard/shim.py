"""Entry point of ``runc-guard``, the binary containerd runs instead of runc.

Its whole command line belongs to the runtime; it has no flags of its own. Every
call that is not a ``delete`` of one container is exec'd into the real runtime
untouched. This module runs on every runtime call of every container, so it
imports only ``os``, ``sys`` and runc-guard's stdlib-only argv/settings/runtime
modules; the delete path loads the rest. It never writes to stdout, and writes
to stderr only when it cannot exec at all: go-runc reads ``state`` and ``ps``
output with stderr combined into stdout, so a stray warning would corrupt JSON.

A settings error never changes where a call goes: a file that no longer parses
routes by the last version that did (``settings_file.last_good_routing``); with
no such copy, a call under a non-default name (``runc-guard-nvidia``) fails with
a clear line instead of silently reaching plain runc.
"""

from __future__ import annotations

import os
import sys

from runc_guard import argv as argv_mod
from runc_guard.errors import EXIT_CONFIG, EXIT_RUNTIME_UNAVAILABLE, RuncGuardError
from runc_guard.runtime import DEFAULT_RUNTIME, exec_runtime, resolve_runtime, runtime_name_for
from runc_guard.settings_file import (
    DEFAULT_PENDING_DIR,
    cache_dir,
    config_path,
    delete_timeout_of,
    first_report,
    last_good_routing,
    log_sink_of,
    read_settings_file,
)

PROG = "runc-guard"
#: Names under which the default runtime is the right target even without settings.
DEFAULT_NAMES = frozenset({PROG, DEFAULT_RUNTIME})


def _journal(environ: os._Environ[str], event: str, message: str, priority: int) -> None:
    """A journal entry from the shim; ``socket`` (~7 ms) loads only on these rare paths."""
    from runc_guard.journal import send_minimal

    send_minimal(environ, event, message, priority)


def _fail(message: str, code: int, environ: os._Environ[str]) -> int:
    """Report a failure to start the runtime: one stderr line and a journal entry."""
    sys.stderr.write(f"{PROG}: {message}\n")
    sys.stderr.flush()
    _journal(environ, "runtime_unavailable", message, 3)
    return code


class _Routing:
    """What the settings say about routing, and what is wrong with them (if anything)."""

    __slots__ = ("problem", "raw", "usable")

    def __init__(self, raw: dict[str, object], problem: str | None, usable: bool) -> None:
        self.raw = raw
        self.problem = problem
        #: False: no trustworthy routing for a non-default name; the call must fail.
        self.usable = usable


def _settings(environ: os._Environ[str], invoked_as: str) -> _Routing:
    """The settings file, or the last good routing, or defaults, and why."""
    path = config_path(environ)
    cache = cache_dir(environ)
    try:
        raw = read_settings_file(path, cache)
        runtime_name_for(invoked_as, raw, environ)  # routing keys of the wrong type?
        return _Routing(raw, None, True)
    except (OSError, ValueError, TypeError) as exc:
        problem = f"settings file {path}: {exc}"
    last_good = last_good_routing(path, cache)
    if last_good is not None:
        return _Routing(last_good, problem + "; routing by its last good version", True)
    return _Routing({}, problem, invoked_as in DEFAULT_NAMES)


def _known_to_anyone(
    invocation: argv_mod.Invocation, raw: dict[str, object], environ: os._Environ[str]
) -> bool:
    """Does the runtime or a pending record know this container? (cheap stats only)

    containerd 1.6 follows every normal task delete with a dead-shim style
    ``delete --force`` of a container that is gone by then: such a call is a
    plain exec, without loading the delete path or logging anything.
    """
    container_dir = os.path.join(invocation.root, invocation.container_id or "")
    if os.path.exists(os.path.join(container_dir, "state.json")) or os.path.exists(
        os.path.join(container_dir, "status")
    ):
        return True
    level = environ.get("RUNC_GUARD_LOG_LEVEL") or raw.get("log_level")
    if isinstance(level, str) and level.lower() == "debug":
        return True  # let the delete path log the unknown delete at debug level
    from runc_guard.pending import record_path

    pending_dir = environ.get("RUNC_GUARD_PENDING_DIR") or raw.get("pending_dir")
    if not isinstance(pending_dir, str) or not pending_dir.startswith("/"):
        pending_dir = DEFAULT_PENDING_DIR
    record = record_path(pending_dir, os.path.abspath(invocation.root), invocation.container_id or "")
    return os.path.exists(record)


def _startup_slot(
    invocation: argv_mod.Invocation, raw: dict[str, object], environ: os._Environ[str]
) -> int | None:
    """Wait briefly for a start-up slot (see runc_guard.startup).

    None: the node is overloaded with deletes loading at once; the caller steps
    aside and execs the runtime, exactly as it would have run without runc-guard.
    """
    import time

    from runc_guard.procinfo import started_monotonic
    from runc_guard.startup import MAX_WAIT, acquire, slots

    started = started_monotonic() or time.monotonic()
    deadline = min(started + delete_timeout_of(raw, environ), time.monotonic() + MAX_WAIT)
    slot = acquire(os.path.join(cache_dir(environ), "startup"), deadline)
    if slot is None:
        waited = int((time.monotonic() - started) * 1000)
        _report_overloaded(
            invocation,
            raw,
            environ,
            f"{slots()} deletes were already loading at once; after {waited} ms runc-guard"
            " stepped aside and ran the runtime alone (the sweep finishes what it leaves)",
        )
    return slot


def _report_overloaded(
    invocation: argv_mod.Invocation, raw: dict[str, object], environ: os._Environ[str], reason: str
) -> None:
    """Spool the stepped-aside delete's entry like every delete's: journald may be absent."""
    try:
        from runc_guard.report import EventLog, detach_reporter, spool_dir, write_spool

        context = {"container_id": invocation.container_id, "runtime_root": invocation.root}
        log = EventLog("info", context)
        log.warning("startup_overloaded", reason=reason)
        directory = spool_dir(cache_dir(environ))
        write_spool(directory, log.entries, log_sink_of(raw, environ))
        detach_reporter(directory, 0.0)  # a storm has reporters lingering already
    except Exception:  # noqa: BLE001 - reporting never changes the call
        _journal(environ, "startup_overloaded", reason, 4)


def _reraise(noted: list[int]) -> None:
    """A signal that came while we started: die of it as the runtime would have, before exec."""
    if noted:
        import _signal  # type: ignore[import-not-found]

        _signal.signal(noted[0], _signal.SIG_DFL)
        os.kill(os.getpid(), noted[0])


def main(noted: list[int] | None = None) -> int:
    """Route one runtime call; ``noted`` holds signals the launcher caught during start-up."""
    noted = [] if noted is None else noted
    environ = os.environ
    args = sys.argv[1:]
    invoked_as = os.path.basename(sys.argv[0])
    invocation = argv_mod.parse(args)
    routing = _settings(environ, invoked_as)
    problem = routing.problem
    if problem is not None and first_report(cache_dir(environ), config_path(environ), problem):
        _journal(environ, "config_invalid", problem, 4)
    if not routing.usable:
        return _fail(
            f"{routing.problem}; no last good routing for {invoked_as!r}: refusing to guess its runtime",
            EXIT_CONFIG,
            environ,
        )
    try:
        name = runtime_name_for(invoked_as, routing.raw, environ)
        runtime = resolve_runtime(name, sys.argv[0], environ)
    except TypeError as exc:  # a last-good copy can only hold what once parsed; be safe anyway
        return _fail(f"invalid settings: {exc}", EXIT_CONFIG, environ)
    except RuncGuardError as exc:
        return _fail(str(exc), exc.exit_code, environ)
    slot = None
    if invocation.is_delete and _known_to_anyone(invocation, routing.raw, environ):
        slot = _startup_slot(invocation, routing.raw, environ)
    if slot is not None:
        # Until the delete path has its own handlers, a signal is only noted (the
        # launcher set that up): the delete starts by honouring it.
        from runc_guard.delete import run_delete

        if slot >= 0:
            os.close(slot)  # loaded: the CPU-heavy part is over, let the next delete load

        status = run_delete(invocation, args, runtime, routing.raw, routing.problem, environ, noted)
        # Everything is written and closed by now; tearing down the ~300 modules the
        # delete path loaded would only delay containerd's shim by ~12 ms.
        sys.stderr.flush()
        os._exit(status)
    _reraise(noted)
    try:
        exec_runtime(runtime, args)
    except OSError as exc:
        return _fail(f"cannot exec {runtime}: {exc.strerror}", EXIT_RUNTIME_UNAVAILABLE, environ)
