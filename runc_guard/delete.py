"""The interposed ``delete``: record, run the real delete, then make sure the cgroups are gone.

Order matters (DESIGN.md §2): the cgroup paths are read from runc's state and
recorded durably *before* the runtime runs, because the runtime removes its
state and go-runc may SIGKILL us at its deadline. Then the real delete runs as
a child; its failure is returned unchanged. Only after it succeeded do we wait
for and remove the cgroups; a failure is reported where containerd looks
(stderr, the ``--log`` file) and in the journal, and the record stays for the
sweep. One canonical log entry per delete says what happened.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any

from runc_guard import runclog
from runc_guard.argv import Invocation
from runc_guard.cgroupfs import RealCgroupFs, cgroup_mounts
from runc_guard.cleanup import CleanupReport, remove_cgroups
from runc_guard.config import Settings, settings_from
from runc_guard.errors import (
    EXIT_CONFIG,
    EXIT_INTERNAL,
    CgroupBusy,
    CgroupRemovalFailed,
    ConfigError,
    Interrupted,
    StateUnreadable,
    UnsafeCgroupPath,
)
from runc_guard.logs import make_logger
from runc_guard.paths import check_container_paths
from runc_guard.pending import PendingRecord, remove_record, write_record
from runc_guard.runtime import run_runtime_child
from runc_guard.settings_file import config_path
from runc_guard.state import read_state, runtime_state_exists

PROG = "runc-guard"


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum, signal.Signals(signum).name)


class DeleteRun:
    """One interposed delete: its settings, logger and canonical entry."""

    def __init__(
        self,
        invocation: Invocation,
        args: list[str],
        runtime: str,
        settings: Settings,
        config_error: ConfigError | None,
    ) -> None:
        self.invocation = invocation
        self.args = args
        self.runtime = runtime
        self.settings = settings
        self.config_error = config_error
        self.started = time.monotonic()
        assert invocation.container_id is not None
        self.container_id: str = invocation.container_id
        self.log = make_logger(
            settings.journal_socket,
            settings.log_file,
            settings.log_level,
            container_id=self.container_id,
            runtime=runtime,
            runtime_root=invocation.root,
        )
        self.canonical: dict[str, Any] = {
            "force": invocation.force,
            "cgroup_paths": [],
            "waited_ms": 0,
            "attempts": 0,
            "stragglers_killed": [],
            "removed": 0,
        }

    # -- reporting -------------------------------------------------------------

    def fail(self, message: str) -> None:
        """Say why, where containerd and an operator will look: stderr and ``--log``."""
        sys.stderr.write(f"{PROG}: {message}\n")
        sys.stderr.flush()
        runclog.append(self.invocation.log_path, "error", f"{PROG}: {message}", self.invocation.log_format)

    def finish(self, outcome: str, exit_status: int, reason: str = "") -> int:
        total_ms = int((time.monotonic() - self.started) * 1000)
        entry = dict(self.canonical, outcome=outcome, exit_status=exit_status, total_ms=total_ms)
        if reason:
            entry["reason"] = reason
        level = "info" if exit_status == 0 else "error"
        getattr(self.log, level)("delete", **entry)
        self._append_stats(outcome, entry)
        return exit_status

    def _append_stats(self, outcome: str, entry: dict[str, Any]) -> None:
        """One small line per delete for ``runc-guardctl metrics`` to aggregate (no daemon)."""
        line = json.dumps(
            {
                "time": round(time.time(), 3),
                "outcome": outcome,
                "waited_ms": entry["waited_ms"],
                "removed": entry["removed"],
                "killed": len(entry["stragglers_killed"]),
            }
        )
        try:
            os.makedirs(os.path.dirname(self.settings.stats_file), mode=0o755, exist_ok=True)
            fd = os.open(
                self.settings.stats_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644
            )
            try:
                os.write(fd, line.encode() + b"\n")
            finally:
                os.close(fd)
        except OSError:
            pass

    def verdict(self, status: int) -> int:
        """Our own success still reports a broken settings file: fix it, it is fleet-wide."""
        if status == 0 and self.config_error is not None:
            self.fail(f"{self.config_error} (the delete itself used defaults and succeeded)")
            return EXIT_CONFIG
        return status

    # -- the delete ------------------------------------------------------------

    def run(self) -> int:
        if self.config_error is not None:
            self.log.error("config_invalid", reason=str(self.config_error))
        try:
            state = read_state(self.invocation.root, self.container_id, cgroup_mounts)
        except StateUnreadable as exc:
            self.log.warning("state_unreadable", reason=str(exc))
            status = run_runtime_child(self.runtime, self.args)
            return self.verdict(self.finish("no_state", status, str(exc)))
        self.canonical["init_pid"] = state.init_pid
        fs = RealCgroupFs()
        try:
            paths = check_container_paths(state, fs, cgroup_mounts())
        except UnsafeCgroupPath as exc:
            # Not even the runtime runs: runc would signal and remove whatever the
            # tampered state names. A human has to look at this container.
            self.fail(f"{exc}; nothing was signalled or removed, the runtime was not run")
            return self.finish("refused", exc.exit_code, str(exc))
        self.canonical["cgroup_paths"] = paths
        record = self._record(state.init_pid, state.init_start, paths)
        status = run_runtime_child(self.runtime, self.args)
        if status != 0:
            self._after_runtime_failure(record, paths, fs)
            return self.finish("runtime_failed", status, f"runtime exited with status {status}")
        return self.verdict(self._cleanup(paths, fs, record))

    def _record(self, init_pid: int, init_start: int, paths: list[str]) -> str | None:
        record = PendingRecord(
            container_id=self.container_id,
            runtime_root=os.path.abspath(self.invocation.root),
            cgroup_paths=paths,
            init_pid=init_pid,
            init_start=init_start,
            runtime=self.runtime,
            created=time.time(),
        )
        try:
            return write_record(self.settings.pending_dir, record)
        except OSError as exc:
            reason = f"cannot record pending cgroups in {self.settings.pending_dir}: {exc.strerror}"
            sys.stderr.write(f"{PROG}: warning: {reason}; deleting anyway\n")
            self.log.warning("pending_unrecorded", reason=reason)
            self.canonical["pending_record"] = None
            return None

    def _after_runtime_failure(self, record: str | None, paths: list[str], fs: RealCgroupFs) -> None:
        """Keep the record only if the runtime lost its state but a cgroup is still there."""
        if record is None:
            return
        state_gone = not runtime_state_exists(self.invocation.root, self.container_id)
        if state_gone and any(fs.exists(p) for p in paths):
            self.canonical["pending_record"] = record
        else:
            remove_record(record)

    def _cleanup(self, paths: list[str], fs: RealCgroupFs, record: str | None) -> int:
        deadline = self.started + self.settings.delete_timeout
        forwarded = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        previous = {sig: signal.signal(sig, _raise_interrupted) for sig in forwarded}
        report = CleanupReport()
        try:
            report = remove_cgroups(
                paths, fs, deadline, self.settings.poll_interval, self.settings.kill_stragglers
            )
        except (CgroupBusy, CgroupRemovalFailed) as exc:
            report = exc.report or report
            self._account(report)
            self.canonical["pending_record"] = record
            self.fail(str(exc))
            outcome = "deadline" if isinstance(exc, CgroupBusy) else "rmdir_failed"
            return self.finish(outcome, exc.exit_code, str(exc))
        except Interrupted as exc:
            self.canonical["pending_record"] = record
            self.fail(str(exc))
            return self.finish("interrupted", exc.exit_code, str(exc))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        self._account(report)
        if record is not None:
            remove_record(record)
        return self.finish("removed" if report.removed else "already_gone", 0)

    def _account(self, report: CleanupReport) -> None:
        self.canonical.update(
            waited_ms=report.waited_ms,
            attempts=report.attempts,
            stragglers_killed=report.killed,
            removed=len(report.removed),
        )


def run_delete(
    invocation: Invocation,
    args: list[str],
    runtime: str,
    raw: Mapping[str, object],
    config_problem: str | None,
    environ: Mapping[str, str],
) -> int:
    """The shim's delete path; the error boundary for everything after argv parsing."""
    config_error: ConfigError | None = None
    try:
        if config_problem is not None:
            raise ConfigError(config_problem)
        settings = settings_from(raw, environ, config_path(environ))
    except ConfigError as exc:
        config_error = exc
        try:  # the file is bad: keep what the environment says (paths above all)
            settings = settings_from({}, environ, "(environment only)")
        except ConfigError:
            settings = Settings()
    try:
        return DeleteRun(invocation, args, runtime, settings, config_error).run()
    except Exception as exc:  # noqa: BLE001 - the boundary: no traceback may reach containerd
        import traceback

        from runc_guard.journal import send_minimal

        send_minimal(environ, "internal_error", traceback.format_exc(), priority=2)
        sys.stderr.write(f"{PROG}: internal error: {type(exc).__name__}: {exc}\n")
        return EXIT_INTERNAL

