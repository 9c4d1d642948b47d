"""Entry point of ``runc-guard``, the binary containerd runs instead of runc.

Its whole command line belongs to the runtime; it has no flags of its own. Every
call that is not a ``delete`` of one container is exec'd into the real runtime
untouched. This module runs on every runtime call of every container, so it
imports only ``os``, ``sys`` and runc-guard's stdlib-only argv/settings/runtime
modules; the delete path loads the rest. It never writes to stdout, and writes
to stderr only when it cannot exec at all: go-runc reads ``state`` and ``ps``
output with stderr combined into stdout, so a stray warning would corrupt JSON.
"""

from __future__ import annotations

import os
import sys

from runc_guard import argv as argv_mod
from runc_guard.errors import EXIT_CONFIG, EXIT_RUNTIME_UNAVAILABLE, RuncGuardError
from runc_guard.runtime import exec_runtime, resolve_runtime, runtime_name_for
from runc_guard.settings_file import cache_dir, config_path, read_settings_file

PROG = "runc-guard"


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


def _read_raw(environ: os._Environ[str]) -> tuple[dict[str, object], str | None]:
    """The settings file, or defaults plus the reason it could not be used."""
    path = config_path(environ)
    try:
        return read_settings_file(path, cache_dir(environ)), None
    except (OSError, ValueError) as exc:
        return {}, f"settings file {path}: {exc}"


def main() -> int:
    environ = os.environ
    args = sys.argv[1:]
    invoked_as = os.path.basename(sys.argv[0])
    self_path = sys.argv[0]
    invocation = argv_mod.parse(args)
    raw, config_problem = _read_raw(environ)
    try:
        name = runtime_name_for(invoked_as, raw, environ)
    except TypeError as exc:
        return _fail(f"invalid settings: {exc}", EXIT_CONFIG, environ)
    try:
        runtime = resolve_runtime(name, self_path, environ)
    except RuncGuardError as exc:
        return _fail(str(exc), exc.exit_code, environ)
    if invocation.is_delete:
        from runc_guard.delete import run_delete

        status = run_delete(invocation, args, runtime, raw, config_problem, environ)
        # Everything is written and closed by now; tearing down the ~300 modules the
        # delete path loaded would only delay containerd's shim by ~12 ms.
        sys.stderr.flush()
        os._exit(status)
    if config_problem is not None:
        _journal(environ, "config_invalid", config_problem + "; using defaults", 4)
    try:
        exec_runtime(runtime, args)
    except OSError as exc:
        return _fail(f"cannot exec {runtime}: {exc.strerror}", EXIT_RUNTIME_UNAVAILABLE, environ)
