"""The interposed ``delete``: decide from facts, run the real delete, make sure the cgroups go.

The facts (docs/background.md, what runc-guard does): is the container's init alive (pid + start time)?
Are its cgroups provably its own? Did the runtime keep its state? Is a cgroup
merely busy? Then, within one deadline that also bounds the runtime child:

* init already gone (the dead-shim path, every delete after an exit): wait for
  the cgroups to empty first, killing stragglers only where the runtime itself
  would, so that the runtime's own removal succeeds on every version; then run it;
* init alive (``delete --force`` of a running container): the runtime kills it;
* the runtime failed and kept its state because a cgroup was busy (runc >= 1.2):
  wait, and re-run its delete;
* then remove what is left, leaf-first.

The cgroup paths are recorded durably before anything runs, so whatever the
deadline leaves is finished by the next delete of the same id or by the sweep.
Paths that are not provably the container's own make runc-guard step aside:
the runtime runs unchanged and runc-guard kills and removes nothing itself. A
delete of a CRI sandbox also records the pod's other containers whose init is
dead (containerd's dead-shim cleanup only ever deletes the sandbox): they are
finished after the sandbox's reply, each by its own delete (node.finisher).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's enums cost ~1 ms of every start
import os
import sys
import time

from runc_guard.deadline import delete_deadline
from runc_guard.delete import runclog
from runc_guard.delete.aside import write_aside
from runc_guard.delete.cgroupfs import FALLBACKS, CgroupFsOps, RealCgroupFs, cgroup_mounts
from runc_guard.delete.cleanup import drain, populated_dirs
from runc_guard.delete.outcomes import ALREADY_GONE, RECORD_UNTRUSTED, REMOVED, UNKNOWN, WARNING_OUTCOMES
from runc_guard.delete.paths import check_container_paths, init_started_wall
from runc_guard.delete.pending import (
    BUSY,
    Claim,
    PendingRecord,
    RecordRule,
    UntrustedRecord,
    find_record,
    record_path,
    remove_record,
    write_record,
)
from runc_guard.delete.plan import NO_PLAN, DeletePlan
from runc_guard.delete.reclaim import DELETE_BUDGET as RECLAIM_BUDGET
from runc_guard.delete.reclaim import PROBE_FILE
from runc_guard.delete.report import EventLog, deliver, detach_finisher
from runc_guard.delete.runtime_child import RuntimeRun, run_runtime_child
from runc_guard.delete.siblings import dead_siblings, record_sibling
from runc_guard.delete.state import ContainerState, read_state, runtime_state_exists
from runc_guard.delete.stats import append_stats, own_cost
from runc_guard.delete.unit_name import scope_unit_name, transient_unit_loaded
from runc_guard.errors import (
    EXIT_CGROUP_BUSY,
    EXIT_INTERNAL,
    CgroupBusy,
    CgroupRemovalFailed,
    CleanupReport,
    ForeignProcess,
    Interrupted,
    RuntimeDeadline,
    StateMissing,
    StateUnreadable,
    UnsafeCgroupPath,
)
from runc_guard.invocation import Invocation
from runc_guard.overload import record_cost
from runc_guard.procinfo import ALIVE, DEAD, SERVING_SHIM, UNKNOWN_CALLER, delete_caller, init_liveness
from runc_guard.settings import SERVING_SHIM_DELETE_TIMEOUT, Settings, first_report
from runc_guard.spool import spool_dir

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~2.5 ms of every delete's start-up
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, NoReturn

PROG = "runc-guard"
FORWARDED = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP)
#: Re-runs of the runtime's delete after it failed on a busy cgroup and kept its state.
MAX_RUNTIME_RERUNS = 3


class Outcome(Exception):
    """How one delete ended: raised from deep inside, reported once by ``DeleteRun.run``."""

    def __init__(self, outcome: str, status: int, reason: str = "", failed: bool = False) -> None:
        super().__init__(reason or outcome)
        self.outcome = outcome
        self.status = status
        self.reason = reason
        #: A failure of runc-guard's own (stderr, ``--log``), not the runtime's status passed on.
        self.failed = failed


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15; the signal module (and its enums) only on an interrupted delete."""
    import signal

    return signal.Signals(signum).name


def _interrupt(signum: int, _frame: object) -> None:
    """A forwarded signal ends the delete as ``interrupted``, unless its verdict is on its way.

    Between ``raise Outcome`` deep inside and ``finish()`` (which only notes
    signals), the Outcome is the exception being handled (finally blocks, a
    claim's exit, ``run``'s except): Interrupted raised on top of it would turn
    a finished delete into an internal error (exit 70). So it is not raised.
    """
    if not isinstance(sys.exception(), Outcome):
        raise Interrupted(signum, signal_name(signum))


def _note_only(_signum: int, _frame: object) -> None:
    """While reporting, a signal changes nothing: the verdict is already final."""


class DeleteRun:
    """One interposed delete (and, for a CRI sandbox, its dead siblings)."""

    def __init__(
        self,
        invocation: Invocation,
        args: list[str],
        runtime: str,
        settings: Settings,
        *,
        fs: CgroupFsOps | None = None,
        mounts: Callable[[], Mapping[str, str]] = cgroup_mounts,
        clock: Callable[[], float] = time.monotonic,
        started: float | None = None,
        log: EventLog | None = None,
        caller: str = UNKNOWN_CALLER,
    ) -> None:
        assert invocation.container_id is not None
        self.invocation = invocation
        self.args = args
        self.runtime = runtime
        self.settings = settings
        self.fs: CgroupFsOps = fs or RealCgroupFs(os.path.join(settings.cache_dir, PROBE_FILE))
        self.mounts = mounts
        self.clock = clock
        #: The deadline counts from the process start (``started``) when the caller knows it.
        self.started = clock() if started is None else min(started, clock())
        #: What the caller allows this delete (procinfo.delete_caller; delete_budget).
        self.budget = delete_budget(caller, settings.delete_timeout)
        #: Seconds the deadline moved earlier for a busy node (a finisher completes the rest):
        #: the start-up admission's rule (runc_guard.deadline.delete_deadline), so both agree.
        self.deadline, self.reply_margin = delete_deadline(
            self.started, clock(), self.budget, settings.finish_window > 0
        )
        self.container_id: str = invocation.container_id
        self.root = os.path.abspath(invocation.root)
        context = {"container_id": self.container_id, "runtime": runtime, "runtime_root": invocation.root}
        #: Collected, not sent: ``deliver`` hands them to a reporter after the verdict.
        self.log = log.bind(**context) if log is not None else EventLog(settings.log_level, context)
        self.canonical: dict[str, Any] = {
            "force": invocation.force,
            "cgroup_paths": [],
            "waited_ms": 0,
            "attempts": 0,
            "stragglers_killed": [],
            "removed": 0,
            "runtime_runs": 0,
        }
        if self.reply_margin > 0.001:
            self.canonical["reply_margin_ms"] = round(self.reply_margin * 1000)
        if caller != UNKNOWN_CALLER:
            self.canonical["caller"] = caller
        self.record: str | None = None
        #: What this delete may do to which cgroups, once its state (or record) is read.
        self.plan: DeletePlan = NO_PLAN
        #: (pid, start) of an init alive when a ``delete --force`` began: the deadline's kill.
        self.live_init: tuple[int, int] | None = None
        #: The sandbox whose delete runs this one (a CRI sandbox's dead sibling), if any.
        self.sibling_of: str | None = None
        #: runc-guard had to wait for (or kill) processes before the runtime could run.
        self.waited = False
        #: How a sibling's delete ended (its outcome), once it has.
        self.ended: str | None = None
        #: The deadline cut this delete short and its record stays: finish it later.
        self.cut_short = False
        #: A sandbox's dead siblings were recorded: a finisher deletes them after the reply.
        self.siblings_left = False
        #: A memory cgroup was held aside for the finisher to reclaim (delete.memcg_hold).
        self.memcg_held = False

    # -- reporting -------------------------------------------------------------

    def fail(self, message: str) -> None:
        """Say why, where containerd and an operator will look: stderr and ``--log``."""
        sys.stderr.write(f"{PROG}: {message}\n")
        sys.stderr.flush()
        runclog.append(self.invocation.log_path, "error", f"{PROG}: {message}", self.invocation.log_format)

    def finish(self, end: Outcome, final: bool = True) -> int:
        """The one canonical entry of this delete; the stats line for metrics.

        ``final``: the process's verdict is decided, so a signal may no longer change
        it; a sandbox's sibling (not final) leaves the handlers to the sandbox's delete.
        """
        if final:
            for sig in FORWARDED:
                _signal.signal(sig, _note_only)
        if end.failed:
            self.fail(end.reason)
        total_ms = int((self.clock() - self.started) * 1000)
        entry = dict(self.canonical, outcome=end.outcome, exit_status=end.status, total_ms=total_ms)
        entry.update(own_cost())
        entry["pending_record"] = self.record if os.path.exists(self.record or "") else None
        self.cut_short = self.cut_short or (end.outcome == "deadline" and entry["pending_record"] is not None)
        if FALLBACKS:
            entry["kernel_fallbacks"] = sorted(FALLBACKS)
        if end.reason:
            entry["reason"] = end.reason
        if end.outcome == UNKNOWN:
            self.log.debug("delete", **entry)  # nothing happened: no entry at info, no metric
            return end.status
        getattr(self.log, _level(end))("delete", **entry)
        append_stats(self.settings.stats_file, end.outcome, entry, self.container_id)
        # What the next storm's admission counts on (shim.startup.slots): this node's cost of the path.
        record_cost(os.path.join(self.settings.cache_dir, "startup"), entry["cpu_ms"])
        return end.status

    # -- the delete ------------------------------------------------------------

    def run(self, early_signals: Sequence[int] = ()) -> int:
        previous = {sig: _signal.signal(sig, _interrupt) for sig in FORWARDED}
        try:
            try:
                if early_signals:
                    signum = early_signals[0]
                    raise Interrupted(signum, signal_name(signum))
                self._delete()
            except Interrupted as exc:
                reason = f"{exc}; recorded for runc-guardctl sweep"
                raise Outcome("interrupted", exc.exit_code, reason, True) from None
        except Outcome as end:
            return self.finish(end)
        finally:
            for sig, handler in previous.items():
                _signal.signal(sig, handler)
        raise AssertionError("every delete ends with an Outcome")  # pragma: no cover

    def _delete(self) -> None:
        try:
            state = read_state(self.invocation.root, self.container_id, self.mounts)
        except StateMissing as exc:
            self._without_state(str(exc))
        except StateUnreadable as exc:
            # Not ours to judge: the runtime will say what it makes of its own state.
            self.log.warning("state_unreadable", reason=str(exc))
            run = self._run_runtime(None)
            raise Outcome("no_state", run.status, str(exc)) from None
        self._with_state(state)

    def _same_container(self) -> None:
        """Raise Outcome ``refused`` if the id no longer names the container this delete read.

        Looked at under the claim before the first kill, and before every run of
        the runtime. Nothing to look at for a delete containerd runs: containerd
        holds the id until it returns. A delete run later (node.late_sibling.LateSibling)
        overrides it.
        """

    def _run_runtime(self, deadline: float | None) -> RuntimeRun:
        """One run of the runtime's delete; a forwarded signal ends the whole delete."""
        self._same_container()
        self.canonical["runtime_runs"] += 1
        run = run_runtime_child(self.runtime, self.args, deadline, self.clock, self._kill_live_init)
        self.canonical["runtime_ms"] = self.canonical.get("runtime_ms", 0) + run.waited_ms
        if run.timed_out or run.signalled is not None or run.status >= 128:
            self._thaw_left_frozen()
        if run.signalled is not None:
            # The caller stopped us and so the runtime; its answer is our status.
            name = signal_name(run.signalled)
            reason = f"interrupted by {name} while the runtime ran; recorded for runc-guardctl sweep"
            raise Outcome("interrupted", run.status, reason, True)
        if run.timed_out:
            raise Outcome(
                "deadline", EXIT_CGROUP_BUSY, str(RuntimeDeadline(self.runtime, run.waited_ms)), True
            )
        return run

    def _kill_live_init(self) -> bool:
        """At the deadline, the runtime's ``delete --force`` of a running container still running:
        SIGKILL the container's init ourselves, then let the runtime finish. True if killed.

        Stopped before it got to its own kill (a node so loaded that the runtime had
        not run yet, seen in the VM lab under emulation), the runtime would leave the
        container running while containerd forgets it: a pod's pause process alive in
        its scope after the pod is gone. ``--force`` asked for exactly this kill, so it
        is no more than the runtime would have done. Only the init this delete proved
        alive at its start (pid and start time), only as a member of the container's
        own cgroups, through a pidfd (CgroupFs.kill_if_member): never a recycled pid.
        """
        live = self.live_init
        if live is None or init_liveness(*live) != ALIVE:
            return False
        if not self.plan.kill_member(self.fs, live[0]):
            return False
        self.canonical["init_killed_at_deadline"] = live[0]
        return True

    def _thaw_left_frozen(self) -> None:
        """Thaw the container's own v1 freezers that a runtime stopped mid-destroy left FROZEN
        (DeletePlan.thaw_left_frozen: never one its owner paused)."""
        thawed = self.plan.thaw_left_frozen(self.fs)
        if thawed:
            self.canonical.setdefault("thawed", []).extend(thawed)

    def _without_state(self, reason: str) -> None:
        """No state: finish a pending record if one is left, else this is a plain passthrough.

        A record that fails the trust rule (pending.RecordRule) is left as it is:
        the runtime runs as it would with no record, one warning entry says why,
        and the stats line counts it (``record_untrusted``).
        """
        with self._claim() as held:
            if held == BUSY:
                raise Outcome("deadline", EXIT_CGROUP_BUSY, self._busy_reason(), True)
            rule = RecordRule.of(self.settings, self.fs, self.mounts())
            try:
                record = find_record(self.settings.pending_dir, self.root, self.container_id, rule)
            except UntrustedRecord as exc:
                run = self._run_runtime(None)
                raise Outcome(RECORD_UNTRUSTED, run.status, f"pending record left as it is: {exc}") from None
            if record is None:
                raise Outcome(UNKNOWN, self._run_runtime(None).status, reason)
            run = self._run_runtime(self.deadline)
            self.record = record_path(self.settings.pending_dir, self.root, self.container_id)
            self.plan = DeletePlan.of_record(record.cgroup_paths)
            self.canonical["cgroup_paths"] = list(self.plan.paths)
            self._remove()
            remove_record(self.record)
            # The runtime's own output and status pass through ("does not exist" is
            # success to containerd); the record's leftovers are gone now.
            raise Outcome("record_finished", run.status)

    def _with_state(self, state: ContainerState) -> None:
        self.canonical.update(
            init_pid=state.init_pid,
            cgroup_driver="systemd" if state.systemd else "cgroupfs",
            pid_namespace=state.pid_namespace,
        )
        mounts = self.mounts()
        not_before = self._init_started_wall(state)
        try:
            ownership = check_container_paths(
                state, self.fs, mounts, not_before, self.settings.container_cgroup_patterns
            )
        except UnsafeCgroupPath as exc:
            # Not even the runtime runs: runc would signal and remove whatever the
            # tampered state names. A human has to look at this container.
            raise Outcome(
                "refused",
                exc.exit_code,
                f"{exc}; nothing was signalled or removed, the runtime was not run",
                True,
            ) from None
        self.canonical["cgroup_paths"] = ownership.paths
        self.plan = DeletePlan.of(state, ownership.paths, self.fs, self.settings.kill_stragglers)
        if ownership.step_aside is not None:
            self._step_aside(ownership.step_aside, None)
        with self._claim() as held:
            if held == BUSY:
                raise Outcome("deadline", EXIT_CGROUP_BUSY, self._busy_reason(), True)
            self._same_container()  # under the claim, before the first kill (the wait) or runtime run
            self.record = self._write_record(state)
            end = Outcome(*self._delete_container(state))
        if state.is_sandbox and end.status == 0 and end.outcome in (REMOVED, ALREADY_GONE):
            # Only once the sandbox itself is gone; their deletes come after this reply.
            self._record_siblings(state)
        raise end

    def _init_started_wall(self, state: ContainerState) -> float | None:
        """When the container's init started (paths.init_started_wall); a clock step is noted."""
        started, step = init_started_wall(state)
        if step is not None:
            self.canonical["clock_step_s"] = step
        return started

    def _claim(self) -> Claim:
        return Claim(self.settings.pending_dir, self.root, self.container_id, self.deadline, self.clock)

    def _busy_reason(self) -> str:
        return f"another delete of {self.container_id} was still running at the deadline"

    def _step_aside(self, why: str, status: int | None) -> NoReturn:
        """Let the runtime act exactly as it would alone; runc-guard kills and removes nothing.

        Unbounded, as the runtime alone would run, except for a sandbox's sibling:
        that runs inside the sandbox's deadline, which containerd's 5 s bounds.
        What the runtime leaves stays visible: an aside record that audit reports
        (not a pending record: nothing may finish what was not provably ours).
        """
        self.log.warning("step_aside", reason=why)
        if self.record is not None:
            remove_record(self.record)
            self.record = None
        if status is None:
            bound = self.deadline if self.sibling_of else None
            self._same_container()
            run = run_runtime_child(self.runtime, self.args, bound, self.clock)
            self.canonical["runtime_runs"] += 1
            if run.timed_out:
                reason = str(RuntimeDeadline(self.runtime, run.waited_ms))
                raise Outcome("deadline", EXIT_CGROUP_BUSY, f"stepped aside ({why}); {reason}", True)
            status = run.status
        left = [p for p in self.plan.paths if self.fs.exists(p)]
        if left:
            self.canonical["aside_record"] = write_aside(
                self.settings.cache_dir, self.root, self.container_id, left, why
            )
        raise Outcome("stepped_aside", status, why)

    def _delete_container(self, state: ContainerState) -> tuple[str, int, str]:
        """The decision table; returns (outcome, status, reason) for a delete that got through."""
        liveness = init_liveness(state.init_pid, state.init_start)
        self.canonical["init_alive"] = liveness == ALIVE
        if liveness == ALIVE and self.invocation.force:
            self.live_init = (state.init_pid, state.init_start)
        if liveness not in (ALIVE, DEAD):  # unknown: a /proc read failed, act as if not there
            self.canonical["init"] = liveness
            self._step_aside(f"cannot tell whether init {state.init_pid} is alive (/proc unreadable)", None)
        unit = self._scope_unit(state)
        if liveness == DEAD and self.plan.wait_first:
            # The dead-shim path: empty first, so the runtime's own removal succeeds. A scope
            # is not stopped here: systemd collects it once empty, as it would without us.
            self._wait_empty()
        run = self._rerun_while_busy(self._run_runtime(self.deadline), state)
        if runtime_state_exists(self.invocation.root, self.container_id):
            # The runtime kept its state: it still owns the container (a delete of a
            # running container without --force, or a failure it will report itself).
            remove_record(self.record or "")
            return ("state_kept" if run.status == 0 else "runtime_failed", run.status, "")
        if run.status != 0 and not any(self.fs.exists(p) for p in self.plan.paths):
            remove_record(self.record or "")
            return ("runtime_failed", run.status, f"runtime exited with status {run.status}")
        if unit is not None:
            # A scope runc could not stop in time is left "failed": reset it once empty,
            # before the v1 leftovers go (systemd then collects the unit and its own dirs).
            self._settle_scope(unit)
        report = self._remove(runtime_status=run.status)
        remove_record(self.record or "")
        # "removed": runc-guard had work to do (waited for or killed processes, or removed
        # directories itself); "already_gone": the runtime alone left nothing behind.
        worked = self.waited or bool(report.removed) or bool(report.killed) or report.attempts > 1
        return (REMOVED if worked else ALREADY_GONE, run.status, "")

    def _scope_unit(self, state: ContainerState) -> str | None:
        """The container's systemd scope unit when runc's systemd driver made its cgroups.

        From the state, not from ``--systemd-cgroup``: containerd's dead-shim cleanup
        runs ``runc delete --force`` without the flag.
        """
        if not state.systemd:
            return None
        unit = scope_unit_name(state.systemd_name, state.scope_prefix)
        if unit is not None:
            self.canonical["systemd_unit"] = unit
        return unit

    def _settle_scope(self, unit: str) -> None:
        """After the runtime's delete: wait out its stop job, reset-failed the scope once empty.

        Never a stop job of our own (``stop_active=False``): systemd turns a stop whose
        TimeoutStopSec passes before the last process exits into ``failed``
        (Result=timeout), where the runtime alone, never reaching its StopUnit (runc's
        ``--force`` polling an exiting init), leaves systemd to collect the emptied
        scope (issue 30, case 10); and an active unit after the runtime's delete is not
        this container's to stop. Still busy at the deadline: exit 75 with the record
        kept, before containerd's kill; no systemd to ask: nothing changes.
        """
        if transient_unit_loaded(unit) is False:
            # systemd has already freed the unit (the runtime's stop, or its own collection of an
            # empty scope): nothing to stop or reset, and no need to load systemd_scope or run systemctl.
            self.canonical["systemd_scope_after"] = {
                "unit": unit, "outcome": "not_loaded", "waited_ms": 0, "detail": "no transient unit file"
            }
            return
        from runc_guard.delete.systemd_scope import STILL_BUSY, settle

        def empty() -> bool:
            return not populated_dirs(self.plan.paths, self.fs)

        result = settle(unit, empty, self.deadline, self.settings.poll_interval, stop_active=False)
        self.canonical["systemd_scope_after"] = result.as_dict()
        if result.outcome == STILL_BUSY:
            state = result.status.active_state if result.status is not None else "busy"
            raise Outcome(
                "deadline",
                EXIT_CGROUP_BUSY,
                f"systemd scope {unit} still {state} after {result.waited_ms} ms (processes still"
                " exiting); recorded for a retry or runc-guardctl sweep",
                True,
            )

    def _rerun_while_busy(self, run: RuntimeRun, state: ContainerState) -> RuntimeRun:
        """runc >= 1.2 exits 1 and keeps its state when a cgroup stays busy: wait, then again.

        Only for a container whose init is dead and whose cgroups still exist; a
        running container's refusal (``delete`` without ``--force``) passes on as
        it is. At most MAX_RUNTIME_RERUNS more runs (tenacity's stop policy), each
        after the cgroups drained, none past the deadline (an Outcome raised
        inside ends the loop and passes on).
        """
        if not self._still_busy(run):
            return run  # success, a death by signal, or the state is gone: nothing to re-run
        dead = init_liveness(state.init_pid, state.init_start) == DEAD
        if not dead or not any(self.fs.exists(p) for p in self.plan.paths):
            return run  # not a busy cgroup (or we cannot tell): the runtime's failure, passed on unchanged
        from tenacity import Retrying, retry_if_result, stop_after_attempt

        reruns = Retrying(
            stop=stop_after_attempt(MAX_RUNTIME_RERUNS),
            retry=retry_if_result(self._still_busy),
            retry_error_callback=_last_run_stands,
        )
        for attempt in reruns:
            with attempt:
                self._wait_empty()
                run = self._run_runtime(self.deadline)
            if attempt.retry_state.outcome is None or not attempt.retry_state.outcome.failed:
                attempt.retry_state.set_result(run)
        return run

    def _still_busy(self, run: RuntimeRun) -> bool:
        """The runtime failed (not by a signal) and kept its state: a busy cgroup, perhaps."""
        return 0 < run.status < 128 and runtime_state_exists(self.invocation.root, self.container_id)

    def _wait_empty(self) -> None:
        """Before a run of the runtime: wait (killing where the plan allows) until the cgroups are
        empty; remove nothing."""
        report = self._drain(remove=False, aside=None)
        self.waited = self.waited or report.attempts > 1 or bool(report.killed)

    def _remove(self, runtime_status: int = 0) -> CleanupReport:
        """Wait for the cgroups and remove them leaf-first."""
        return self._drain(remove=True, aside=runtime_status)

    def _drain(self, remove: bool, aside: int | None) -> CleanupReport:
        """cleanup.drain of the plan's cgroups within the deadline; its failures become this
        delete's Outcome.

        A foreign process makes the delete step aside with status ``aside`` (None:
        the runtime has not run yet, so it runs now, unchanged).
        """
        plan = self.plan
        try:
            report = drain(
                list(plan.paths),
                self.fs,
                self.deadline,
                self.settings.poll_interval,
                may_kill=plan.may_kill,
                remove=remove,
                watch_foreign=plan.watch_foreign,
                clock=self.clock,
                reclaim_budget=RECLAIM_BUDGET,
                hold=self._hold_memcg if self.settings.finish_window > 0 else None,
            )
        except CgroupBusy as exc:
            self._account(exc.report)
            raise Outcome("deadline", exc.exit_code, str(exc), True) from None
        except CgroupRemovalFailed as exc:
            self._account(exc.report)
            raise Outcome("rmdir_failed", exc.exit_code, str(exc), True) from None
        except ForeignProcess as exc:
            self._account(exc.report)
            self._step_aside(str(exc), aside)
        self._account(report)
        return report

    def _account(self, report: CleanupReport | None) -> None:
        if report is None:
            return
        self.canonical["waited_ms"] += report.waited_ms
        self.canonical["attempts"] += report.attempts
        self.canonical["stragglers_killed"] = sorted(
            set(self.canonical["stragglers_killed"]) | set(report.killed)
        )
        self.canonical["removed"] += len(report.removed)
        if report.reclaimed:
            self.canonical["memcg_reclaimed_kb"] = self.canonical.get("memcg_reclaimed_kb", 0) + (
                report.reclaimed >> 10
            )
        if report.unreclaimed:
            self.canonical.setdefault("memcg_unreclaimed", {}).update(report.unreclaimed)
        if report.held:
            self.canonical.setdefault("memcg_held", {}).update(report.held)
            self.memcg_held = True

    def _hold_memcg(self, path: str, reason: str) -> str | None:
        """A memory cgroup too large to reclaim on the reply's time, held for the finisher (v1 only)."""
        from runc_guard.delete.memcg_hold import hold  # only when a reclaim left pages to hold

        return hold(path, self.settings.cache_dir, self.container_id, self.root, reason)

    def _write_record(self, state: ContainerState) -> str | None:
        record = PendingRecord(
            container_id=self.container_id,
            runtime_root=self.root,
            cgroup_paths=list(self.plan.paths),
            init_pid=state.init_pid,
            init_start=state.init_start,
            runtime=self.runtime,
            created=time.time(),
            bundle=state.labels.get("bundle", ""),
            sandbox_id=state.sandbox_id,
        )
        try:
            return write_record(self.settings.pending_dir, record)
        except OSError as exc:
            reason = f"cannot record pending cgroups in {self.settings.pending_dir}: {exc.strerror}"
            sys.stderr.write(f"{PROG}: warning: {reason}; deleting anyway\n")
            self.log.warning("pending_unrecorded", reason=reason)
            return None

    # -- a CRI sandbox's dead siblings -----------------------------------------

    def _record_siblings(self, sandbox: ContainerState) -> None:
        """Record the pod's other containers whose init is dead (delete.siblings): their deletes
        run after this reply.

        Nothing here may change the sandbox's verdict: a failure (EAGAIN, ENOMEM,
        ENFILE on a /proc or state read) is noted, not raised.
        """
        try:
            args = self.invocation.global_args(with_log=False)
            done = [
                record_sibling(self.settings.cache_dir, self.root, self.runtime, args, sandbox, state)
                for state in dead_siblings(self.invocation.root, sandbox, self.mounts)
            ]
        except Exception as exc:  # noqa: BLE001 - the sandbox's verdict is final; the sweep has the rest
            reason = f"cannot record the sandbox's dead siblings: {type(exc).__name__}: {exc}"
            self.canonical["siblings_error"] = reason
            self.log.warning("siblings_unrecorded", reason=reason)
            return
        if done:
            self.canonical["siblings"] = done
            self.siblings_left = True

    def run_sibling(self, state: ContainerState) -> int:
        """The same delete for a sandbox's sibling (node.finisher, after the sandbox's reply): its own
        canonical entry and stats line, never on stderr or ``--log``."""
        try:
            self._with_state(state)
        except Outcome as end:
            end.failed = False  # the sandbox's caller asked about the sandbox only
            self.ended = end.outcome
            return self.finish(end, final=False)
        raise AssertionError("every delete ends with an Outcome")  # pragma: no cover




def delete_budget(caller: str, delete_timeout: float) -> float:
    """Seconds this delete may take, from what its caller allows (docs/deadline.md).

    The dead-shim cleanup (5 s) and an unknown caller get ``delete_timeout``; the
    serving shim, under CRI's 10 s per exit event, at least SERVING_SHIM_DELETE_TIMEOUT,
    where stock runc waiting on systemd's stop job would still finish.
    """
    if caller == SERVING_SHIM:
        return max(delete_timeout, SERVING_SHIM_DELETE_TIMEOUT)
    return delete_timeout


def _level(end: Outcome) -> str:
    """error for runc-guard's own failures; warning where the runtime decided; else info.

    A finished record whose runtime answered "does not exist" (exit 1) is a success.
    """
    if end.failed:
        return "error"
    return "warning" if end.outcome in WARNING_OUTCOMES else "info"


def _last_run_stands(_state: object) -> None:
    """The re-runs are spent: the loop ends and the last run's answer stands."""


def run_delete(
    invocation: Invocation,
    args: list[str],
    runtime: str,
    settings: Settings,
    environ: Mapping[str, str],
    early_signals: Sequence[int] = (),
    origin: float | None = None,
    caller: str | None = None,
) -> int:
    """The shim's delete path; the error boundary for everything after argv parsing.

    ``origin``, ``caller``: when containerd's budget started and who runs this delete
    (procinfo.delete_caller, whose role sets the budget), as the shim or the launcher
    read them; read here when it did not.

    A settings problem never changes how the delete ends: valid keys apply,
    invalid ones keep their defaults (``settings.load``), and each problem is
    reported once per version of the file (journal; metrics, doctor and audit
    read the file too).
    """
    run: DeleteRun | None = None
    try:
        if caller is None or origin is None:
            caller, found = delete_caller()
            origin = found if origin is None else origin
        run = DeleteRun(invocation, args, runtime, settings, started=origin, caller=caller)
        for problem in settings.problems:
            if first_report(settings.cache_dir, settings.config_file, problem):
                run.log.error("config_invalid", reason=problem)
        status = run.run(early_signals)
    except Exception as exc:  # noqa: BLE001 - the boundary: no traceback may reach containerd
        import traceback

        from runc_guard.journal import send_minimal

        for sig in FORWARDED:
            _signal.signal(sig, _note_only)
        reason = f"internal error: {type(exc).__name__}: {exc}; recorded for runc-guardctl sweep"
        send_minimal(environ, "internal_error", traceback.format_exc(), priority=2)
        if run is None:
            sys.stderr.write(f"{PROG}: {reason}\n")
            return EXIT_INTERNAL
        try:
            status = run.finish(Outcome("internal_error", EXIT_INTERNAL, reason, True))
        except Exception:  # noqa: BLE001 - reporting itself failed: the status still stands
            status = EXIT_INTERNAL
    deliver(run.log, settings, spool_dir(settings.cache_dir))
    # Settled: detached. A sandbox's siblings are its own delete's job, finisher or not
    # (node.finisher_process.run); a held memcg is held only when a finisher will run (finish_window > 0).
    if run.siblings_left or ((run.cut_short or run.memcg_held) and settings.finish_window > 0):
        detach_finisher(settings.cache_dir)
    return status
