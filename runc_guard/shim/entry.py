"""Entry point of ``runc-guard``, the binary containerd runs instead of runc.

Its whole command line belongs to the runtime; it has no flags of its own. Every
call that is not a ``delete`` of one container is exec'd into the real runtime
untouched. This module runs on every runtime call of every container, so it
imports only ``os``, ``sys`` and runc-guard's stdlib-only argv/settings/runtime
modules; the delete path loads the rest. It never writes to stdout, and writes
to stderr only when it cannot exec at all: go-runc reads ``state`` and ``ps``
output with stderr combined into stdout, so a stray warning would corrupt JSON.

A settings error never changes where a call goes: a file that no longer parses
routes by the last version that did (``settings.load``, ``routing_from_last_good``:
a persistent copy, runc_guard.routes); with no such copy every call fails with a
clear line and exit 78 instead of silently reaching plain runc; so does a
non-default name (``runc-guard-nvidia``) that ``[runtimes]`` does not map at all
(file missing, entry removed).

Usually this runs behind the C launcher (launcher/runc-guard.c), which execs it
for what it will not route itself and hands over the invoked name and its own
path in RUNC_GUARD_HANDOVER (``handed_over``); run directly, it is a complete,
slower BinaryName.
"""

from __future__ import annotations

import gc
import os
import sys

from runc_guard import invocation as argv_mod
from runc_guard.errors import EXIT_CONFIG, EXIT_RUNTIME_UNAVAILABLE, RuncGuardError
from runc_guard.runtime import exec_runtime, resolve_runtime
from runc_guard.settings import Settings, first_report, is_default_name, load, unmapped_problem

PROG = "runc-guard"
#: procinfo's caller roles (not imported: procinfo loads with the delete path).
CALLERS = ("dead_shim", "serving_shim", "unknown")


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


def _known_to_anyone(invocation: argv_mod.Invocation, settings: Settings) -> bool:
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
    if settings.log_level == "debug":
        return True  # let the delete path log the unknown delete at debug level
    from runc_guard.delete.pending import record_path

    root = os.path.abspath(invocation.root)
    return os.path.exists(record_path(settings.pending_dir, root, invocation.container_id or ""))


def _startup_slot(
    invocation: argv_mod.Invocation, settings: Settings, environ: os._Environ[str], origin: float | None,
    runtime: str, caller: str,
) -> int | None:
    """A delete slot, held until this delete ends (see runc_guard.shim.startup).

    ``origin``, ``caller``: when containerd's budget started and who runs the delete
    (procinfo.delete_caller). None: the node is overloaded (too little of the budget left, or every slot
    held); the caller steps aside and execs the runtime, exactly as it would have
    run without runc-guard.
    """
    import time

    from runc_guard.deadline import MIN_BUDGET_SHARE, delete_deadline
    from runc_guard.overload import overload_reason, read_cost
    from runc_guard.shim.startup import acquire, cpu_to_spare, mark_storm, runnable, slots, storm_marked

    started = origin or time.monotonic()
    now = time.monotonic()
    # The deadline the delete will use (its reply margin included), not the bare budget.
    deadline, _margin = delete_deadline(started, now, settings.delete_timeout, settings.finish_window > 0)
    if deadline - now < settings.delete_timeout * MIN_BUDGET_SHARE:
        spent = int((time.monotonic() - started) * 1000)
        _report_overloaded(invocation, settings, environ, runtime, overload_reason("budget", spent))
        return None
    directory = os.path.join(settings.cache_dir, "startup")
    if storm_marked(directory):
        if caller == CALLERS[0]:  # a dead-shim cleanup: the storm goes on
            mark_storm(directory)
        _report_overloaded(invocation, settings, environ, runtime, overload_reason("storm", 0))
        return None
    count = slots(read_cost(directory), settings.delete_timeout)
    if count == 0:  # one path costs too much here: alone, and only with CPU to spare
        running = runnable()
        if not cpu_to_spare(running):
            mark_storm(directory)
            _report_overloaded(invocation, settings, environ, runtime, overload_reason("cpu", running or 0))
            return None
        count = 1
    slot = acquire(directory, count)
    if slot is None:
        mark_storm(directory)
        _report_overloaded(invocation, settings, environ, runtime, overload_reason("slots", count))
    return slot


def _report_overloaded(
    invocation: argv_mod.Invocation, settings: Settings, environ: os._Environ[str], runtime: str, reason: str
) -> None:
    """Spool the stepped-aside delete's entry like every delete's: journald may be absent.

    Its aside record names the runtime that runs alone; with a finisher enabled
    (``finish_window``), one is started to finish what that runtime leaves once
    containerd is done with the container (node.finisher).
    """
    try:
        from runc_guard.delete.aside import OVERLOAD, write_aside
        from runc_guard.delete.report import EventLog, deliver, detach_finisher
        from runc_guard.spool import spool_dir

        # No state was read (that is the load it avoids): audit looks the id up itself.
        root = os.path.abspath(invocation.root)
        written = write_aside(
            settings.cache_dir, root, invocation.container_id or "", [], reason, OVERLOAD, runtime
        )
        if written is not None and settings.finish_window > 0:
            detach_finisher(settings.cache_dir)

        context = {"container_id": invocation.container_id, "runtime_root": invocation.root}
        log = EventLog("info", context)
        log.warning("startup_overloaded", reason=reason)
        deliver(log, settings, spool_dir(settings.cache_dir))
    except Exception:  # noqa: BLE001 - reporting never changes the call
        _journal(environ, "startup_overloaded", reason, 4)


def _routed_by_environment(settings: Settings, invoked_as: str, environ: os._Environ[str]) -> bool:
    """Does RUNC_GUARD_RUNTIME(S) name this call's runtime? Then a broken file is no guess.

    Only asked when the file's routing was dropped, so ``settings`` routes by the environment alone.
    """
    if invoked_as in settings.runtimes:
        return True
    return is_default_name(invoked_as) and bool(environ.get("RUNC_GUARD_RUNTIME"))


def handed_over(environ: os._Environ[str]) -> tuple[str, str, list[str]]:
    """(invoked name, path of the binary containerd ran, what the launcher decided): the
    launcher's, else this script's name and path and nothing decided.

    The launcher puts ``RUNC_GUARD_HANDOVER=<name>/<its path>[\n<decision>]`` (a name has
    no ``/``) first in the environment, and os.environ keeps the first of two equal names,
    so a caller's own variable of that name cannot stand in for it. It is dropped here and
    from the runtime's environment (runtime.inherited_environment). A decision is
    ``admitted <slot fd> <origin ns> <caller>`` (the launcher admitted the delete) or
    ``helper`` (it started a detached reporter or finisher through this entry).
    """
    handover = environ.pop("RUNC_GUARD_HANDOVER", None)
    if handover is not None:
        head, newline, decision = handover.rpartition("\n")
        if not newline:
            head, decision = handover, ""
        name, sep, path = head.partition("/")  # a name has no "/"; the path is the rest
        if sep and path:
            return name, path, decision.split()
    return os.path.basename(sys.argv[0]), sys.argv[0], []


def _admitted(decision: list[str]) -> tuple[int, float, str] | None:
    """(slot fd or -1, origin on time.monotonic(), caller) of a delete the launcher admitted.

    A decision this entry cannot read (another version's launcher) lets go of the slot it
    names, so that the runtime never inherits it; the entry then admits the delete itself.
    """
    if not decision or decision[0] != "admitted":
        return None
    slot = int(decision[1]) if len(decision) > 1 and decision[1].isdigit() else -1
    if slot in (0, 1, 2):
        return None  # stdio is never a slot
    if len(decision) == 4 and decision[2].isdigit() and decision[3] in CALLERS:
        if slot >= 0:
            try:  # held for the whole delete: never by the runtime or a helper it starts
                os.set_inheritable(slot, False)
            except OSError:
                slot = -1  # not an fd after all: go on without a slot, as with no slot directory
        return slot, int(decision[2]) / 1e9, decision[3]
    _close(slot)
    return None


def _helper(args: list[str]) -> int:
    """A detached helper the launcher started through this entry (its lock on fd 3)."""
    import _signal  # type: ignore[import-not-found]

    for signum in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):  # not the runtime's: stoppable
        _signal.signal(signum, _signal.SIG_DFL)
    from runc_guard.delete.report import exec_helper

    return exec_helper(args)


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


def _reraise(noted: list[int]) -> None:
    """A signal that came while we started: die of it as the runtime would have, before exec."""
    if noted:
        import _signal

        _signal.signal(noted[0], _signal.SIG_DFL)
        os.kill(os.getpid(), noted[0])


def main(noted: list[int] | None = None) -> int:
    """Route one runtime call; ``noted`` holds signals the launcher caught during start-up."""
    # A short-lived process whose start-up makes no garbage cycles: the collector's
    # passes over what the imports create cost ~2 ms of every delete (4 young and one
    # middle collection, measured) and find nothing. Back on once the delete path is loaded.
    gc.disable()
    noted = [] if noted is None else noted
    environ = os.environ
    args = sys.argv[1:]
    invoked_as, self_path, decision = handed_over(environ)
    if decision == ["helper"]:
        return _helper(args)
    admitted = _admitted(decision)
    invocation = argv_mod.parse(args)
    settings = load(environ)
    problem = settings.routing_problem
    if problem is not None:
        if first_report(settings.cache_dir, settings.config_file, problem):
            _journal(environ, "config_invalid", problem, 4)
        if not settings.routing_from_last_good and not _routed_by_environment(settings, invoked_as, environ):
            return _fail(
                f"{problem}; no last good routing for {invoked_as!r}: refusing to guess its runtime",
                EXIT_CONFIG,
                environ,
            )
    unmapped = unmapped_problem(settings, invoked_as)
    if unmapped is not None:
        return _fail(unmapped, EXIT_CONFIG, environ)
    try:
        runtime = resolve_runtime(settings.runtime_for(invoked_as), self_path, environ)
    except RuncGuardError as exc:
        return _fail(str(exc), exc.exit_code, environ)
    slot = origin = caller = None
    if admitted is not None and not invocation.is_delete:
        _close(admitted[0])  # not this call's (the launcher parses as argv.py does): never the runtime's
    elif admitted is not None:
        slot, origin, caller = admitted  # the launcher's start-up admission (launcher/runc-guard.c)
    elif invocation.is_delete and _known_to_anyone(invocation, settings):
        from runc_guard.procinfo import delete_caller

        # Read once (the parent's /proc entries): the admission and the delete's deadline share it.
        caller, origin = delete_caller()
        try:
            slot = _startup_slot(invocation, settings, environ, origin, runtime, caller)
        except Exception as exc:  # noqa: BLE001 - runc-guard's own fault: the runtime alone, as without it
            reason = f"the delete's admission failed ({exc!r}): ran the runtime alone"
            _journal(environ, "startup_failed", reason, 3)
            slot = None
    if slot is not None:
        # Until the delete path has its own handlers, a signal is only noted (the
        # launcher set that up): the delete starts by honouring it.
        from runc_guard.delete.run import run_delete

        gc.freeze()  # the loaded modules live until exit: no collection needs to look at them
        gc.enable()
        # The slot is held until os._exit: the next delete takes it, or steps aside.
        status = run_delete(invocation, args, runtime, settings, environ, noted, origin, caller)
        # Everything is written and closed by now; tearing down the ~300 modules the
        # delete path loaded would only delay containerd's shim by ~12 ms.
        sys.stderr.flush()
        os._exit(status)
    _reraise(noted)
    try:
        exec_runtime(runtime, args)
    except OSError as exc:
        return _fail(f"cannot exec {runtime}: {exc.strerror}", EXIT_RUNTIME_UNAVAILABLE, environ)
