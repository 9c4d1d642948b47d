"""Pace the sweep by what the node feels instead of a fixed batch and pause.

Every cgroup v1 ``rmdir`` takes the kernel's global ``cgroup_mutex`` (and its
hierarchy's kernfs lock), and the css teardown it starts (offline, release,
free: workqueue items after RCU grace periods) takes the mutex again. Every
other pod that creates or removes a cgroup waits for the same locks. So
instead of guessing a safe batch and pause, the sweep measures that cost
after every batch:

- a *canary*: ``mkdir`` + ``rmdir`` of a private cgroup, exactly what a
  container start does, against its idle latency measured before the first batch;
- the median latency of the sweep's own ``rmdir`` calls in the batch against
  the median of its first (small) batch;
- PSI stall time (``/proc/pressure/{cpu,io,memory}`` "some", where the kernel
  has it) over the batch against the idle share;
- node system CPU % (``/proc/stat``) against ``--max-sys-percent``.

:func:`next_pace` is the decision, a pure function (AIMD, as TCP does with its
window): while every signal stays under its limit the batch grows by a fixed
step and the pause shrinks back to its floor; a slow canary or slower rmdirs
cut the batch (and double the pause if the node is still slow after it);
sys% and PSI, node-wide, only stop the growth. :func:`duty_pause` keeps the
share of time spent removing under ``max_duty`` whatever the signals say.
Measuring and sleeping are thin seams (:class:`NodeSignals`, the sweeper's
clock and sleep) so the loop is unit-tested with fakes and proven on the
kernel in the kernel tests. docs/sweep-pacing.md has the measurements.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from runc_guard.delete.cgroupfs import CgroupFsOps
from runc_guard.procinfo import pid_exists

#: What ``--pacing`` accepts: the old fixed batch + pause, or the feedback loop.
PACING_MODES = ("fixed", "adaptive")
PSI_RESOURCES = ("cpu", "io", "memory")


@dataclass(frozen=True)
class PacingSettings:
    """Limits and steps of the adaptive pace; the defaults come from docs/sweep-pacing.md's runs."""

    #: Directories in the first batch (small: its rmdirs are the idle reference).
    start_batch: int = 100
    min_batch: int = 10
    max_batch: int = 500
    #: Additive increase per calm batch, in directories.
    increase: int = 100
    #: Multiplicative decrease of the batch when a signal is over its limit.
    decrease: float = 0.5
    #: Floor and ceiling of the pause after a batch, seconds; it doubles on a back-off.
    min_pause: float = 0.05
    max_pause: float = 2.0
    #: Canary latency over this many times its idle p90 is over its limit.
    canary_ratio: float = 2.0
    #: The batch's median rmdir over this many times the first batch's median is over its limit.
    rmdir_ratio: float = 2.0
    #: PSI "some" stall share (0-1) above the idle share by more than this holds the batch.
    #: The sweep's own runnable time counts there: flat out on 2 cores it adds ~0.3.
    max_pressure: float = 0.5
    #: Node sys% above this holds the batch (``--max-sys-percent``).
    max_sys_percent: float = 30.0
    #: Canary samples, 10 ms apart, for the idle baseline before the first batch.
    calibration: int = 20
    #: Longest share of the time spent removing: the pause after a batch lasts at least
    #: (1 - duty) / duty times as long as the batch did. Measured on a quiet machine:
    #: 0.3 took 36 s with the probe's p99 at 3.1x idle, 0.2 took 53 s at 2.4x (the
    #: removing itself takes ~11 s; at 0.5 the p99 was 5-13x on a busy machine).
    max_duty: float = 0.2


@dataclass(frozen=True)
class Pace:
    """How many directories the next batch removes, and how long to sleep after it."""

    batch: int
    pause: float


@dataclass(frozen=True)
class Baseline:
    """The node before the sweep touched it: the references every signal is compared with."""

    #: p50 and p90 of the idle canary, seconds (None: no canary possible here).
    canary_p50: float | None = None
    canary_p90: float | None = None
    #: Median rmdir of the first batch, seconds.
    rmdir: float | None = None
    #: Idle PSI "some" share (0-1) per resource.
    pressure: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Signals:
    """What the node felt over one batch and its pause."""

    #: Canary right after the batch (the teardown it started) and after the pause, seconds.
    canary_after: float | None = None
    canary_before: float | None = None
    rmdir_p50: float | None = None
    #: PSI "some" share (0-1) per resource over the batch and pause.
    pressure: dict[str, float] = field(default_factory=dict)
    sys_percent: float | None = None


#: Over-limit signals that mean "this sweep hurts": the node still slow after the
#: pause, or the sweep's own rmdirs slowed down (lock contention).
BACK_OFF = frozenset({"canary:before", "rmdir"})
#: Only the burst hurt: the canary was slow right after the batch and fine after the pause.
SHRINK = frozenset({"canary:after"})


@dataclass(frozen=True)
class Decision:
    pace: Pace
    #: grow | hold | shrink | back_off
    action: str
    #: The signals that were over their limit (empty: calm), e.g. ``("canary:after", "sys")``.
    congested: tuple[str, ...]


def congestion(signals: Signals, baseline: Baseline, settings: PacingSettings) -> tuple[str, ...]:
    """Name every signal over its limit; a signal with no reading or no baseline never is."""
    over: list[str] = []
    if baseline.canary_p90 is not None:
        limit = settings.canary_ratio * baseline.canary_p90
        if signals.canary_after is not None and signals.canary_after > limit:
            over.append("canary:after")
        if signals.canary_before is not None and signals.canary_before > limit:
            over.append("canary:before")
    if (
        signals.rmdir_p50 is not None
        and baseline.rmdir is not None
        and signals.rmdir_p50 > settings.rmdir_ratio * baseline.rmdir
    ):
        over.append("rmdir")
    for resource in sorted(signals.pressure):
        idle = baseline.pressure.get(resource)
        if idle is not None and signals.pressure[resource] > idle + settings.max_pressure:
            over.append(f"pressure:{resource}")
    if signals.sys_percent is not None and signals.sys_percent > settings.max_sys_percent:
        over.append("sys")
    return tuple(over)


def next_pace(pace: Pace, signals: Signals, baseline: Baseline, settings: PacingSettings) -> Decision:
    """AIMD with a hold: grow while calm, cut when the sweep hurts, hold while the node is busy.

    - calm: the batch grows by ``increase`` and the pause halves back to its floor;
    - the canary was slow only right after the batch (the burst's teardown):
      the batch is cut by ``decrease``, the pause stays;
    - the canary is still slow after the pause, or the sweep's own rmdirs
      slowed down: the batch is cut *and* the pause doubles;
    - only sys% or PSI are over (node-wide, other tenants' load included):
      the batch stays, the pause still shrinks back, so a busy node is not
      pushed harder but a sweep the pods do not feel is not starved either.

    The pause is the quick lever (back to its floor after a few calm batches),
    the batch the slow one (it climbs back linearly): one noisy reading costs
    a little time, repeated ones keep the sweep throttled.
    """
    over = congestion(signals, baseline, settings)
    batch, pause = pace.batch, pace.pause
    if BACK_OFF.intersection(over):
        action = "back_off"
        batch = max(settings.min_batch, int(batch * settings.decrease))
        pause = min(settings.max_pause, max(settings.min_pause, pause * 2))
    elif SHRINK.intersection(over):
        action = "shrink"
        batch = max(settings.min_batch, int(batch * settings.decrease))
    elif over:
        action = "hold"
        pause = max(settings.min_pause, pause / 2)
    else:
        action = "grow"
        batch = min(settings.max_batch, batch + settings.increase)
        pause = max(settings.min_pause, pause / 2)
    return Decision(Pace(batch, round(pause, 4)), action, over)


def duty_pause(busy: float, pause: float, settings: PacingSettings) -> float:
    """The pause after a batch that took ``busy`` s: the pace's pause, or longer to keep the duty cycle.

    The batch's css teardown runs after it (workqueues, after RCU grace periods)
    and takes cgroup_mutex again; a batch that took long leaves a long tail.
    """
    if settings.max_duty >= 1 or busy <= 0:
        return pause
    return round(max(pause, busy * (1 - settings.max_duty) / settings.max_duty), 4)


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))]


def pressure_share(before: dict[str, float], after: dict[str, float], elapsed: float) -> dict[str, float]:
    """Share (0-1) of ``elapsed`` that some task stalled on each resource, from two PSI totals."""
    if elapsed <= 0:
        return {}
    return {name: max(0.0, (after[name] - before[name]) / elapsed) for name in after if name in before}


# -- seams: the real measurements ------------------------------------------------


def read_pressure(root: str = "/proc/pressure") -> dict[str, float]:
    """Cumulative "some" stall seconds per resource; {} on a kernel without PSI (or psi=0)."""
    totals: dict[str, float] = {}
    for name in PSI_RESOURCES:
        try:
            with open(os.path.join(root, name), "rb") as f:
                first = f.readline()
        except OSError:  # ENOENT: no CONFIG_PSI; EOPNOTSUPP: booted with psi=0
            continue
        # "some avg10=0.00 avg60=0.00 avg300=0.00 total=12345" (microseconds)
        for part in first.split():
            if part.startswith(b"total="):
                totals[name] = int(part[6:]) / 1e6
    return totals


class CgroupCanary:
    """mkdir + rmdir of one private cgroup, timed: what every container start pays right now.

    It lives directly below a hierarchy's root as ``runc-guard-canary-<pid>``
    and exists only between the two calls. A canary that cannot be made (no
    permission, read-only mount) reads None and the pace uses the other signals.
    """

    PREFIX = "runc-guard-canary-"

    def __init__(self, hierarchy: str, clock: Callable[[], float] = time.perf_counter) -> None:
        self.hierarchy = hierarchy
        self.path = os.path.join(hierarchy, f"{self.PREFIX}{os.getpid()}")
        self.clock = clock
        self.broken = False

    def remove_stale(self) -> list[str]:
        """rmdir canaries that sweeps killed between mkdir and rmdir left behind; returns them.

        Only ``runc-guard-canary-<pid>`` of a pid that no longer exists, and
        only if empty (rmdir of a cgroup with a process fails with EBUSY).
        """
        removed: list[str] = []
        try:
            names = os.listdir(self.hierarchy)
        except OSError:
            return removed
        for name in names:
            pid = name[len(self.PREFIX) :]
            if not name.startswith(self.PREFIX) or not pid.isdigit() or pid_exists(int(pid)):
                continue
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(self.hierarchy, name))
                removed.append(name)
        return removed

    def __call__(self) -> float | None:
        if self.broken:
            return None
        started = self.clock()
        try:
            os.mkdir(self.path, 0o755)
        except FileExistsError:
            # Left by an earlier sweep with our pid that died between the two calls.
            self.close()
            return None
        except OSError:
            self.broken = True
            return None
        try:
            os.rmdir(self.path)
        except OSError:
            self.broken = True
            return None
        return self.clock() - started

    def close(self) -> None:
        """Remove the canary if a crash or signal left it between its mkdir and rmdir."""
        with contextlib.suppress(OSError):
            os.rmdir(self.path)


def canary_hierarchy(mounts: Iterable[str]) -> str | None:
    """Where the canary goes: the memory hierarchy (its memcg is the costliest css), else the first."""
    listed = list(mounts)
    for mount in listed:
        if os.path.basename(mount) == "memory":
            return mount
    return listed[0] if listed else None


@dataclass
class NodeSignals:
    """The measurements the adaptive pace reads: seams that unit tests replace."""

    canary: Callable[[], float | None] = lambda: None
    pressure: Callable[[], dict[str, float]] = dict

    def close(self) -> None:
        close = getattr(self.canary, "close", None)
        if callable(close):
            close()


def real_signals(mounts: Iterable[str]) -> NodeSignals:
    """Canary in the memory hierarchy (else the first one) and PSI from /proc/pressure."""
    hierarchy = canary_hierarchy(mounts)
    if hierarchy is None:
        return NodeSignals(lambda: None, read_pressure)
    canary = CgroupCanary(hierarchy)
    canary.remove_stale()
    return NodeSignals(canary, read_pressure)


class RmdirTimer:
    """The cgroup seam with every rmdir timed: the sweep's own latencies are one signal.

    Every other call goes to the wrapped :class:`CgroupFsOps` unchanged.
    """

    def __init__(self, fs: CgroupFsOps, clock: Callable[[], float] = time.perf_counter) -> None:
        self.fs = fs
        self.clock = clock
        self.latencies: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)

    def take(self) -> list[float]:
        """The latencies since the last take."""
        taken, self.latencies = self.latencies, []
        return taken

    def rmdir(self, path: str) -> None:
        started = self.clock()
        try:
            self.fs.rmdir(path)
        finally:  # EBUSY and ENOENT take the same locks: they count too
            self.latencies.append(self.clock() - started)


# -- the acting part: measure, decide, sleep ----------------------------------------


@dataclass
class Step:
    """One batch's pacing, as the sweep report shows it."""

    #: The pause slept after this batch.
    pause: float
    sys_percent: float | None
    canary_ms: float | None
    pressure: dict[str, float]
    action: str
    congested: tuple[str, ...]
    next_batch: int
    next_pause: float


class Pacer:
    """Runs the feedback loop between batches: calibrate once, then measure, decide and sleep."""

    def __init__(
        self,
        settings: PacingSettings,
        signals: NodeSignals,
        *,
        sleep: Callable[[float], None],
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.signals = signals
        self.sleep = sleep
        self.clock = clock
        self.pace = Pace(settings.start_batch, settings.min_pause)
        self.baseline = Baseline()
        self._pressure_at: tuple[float, dict[str, float]] = (0.0, {})

    def calibrate(self) -> Baseline:
        """Idle canary (p50, p90) and PSI shares before the sweep removes anything."""
        samples: list[float] = []
        before, started = self.signals.pressure(), self.clock()
        for i in range(self.settings.calibration):
            latency = self.signals.canary()
            if latency is None:
                break
            samples.append(latency)
            if i + 1 < self.settings.calibration:
                self.sleep(0.01)
        after, elapsed = self.signals.pressure(), self.clock() - started
        self.baseline = Baseline(
            percentile(samples, 50),
            percentile(samples, 90),
            None,
            pressure_share(before, after, elapsed),
        )
        return self.baseline

    def batch_started(self) -> None:
        """Remember PSI totals at the start of a batch (the share covers batch + pause)."""
        self._pressure_at = (self.clock(), self.signals.pressure())

    def between_batches(self, rmdirs: Sequence[float], sys_percent: Callable[[], float | None]) -> Step:
        """After a batch: canary, pause, canary again; then decide the next batch and pause."""
        if self.baseline.rmdir is None and rmdirs:
            # The first batch is small and starts on an idle node: its median is the reference.
            self.baseline = replace(self.baseline, rmdir=statistics.median(rmdirs))
        busy = self.clock() - self._pressure_at[0]
        first = self.signals.canary()  # the teardown the batch just started
        pause = duty_pause(busy, self.pace.pause, self.settings)
        if pause > 0:
            self.sleep(pause)
        second = self.signals.canary()
        canaries = [c for c in (first, second) if c is not None]
        at, totals = self._pressure_at
        signals = Signals(
            first,
            second,
            statistics.median(rmdirs) if rmdirs else None,
            pressure_share(totals, self.signals.pressure(), self.clock() - at),
            sys_percent(),
        )
        decision = next_pace(self.pace, signals, self.baseline, self.settings)
        self.pace = decision.pace
        return Step(
            pause,
            signals.sys_percent,
            round(max(canaries) * 1000, 3) if canaries else None,
            {k: round(v, 3) for k, v in signals.pressure.items()},
            decision.action,
            decision.congested,
            decision.pace.batch,
            decision.pace.pause,
        )
