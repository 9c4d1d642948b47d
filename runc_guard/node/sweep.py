"""Remove container cgroups that leaked before runc-guard was installed, gently.

Read, decide, act, apart: :func:`read_facts` looks at one container unit (every
directory and child in every hierarchy, runc state, containerd bundle, age),
:func:`decide` is a pure function of those facts, and :class:`Sweeper` acts.
A unit is planned from one look and looked at *again* right before its
removal, because minutes may pass between the two on a big node.

Every ``rmdir`` of a v1 cgroup takes the global ``cgroup_mutex`` and the
kernel's css teardown after it runs in workqueues that take it too; deleting
8147 x 12 directories in one go is what stalled the incident's node. So
removals go in batches with a pause in between, and while the node's system
CPU time (``/proc/stat``, via psutil) stays above a limit the pause grows.
With ``pacing="adaptive"`` the batch and pause follow what the node feels
instead (runc_guard/node/pacing.py: canary mkdir+rmdir, rmdir latency, PSI, sys%).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from runc_guard.delete import systemd_scope
from runc_guard.delete.cgroupfs import CgroupFsOps
from runc_guard.delete.cleanup import (
    Reclaimer,
    attempt_removal,
    remove_listed,
    subtree_leaf_first,
)
from runc_guard.delete.pending import remove_record
from runc_guard.delete.reclaim import SWEEP_BUDGET as RECLAIM_BUDGET
from runc_guard.delete.systemd_scope import release_failed_scopes
from runc_guard.errors import CgroupRemovalFailed, CleanupReport, SweepLocked
from runc_guard.node.discovery import ContainerUnit, Discovery
from runc_guard.node.orphans import ORPHAN, Orphans, StateFacts, judge
from runc_guard.node.pacing import NodeSignals, Pacer, PacingSettings, RmdirTimer, percentile, real_signals

DEFAULT_RUNTIME_ROOT = "/run/containerd/runc"
DEFAULT_BUNDLE_ROOT = "/run/containerd/io.containerd.runtime.v2.task"
#: A container being created has its cgroup before runc writes its state.
DEFAULT_MIN_AGE = 60.0
DEFAULT_BATCH = 500
DEFAULT_PAUSE = 1.0
DEFAULT_MAX_SYS_PERCENT = 30.0
#: Longest extra wait between two batches while sys% stays high: a node busy for
#: other reasons must not stop the sweep for good.
DEFAULT_MAX_SLOWDOWN = 60.0
#: Shortest slowdown step: below this, /proc/stat's 10 ms ticks make sys% noise.
MIN_SLOWDOWN_STEP = 0.5

#: Longest the sweep waits on systemd for the scope of one container it finished
#: (stop, wait, reset-failed); what is not done by then the next sweep's failed-unit pass finishes.
SCOPE_BUDGET = 5.0

#: settle()'s outcomes that leave the scope gone (collected, or never loaded).
SCOPE_DONE = (systemd_scope.RESET_FAILED, systemd_scope.STOPPED, systemd_scope.NOT_LOADED)

#: Kept-reasons in the order decide() checks them.
KEEP_REASONS = ("unsafe_path", "populated", "runtime_state", "bundle", "too_young", "busy")


# -- read ---------------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeDirs:
    """Where runc keeps state (``<root>/<ns>/<id>``) and containerd its bundles (``<root>/<ns>/<id>``)."""

    runtime_root: str = DEFAULT_RUNTIME_ROOT
    bundle_root: str = DEFAULT_BUNDLE_ROOT
    #: Flat state roots (``<root>/<id>``: runc's /run/runc, crun's /run/crun): state there keeps a unit too.
    state_roots: tuple[str, ...] = ()
    #: Judges state whose init is dead and re-drives the runtime's delete; None: any state keeps its unit.
    orphans: Orphans | None = None

    @staticmethod
    def _in_any_namespace(root: str, container_id: str) -> bool:
        try:
            namespaces = os.listdir(root)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return any(os.path.lexists(os.path.join(root, ns, container_id)) for ns in namespaces)

    def has_state(self, container_id: str, record_root: str | None = None) -> bool:
        """runc state exists: the ``<id>`` directory, which runc makes before its state.json."""
        if record_root and os.path.lexists(os.path.join(record_root, container_id)):
            return True
        if any(os.path.lexists(os.path.join(root, container_id)) for root in self.state_roots):
            return True
        return self._in_any_namespace(self.runtime_root, container_id)

    def has_bundle(self, container_id: str) -> bool:
        return self._in_any_namespace(self.bundle_root, container_id)


@dataclass(frozen=True)
class UnitFacts:
    """One look at a container unit."""

    #: Existing directories of the unit and their children, leaf-first.
    present: tuple[str, ...]
    #: Those with a process in ``cgroup.procs``.
    populated: tuple[str, ...]
    has_state: bool
    has_bundle: bool
    #: mtime of the youngest present directory (None when nothing is present).
    newest: float | None
    unsafe: str | None = None
    #: A look at each runtime state of the container (only when orphans are judged).
    states: tuple[StateFacts, ...] = ()


def read_facts(unit: ContainerUnit, fs: CgroupFsOps, runtime: RuntimeDirs) -> UnitFacts:
    """Look at every directory of ``unit`` (and every child) plus the runtime's records of it."""
    if unit.unsafe is not None:
        return UnitFacts((), (), False, False, None, unit.unsafe)
    present: list[str] = []
    populated: list[str] = []
    newest: float | None = None
    for root in unit.dirs:
        for path in subtree_leaf_first(root, fs):
            mtime = fs.modified_at(path)
            if mtime is None:
                continue  # gone (or never existed in this hierarchy)
            present.append(path)
            newest = mtime if newest is None else max(newest, mtime)
            if fs.read_procs(path):
                populated.append(path)
    has_state = runtime.has_state(unit.container_id, unit.runtime_root)
    states: tuple[StateFacts, ...] = ()
    if has_state and runtime.orphans is not None:
        states = tuple(runtime.orphans.of(unit.container_id, unit.runtime_root))
    return UnitFacts(
        tuple(present),
        tuple(populated),
        has_state,
        runtime.has_bundle(unit.container_id),
        newest,
        states=states,
    )


# -- decide -------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """``remove`` the unit, ``keep`` it (for ``reason``), or ``forget`` it (nothing left)."""

    action: str
    reason: str


def orphaned(facts: UnitFacts, now: float, min_age: float) -> bool:
    """Every runtime state of the unit is an orphan (init dead, no bundle, no shim, old)."""
    return bool(facts.states) and all(judge(s, now, min_age) == ORPHAN for s in facts.states)


def decide(facts: UnitFacts, now: float, min_age: float) -> Verdict:
    """Remove only a unit that is empty everywhere, unknown to runc and containerd, and old.

    Runtime state whose container is gone (:func:`orphaned`) does not keep the
    unit: it is re-driven (``orphan_state``), even when its cgroups are gone
    already, and even while processes are left in them: the runtime's own
    ``delete --force`` kills what it would have killed had containerd re-run it
    (every process of a host-PID container); runc-guard kills nothing here and
    removes only what is empty afterwards.
    """
    if facts.unsafe is not None:
        return Verdict("keep", "unsafe_path")
    stale_state = facts.has_state and orphaned(facts, now, min_age)
    if not facts.present and not stale_state:
        return Verdict("forget", "gone")
    if facts.populated and not stale_state:
        return Verdict("keep", "populated")
    if facts.has_state and not stale_state:
        return Verdict("keep", "runtime_state")
    if facts.has_bundle:
        return Verdict("keep", "bundle")
    if facts.present and (facts.newest is None or now - facts.newest < min_age):
        return Verdict("keep", "too_young")
    return Verdict("remove", "orphan_state" if stale_state else "orphan")


def sys_percent(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """System CPU % between two (system, total) samples; None if no time passed."""
    elapsed = after[1] - before[1]
    if elapsed <= 0:
        return None
    return max(0.0, 100.0 * (after[0] - before[0]) / elapsed)


def slowdown_step(
    percent: float | None, limit: float, slowed: float, cap: float, pause: float
) -> float:
    """Seconds to wait before the next batch (0: go on).

    Each step is as long as everything waited so far (so the wait doubles),
    never shorter than the pause or MIN_SLOWDOWN_STEP, and the total stays within ``cap``.
    """
    if percent is None or percent <= limit or slowed >= cap:
        return 0.0
    return min(max(pause, MIN_SLOWDOWN_STEP, slowed), cap - slowed)


def cpu_sample() -> tuple[float, float]:
    """(system, total) CPU seconds of the whole node from /proc/stat (guest time is in user)."""
    import psutil

    times = psutil.cpu_times()
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return times.system, total


# -- act ----------------------------------------------------------------------


@dataclass(frozen=True)
class ScopeOps:
    """How the sweep finishes a container's systemd scope unit: a seam so unit tests record the calls.

    The real one (:func:`system_scopes`) is delete/systemd_scope.py's, talking to PID 1.
    """

    reachable: Callable[[], bool]
    read_scope: Callable[[str, str], systemd_scope.ScopeRef | None]
    settle: Callable[[str, Callable[[], bool], float], systemd_scope.ScopeResult]
    #: Whether systemd runs this node at all (PID 1): unreachable then is the sweeper's blind spot
    #: (no /run/systemd mounted), not a node without scope units.
    node_has_systemd: Callable[[], bool] = lambda: False


def pid1_is_systemd(proc: str = "/proc") -> bool:
    """PID 1 of our namespace is systemd (the host's, for a sweeper with hostPID)."""
    try:
        with open(f"{proc}/1/comm", "rb") as f:
            return f.read().strip() == b"systemd"
    except OSError:
        return False


def system_scopes(mounts: Sequence[str]) -> ScopeOps | None:
    """systemd's scopes, but only for a sweep over the system's own cgroup tree (as release_failed_scopes)."""
    root = systemd_scope.SYSTEM_CGROUP_ROOT
    if not any(m == root or m.startswith(root + "/") for m in mounts):
        return None
    return ScopeOps(
        systemd_scope.systemd_reachable, systemd_scope.read_scope, systemd_scope.settle, pid1_is_systemd
    )


def scope_units(unit: ContainerUnit, refs: Sequence[systemd_scope.ScopeRef | None]) -> list[str]:
    """The scope units of a container: named by its runtime state, else by its cgroup directories."""
    names = {ref.unit for ref in refs if ref is not None}
    for path in unit.dirs:
        name = systemd_scope.unit_of_cgroup_dir(path)
        if name is not None and unit.container_id in name:
            names.add(name)
    return sorted(names)


@dataclass(frozen=True)
class SweepOptions:
    min_age: float = DEFAULT_MIN_AGE
    batch: int = DEFAULT_BATCH
    pause: float = DEFAULT_PAUSE
    max_sys_percent: float = DEFAULT_MAX_SYS_PERCENT
    max_slowdown: float = DEFAULT_MAX_SLOWDOWN
    dry_run: bool = False
    #: "adaptive" (default): runc_guard.node.pacing decides both from what the node feels;
    #: "fixed": ``batch`` dirs then ``pause`` s (slowed while sys% is high).
    pacing: str = "adaptive"
    pacing_settings: PacingSettings = field(default_factory=PacingSettings)


@dataclass
class BatchReport:
    """One batch: when it ran (seconds from the sweep's start) and how the pause after it went."""

    index: int
    started: float
    finished: float = 0.0
    containers: int = 0
    dirs_removed: int = 0
    pause: float = 0.0
    #: Node sys% over the batch and its pause; None after the last batch.
    sys_percent: float | None = None
    slowed: float = 0.0
    #: Directories this batch aimed at (the pace's decision, or --batch).
    target: int = 0
    #: The batch's own rmdir latencies.
    rmdir_p50_ms: float | None = None
    rmdir_p99_ms: float | None = None
    #: Adaptive only: worst canary mkdir+rmdir around the pause, PSI "some" shares
    #: over batch + pause, and the signals that were over their limit.
    canary_ms: float | None = None
    pressure: dict[str, float] = field(default_factory=dict)
    congested: list[str] = field(default_factory=list)
    #: Adaptive only: what the pace did after this batch (grow, hold, shrink, back_off).
    decision: str = ""


@dataclass
class SweepReport:
    """What one sweep found and did; ``as_dict`` is the JSON report."""

    dry_run: bool
    hierarchies: list[str]
    found: int = 0
    candidates: int = 0
    removed: int = 0
    dirs_removed: int = 0
    kept: dict[str, int] = field(default_factory=dict)
    gone: int = 0
    records_cleared: int = 0
    #: Aside records (deletes that stepped aside) dropped because nothing they name is left.
    aside_cleared: int = 0
    #: Memory cgroups deletes held aside (delete.memcg_hold) that the sweep reclaimed and removed.
    held_cleared: int = 0
    #: Records dated ahead of the clock, re-stamped to now (node.record_clock), and each one looked at.
    records_restamped: int = 0
    restamped: list[dict[str, Any]] = field(default_factory=list)
    #: Page cache reclaimed from leaked memory cgroups before their rmdir, and those left charged.
    memcg_reclaimed_kb: int = 0
    memcg_left: int = 0
    errors: list[str] = field(default_factory=list)
    duration: float = 0.0
    slowed: float = 0.0
    batches: list[BatchReport] = field(default_factory=list)
    pacing: str = "fixed"
    #: Adaptive only: the idle references (canary p50/p90 ms, first batch's rmdir ms, PSI shares).
    baseline: dict[str, Any] = field(default_factory=dict)
    #: id, pod, dirs and what happened, for every unit (dry run: what would happen).
    containers: list[dict[str, Any]] = field(default_factory=list)
    #: Each re-run of a runtime's ``delete --force`` for orphaned state, with its output.
    redriven: list[dict[str, Any]] = field(default_factory=list)

    def keep(self, reason: str) -> None:
        self.kept[reason] = self.kept.get(reason, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


Progress = Callable[[int, int], None]


class Sweeper:
    """The acting loop. Clocks, sleep and the CPU sampler are parameters so tests can run it fast."""

    def __init__(
        self,
        fs: CgroupFsOps,
        runtime: RuntimeDirs,
        options: SweepOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        cpu: Callable[[], tuple[float, float]] = cpu_sample,
        progress: Progress | None = None,
        signals: NodeSignals | None = None,
        scopes: ScopeOps | None = None,
    ) -> None:
        self.fs = fs
        self.runtime = runtime
        self.options = options
        self.clock = clock
        self.wall = wall
        self.sleep = sleep
        self.cpu = cpu
        self.progress = progress
        #: Adaptive pacing's measurements; None: the real canary and PSI.
        self.signals = signals
        #: ``<mount>/`` of each cgroup v1 cpuset hierarchy (set by run()).
        self._cpusets: tuple[str, ...] = ()
        #: systemd's scope units (None: system_scopes() of the hierarchies, set by run()).
        self.scopes = scopes
        self._scopes: ScopeOps | None = scopes

    def run(self, discovery: Discovery) -> SweepReport:
        started = self.clock()
        report = SweepReport(self.options.dry_run, [h.mount for h in discovery.hierarchies])
        report.pacing = self.options.pacing
        report.errors.extend(f"{path}: {why}" for path, why in sorted(discovery.record_errors.items()))
        units = sorted(discovery.units.values(), key=lambda u: (u.pod, u.container_id))
        report.found = len(units)
        self._scopes = self.scopes if self.scopes is not None else system_scopes(report.hierarchies)
        self._cpusets = tuple(
            h.mount.rstrip("/") + "/"
            for h in discovery.hierarchies
            if self.fs.exists(os.path.join(h.mount, "cpuset.sched_load_balance"))  # v1 only
        )
        if self.options.dry_run:
            for unit in units:
                facts = read_facts(unit, self.fs, self.runtime)
                verdict = decide(facts, self.wall(), self.options.min_age)
                if verdict.action == "remove":
                    report.candidates += 1
                    would = "would_redrive" if verdict.reason == "orphan_state" else "would_remove"
                    self._note(report, unit, would, len(facts.present))
                else:
                    self._settle(report, unit, verdict, len(facts.present))
        elif units:
            # No planning pass: each unit is judged right before its removal, inside
            # the batches. A pass over 8147 units up front was 4-5 s of uninterrupted
            # cgroupfs reads, the part of the sweep the rest of the node felt most.
            self._remove_in_batches(units, report, started)
        # systemd driver: failed scopes of gone containers are reset through systemd (it then
        # collects the unit). After the units, so that a re-driven orphan's state is gone and
        # its scope is reset in this same sweep rather than the next one.
        report.containers.extend(
            release_failed_scopes(
                self.runtime.has_state, self.runtime.has_bundle, report.hierarchies,
                self.fs.read_procs, self.options.dry_run,
            )
        )  # fmt: skip
        report.duration = round(self.clock() - started, 3)
        return report

    def _note(
        self, report: SweepReport, unit: ContainerUnit, action: str, dirs: int,
        unreclaimed: dict[str, str] | None = None,
    ) -> None:
        """One line per container; ``unreclaimed``: each memcg removed with pages charged, and why."""
        note: dict[str, object] = {"id": unit.container_id, "pod": unit.pod, "dirs": dirs, "action": action}
        if unreclaimed:
            note["memcg_left"] = dict(unreclaimed)
        report.containers.append(note)

    def _settle(self, report: SweepReport, unit: ContainerUnit, verdict: Verdict, dirs: int) -> None:
        """Account for a unit that is not removed; a record whose dirs are all gone is done."""
        if verdict.action == "forget":
            report.gone += 1
            if unit.record is not None and not self.options.dry_run:
                remove_record(unit.record)
                report.records_cleared += 1
            self._note(report, unit, "gone", 0)
            return
        report.keep(verdict.reason)
        self._note(report, unit, f"kept:{verdict.reason}", dirs)

    def _remove_one(self, unit: ContainerUnit, report: SweepReport, batch: BatchReport) -> None:
        facts = read_facts(unit, self.fs, self.runtime)  # now, not minutes ago
        verdict = decide(facts, self.wall(), self.options.min_age)
        if verdict.action != "remove":
            self._settle(report, unit, verdict, len(facts.present))
            return
        report.candidates += 1
        scopes: list[str] = []
        if self._scopes is not None:
            # Read before the runtime's delete removes the state that names the scope.
            scopes = scope_units(unit, [self._scopes.read_scope(s.state.root, unit.container_id)
                                        for s in facts.states])
        if verdict.reason == "orphan_state" and not self._redrive(unit, facts, report):
            return
        cleanup = CleanupReport()
        failed: CgroupRemovalFailed | None = None
        # What leaked with pages charged would stay dying after its rmdir: reclaimed first, as a delete does.
        reclaim = Reclaimer(self.fs, cleanup, RECLAIM_BUDGET, self.clock() + RECLAIM_BUDGET, self.clock)
        try:
            if verdict.reason == "orphan_state":
                # The runtime's delete ran since the look: look again while removing.
                remaining = attempt_removal(unit.dirs, self.fs, cleanup, kill=False, reclaim=reclaim)
            else:
                # The look just taken found every directory empty: remove exactly those.
                # No second read of each cgroup.procs (docs/sweep-pacing.md); one that
                # was populated since is refused by the kernel (EBUSY) and kept as busy.
                self._stop_load_balance(facts.present)
                remaining = remove_listed(facts.present, self.fs, cleanup, reclaim)
        except CgroupRemovalFailed as exc:
            failed, remaining = exc, {exc.path: ()}
        batch.containers += 1
        batch.dirs_removed += len(cleanup.removed)
        report.dirs_removed += len(cleanup.removed)
        report.memcg_reclaimed_kb += cleanup.reclaimed >> 10
        report.memcg_left += len(cleanup.unreclaimed)
        if failed is not None:
            report.errors.append(f"{unit.container_id}: {failed}")
            self._note(report, unit, "error", len(remaining))
            return
        if remaining:
            # EBUSY: something moved into it after the check, or the kernel is not done with it.
            report.keep("busy")
            self._note(report, unit, "kept:busy", len(remaining))
            return
        report.removed += 1
        if unit.record is not None:
            remove_record(unit.record)
            report.records_cleared += 1
        self._note(report, unit, "removed", len(cleanup.removed), cleanup.unreclaimed)
        for scope in scopes:
            self._finish_scope(unit, scope, report)

    def _finish_scope(self, unit: ContainerUnit, scope: str, report: SweepReport) -> None:
        """Bring the scope of a container this sweep finished to "gone" through systemd, bounded.

        A cut-short delete leaves the unit ``failed`` (or still stopping) once its
        processes outlived the stop timeout; systemd keeps a failed unit loaded
        forever. The container is gone now (no state, no bundle, cgroups removed):
        stop, wait and ``reset-failed`` it within SCOPE_BUDGET. Where no systemd
        is reachable although PID 1 is systemd (a sweeper without /run/systemd)
        that is an error to see, not a silent skip; a unit still stopping at the
        budget is left to the next sweep's failed-unit pass.
        """
        assert self._scopes is not None
        entry: dict[str, Any] = {"id": unit.container_id, "pod": unit.pod, "dirs": 0, "unit": scope}
        if not self._scopes.reachable():
            if not self._scopes.node_has_systemd():
                return  # no systemd on this node: a directory named like a scope is no unit
            entry.update(action="error", detail="PID 1 is systemd but it is not reachable here "
                                                "(/run/systemd/system, systemctl)")
            report.errors.append(f"{unit.container_id}: cannot reset scope {scope}: {entry['detail']}")
        else:
            # Every directory of the container was just removed, and the kernel refuses
            # rmdir of a populated cgroup: its cgroups are empty. systemd_scope's
            # deadlines are on time.monotonic(), whatever clock paces the sweep.
            result = self._scopes.settle(scope, lambda: True, time.monotonic() + SCOPE_BUDGET)
            done = result.outcome in SCOPE_DONE
            entry["action"] = f"scope_{result.outcome}" if done else "error"
            if result.detail:
                entry["detail"] = result.detail
            if not done:
                report.errors.append(f"{unit.container_id}: scope {scope}: {result.outcome} {result.detail}")
        report.containers.append(entry)

    def _stop_load_balance(self, paths: Sequence[str]) -> None:
        """Clear sched_load_balance of the v1 cpusets among ``paths``, just before their rmdir.

        The kernel's offline of a v1 cpuset does this itself while holding the
        global cgroup_mutex, comparing the cpuset with every sibling: next to 8000
        leaked siblings that held every other cgroup operation on the node up by
        ~0.5 ms per directory (RealCgroupFs.stop_load_balance, docs/sweep-pacing.md).
        Best effort: if the write fails the rmdir does the same work as before.
        """
        for path in paths:
            if path.startswith(self._cpusets):
                with contextlib.suppress(OSError):
                    self.fs.stop_load_balance(path)

    def _redrive(self, unit: ContainerUnit, facts: UnitFacts, report: SweepReport) -> bool:
        """Re-run the runtime's own ``delete --force`` for each orphaned state; False if any is left.

        runc >= 1.2 removes the cgroups itself once they are empty and then its
        state; whatever it leaves is removed below as for any leaked unit. State
        that survives its runtime's delete stays for the next sweep (and the audit).
        """
        assert self.runtime.orphans is not None  # decide() saw states: only read with orphans
        left: list[str] = []
        for state in facts.states:
            done = self.runtime.orphans.act(state, unit.runtime)
            report.redriven.append(done.as_dict())
            if done.state_left:
                why = done.error or f"exit status {done.exit_code}: {done.output.splitlines()[-1:]}"
                left.append(f"{state.state.path} ({why})")
        if left:
            report.errors.append(f"{unit.container_id}: runtime state kept after delete --force: "
                                 + "; ".join(left))
            self._note(report, unit, "error", len(facts.present))
            return False
        return True

    def _remove_in_batches(
        self, candidates: Sequence[ContainerUnit], report: SweepReport, started: float
    ) -> None:
        """Remove whole units until the batch holds its target dirs, then pause (fixed or paced)."""
        report.pacing = self.options.pacing
        pacer = self._pacer(report) if self.options.pacing == "adaptive" else None
        # _remove_one goes through self.fs: time its rmdirs for the report and the pace.
        fs = self.fs
        timer = RmdirTimer(fs, self.clock)  # the sweep's clock: one time base for every signal
        self.fs = timer
        try:
            target = pacer.pace.batch if pacer is not None else self.options.batch
            batch = BatchReport(0, round(self.clock() - started, 3), target=target)
            cpu_before = self.cpu()
            if pacer is not None:
                pacer.batch_started()
            for done, unit in enumerate(candidates, 1):
                self._remove_one(unit, report, batch)
                if self.progress is not None:
                    self.progress(done, len(candidates))
                if batch.dirs_removed >= batch.target and done < len(candidates):
                    batch.finished = round(self.clock() - started, 3)
                    rmdirs = timer.take()
                    _note_rmdirs(batch, rmdirs)
                    report.batches.append(batch)
                    if pacer is None:
                        self._pause(batch, cpu_before)
                        target = self.options.batch
                    else:
                        target = self._pace(pacer, batch, rmdirs, cpu_before)
                    report.slowed = round(report.slowed + batch.slowed, 3)
                    batch = BatchReport(batch.index + 1, round(self.clock() - started, 3), target=target)
                    cpu_before = self.cpu()
                    if pacer is not None:
                        pacer.batch_started()
            batch.finished = round(self.clock() - started, 3)
            _note_rmdirs(batch, timer.take())
            report.batches.append(batch)
        finally:
            self.fs = fs
            if pacer is not None:
                pacer.signals.close()
                report.baseline["rmdir_ms"] = _ms(pacer.baseline.rmdir)

    def _pacer(self, report: SweepReport) -> Pacer:
        """The adaptive pace, calibrated on the idle node before the first batch."""
        settings = self.options.pacing_settings
        if settings.max_sys_percent != self.options.max_sys_percent:
            settings = replace(settings, max_sys_percent=self.options.max_sys_percent)
        signals = self.signals if self.signals is not None else real_signals(report.hierarchies)
        pacer = Pacer(settings, signals, sleep=self.sleep, clock=self.clock)
        baseline = pacer.calibrate()
        report.baseline = {
            "canary_p50_ms": _ms(baseline.canary_p50),
            "canary_p90_ms": _ms(baseline.canary_p90),
            "pressure": {k: round(v, 3) for k, v in baseline.pressure.items()},
        }
        return pacer

    def _pace(
        self, pacer: Pacer, batch: BatchReport, rmdirs: list[float], cpu_before: tuple[float, float]
    ) -> int:
        """Measure the node around the pause, let the pace decide; returns the next batch's target."""
        step = pacer.between_batches(rmdirs, lambda: sys_percent(cpu_before, self.cpu()))
        batch.pause = step.pause
        batch.sys_percent = None if step.sys_percent is None else round(step.sys_percent, 1)
        batch.canary_ms = step.canary_ms
        batch.pressure = step.pressure
        batch.congested = list(step.congested)
        batch.decision = step.action
        # Time held back by the feedback: the pause beyond its floor.
        batch.slowed = round(max(0.0, step.pause - pacer.settings.min_pause), 3)
        return step.next_batch

    def _pause(self, batch: BatchReport, cpu_before: tuple[float, float]) -> None:
        """Sleep the pause, then keep waiting while the node's sys% is above the limit."""
        options = self.options
        if options.pause > 0:
            self.sleep(options.pause)
        batch.pause = options.pause
        percent = sys_percent(cpu_before, self.cpu())
        batch.sys_percent = None if percent is None else round(percent, 1)
        slowed = 0.0
        while True:
            step = slowdown_step(
                percent, options.max_sys_percent, slowed, options.max_slowdown, options.pause
            )
            if step <= 0:
                break
            before = self.cpu()
            self.sleep(step)
            slowed += step
            percent = sys_percent(before, self.cpu())
        batch.slowed = round(slowed, 3)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _note_rmdirs(batch: BatchReport, rmdirs: Sequence[float]) -> None:
    """The batch's own rmdir latencies, in the report."""
    batch.rmdir_p50_ms = _ms(percentile(rmdirs, 50))
    batch.rmdir_p99_ms = _ms(percentile(rmdirs, 99))


@contextlib.contextmanager
def sweep_lock(path: str) -> Iterator[None]:
    """One sweep per node at a time: an flock on ``path``, released when the process ends."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SweepLocked(f"another sweep holds {path}; try again when it has finished") from None
        yield
    finally:
        os.close(fd)
