"""The adaptive pace: its pure decision, its measurements, and the sweep loop it drives (fakes)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runc_guard.cli.sweep import DEFAULT_PACING
from runc_guard.node.discovery import ContainerUnit, Discovery, Hierarchy
from runc_guard.node.pacing import (
    Baseline,
    CgroupCanary,
    NodeSignals,
    Pace,
    Pacer,
    PacingSettings,
    RmdirTimer,
    Signals,
    canary_hierarchy,
    congestion,
    duty_pause,
    next_pace,
    percentile,
    pressure_share,
    read_pressure,
)
from runc_guard.node.sweep import RuntimeDirs, Sweeper, SweepOptions
from tests.fakes import FakeCgroupFs, FakeClock
from tests.hermetic import own_env, own_roots

SETTINGS = PacingSettings(
    start_batch=100,
    min_batch=10,
    max_batch=400,
    increase=100,
    decrease=0.5,
    min_pause=0.05,
    max_pause=2.0,
    canary_ratio=2.0,
    rmdir_ratio=2.0,
    max_pressure=0.25,
    max_sys_percent=30.0,
)
#: Idle canary p90 1 ms (limit 2 ms), first batch's rmdir 0.1 ms (limit 0.2 ms), idle cpu PSI 10 %.
BASE = Baseline(canary_p50=0.0008, canary_p90=0.001, rmdir=0.0001, pressure={"cpu": 0.10})
CALM = Signals(0.0009, 0.0009, 0.0001, {"cpu": 0.2}, 20.0)


# -- decide (pure) -----------------------------------------------------------------


def test_calm_signals_are_not_congestion() -> None:
    """Every reading under its limit: nothing is over."""
    assert congestion(CALM, BASE, SETTINGS) == ()


@pytest.mark.parametrize(
    ("signals", "expected"),
    [
        (Signals(canary_after=0.0021), ("canary:after",)),
        (Signals(canary_before=0.0021), ("canary:before",)),
        (Signals(canary_after=0.003, canary_before=0.003), ("canary:after", "canary:before")),
        (Signals(rmdir_p50=0.00021), ("rmdir",)),
        (Signals(pressure={"cpu": 0.36, "io": 0.9}), ("pressure:cpu",)),  # io has no baseline
        (Signals(sys_percent=30.1), ("sys",)),
        (Signals(canary_after=0.002, rmdir_p50=0.0002, pressure={"cpu": 0.35}, sys_percent=30.0), ()),
    ],
)
def test_congestion_names_each_signal_over_its_limit(signals: Signals, expected: tuple[str, ...]) -> None:
    """A signal counts only strictly above its limit, relative to its idle baseline."""
    assert congestion(signals, BASE, SETTINGS) == expected


def test_no_baseline_no_congestion() -> None:
    """Without a canary, rmdir or PSI baseline (no cgroup to make, no PSI) only sys% can be over."""
    loud = Signals(1.0, 1.0, 1.0, {"cpu": 1.0}, 10.0)
    assert congestion(loud, Baseline(), SETTINGS) == ()
    assert congestion(Signals(sys_percent=99.0), Baseline(), SETTINGS) == ("sys",)


def test_calm_grows_the_batch_additively_and_shrinks_the_pause() -> None:
    """Calm: +increase dirs per batch up to max_batch; the pause halves down to its floor."""
    pace = Pace(100, 0.8)
    seen = []
    for _ in range(5):
        decision = next_pace(pace, CALM, BASE, SETTINGS)
        assert decision.action == "grow" and decision.congested == ()
        pace = decision.pace
        seen.append((pace.batch, pace.pause))
    assert seen == [(200, 0.4), (300, 0.2), (400, 0.1), (400, 0.05), (400, 0.05)]


def test_slow_canary_after_the_batch_shrinks_it_only() -> None:
    """The burst's teardown hurt but the node recovered within the pause: smaller batch, same pause."""
    decision = next_pace(Pace(400, 0.1), Signals(canary_after=0.005, canary_before=0.0009), BASE, SETTINGS)
    assert (decision.action, decision.pace) == ("shrink", Pace(200, 0.1))


@pytest.mark.parametrize("signals", [Signals(canary_before=0.005), Signals(rmdir_p50=0.001)])
def test_sustained_harm_backs_off_batch_and_pause(signals: Signals) -> None:
    """Still slow after the pause, or the sweep's own rmdirs slowed: halve the batch, double the pause."""
    decision = next_pace(Pace(400, 0.1), signals, BASE, SETTINGS)
    assert (decision.action, decision.pace) == ("back_off", Pace(200, 0.2))


def test_back_off_is_bounded() -> None:
    """Repeated back-offs end at min_batch and max_pause: the sweep slows down but never stops."""
    pace = Pace(400, 0.05)
    for _ in range(20):
        pace = next_pace(pace, Signals(canary_before=1.0), BASE, SETTINGS).pace
    assert pace == Pace(SETTINGS.min_batch, SETTINGS.max_pause)


@pytest.mark.parametrize("signals", [Signals(sys_percent=80.0), Signals(pressure={"cpu": 0.9})])
def test_node_wide_load_holds_the_pace(signals: Signals) -> None:
    """sys% or PSI over (other tenants count there too): the batch stays, the pause shrinks back."""
    decision = next_pace(Pace(300, 0.2), signals, BASE, SETTINGS)
    assert (decision.action, decision.pace) == ("hold", Pace(300, 0.1))


def test_harm_wins_over_hold() -> None:
    """With both a node-wide and a harm signal over, the harm decides."""
    signals = Signals(canary_before=0.01, sys_percent=90.0)
    decision = next_pace(Pace(300, 0.2), signals, BASE, SETTINGS)
    assert decision.action == "back_off"
    assert decision.congested == ("canary:before", "sys")


def test_duty_pause_keeps_the_removal_share_bounded() -> None:
    """At max_duty 0.3 a batch that took 0.3 s is followed by >= 0.7 s; a quick one by the pace's pause."""
    settings = PacingSettings(max_duty=0.3)
    assert duty_pause(0.3, 0.05, settings) == pytest.approx(0.7)
    assert duty_pause(0.01, 0.05, settings) == 0.05
    assert duty_pause(0.0, 0.2, settings) == 0.2
    assert duty_pause(5.0, 0.05, PacingSettings(max_duty=1.0)) == 0.05


def test_percentile_and_pressure_share() -> None:
    """Nearest-rank percentiles; PSI share is stall time over elapsed time, per resource in both."""
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(x) for x in range(1, 101)], 99) == 99.0
    assert pressure_share({"cpu": 1.0, "io": 2.0}, {"cpu": 1.5, "memory": 9.0}, 2.0) == {"cpu": 0.25}
    assert pressure_share({"cpu": 1.0}, {"cpu": 2.0}, 0.0) == {}


# -- measure (seams) ------------------------------------------------------------------


def test_read_pressure_parses_some_totals(tmp_path: Path) -> None:
    """The "some" line's total (microseconds) per resource; a missing file is a kernel without it."""
    (tmp_path / "cpu").write_text(
        "some avg10=1.00 avg60=0.50 avg300=0.10 total=2500000\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=7\n"
    )
    (tmp_path / "io").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=125\n")
    assert read_pressure(str(tmp_path)) == {"cpu": 2.5, "io": 0.000125}
    assert read_pressure(str(tmp_path / "absent")) == {}


def test_canary_times_mkdir_and_rmdir_and_leaves_nothing(tmp_path: Path) -> None:
    """Each call makes and removes its own directory and returns how long that took."""
    ticks = itertools.count(0.0, 0.5)
    canary = CgroupCanary(str(tmp_path), clock=lambda: next(ticks))
    assert canary() == 0.5
    assert os.listdir(tmp_path) == []
    assert os.path.basename(canary.path) == f"runc-guard-canary-{os.getpid()}"


def test_canary_that_cannot_be_made_reads_none(tmp_path: Path) -> None:
    """No hierarchy (or no permission): None, and no further attempts."""
    canary = CgroupCanary(str(tmp_path / "absent"))
    assert canary() is None
    (tmp_path / "absent").mkdir()
    assert canary() is None


def test_canary_left_over_is_removed(tmp_path: Path) -> None:
    """A canary left by a crash with our pid is removed; that call reads None, the next works."""
    canary = CgroupCanary(str(tmp_path))
    os.mkdir(canary.path)
    assert canary() is None
    assert not os.path.exists(canary.path)
    assert canary() is not None


def test_stale_canaries_of_dead_sweeps_are_removed(tmp_path: Path) -> None:
    """A canary whose pid is gone is removed; ours, a live pid's and anything else stay."""
    child = subprocess.Popen(["true"])
    child.wait()  # reaped: its pid no longer exists
    for name in (
        f"runc-guard-canary-{child.pid}",
        f"runc-guard-canary-{os.getpid()}",
        "runc-guard-canary-1",
        "runc-guard-canary-x",
        "kubepods",
    ):
        (tmp_path / name).mkdir()
    assert CgroupCanary(str(tmp_path)).remove_stale() == [f"runc-guard-canary-{child.pid}"]
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["kubepods", "runc-guard-canary-1", "runc-guard-canary-x", f"runc-guard-canary-{os.getpid()}"]
    )


def test_canary_hierarchy_prefers_memory() -> None:
    """memory (the costliest css to make) if mounted, else the first hierarchy, else none."""
    assert canary_hierarchy(["/cg/cpu", "/cg/memory", "/cg/pids"]) == "/cg/memory"
    assert canary_hierarchy(["/cg/unified"]) == "/cg/unified"
    assert canary_hierarchy([]) is None


def test_rmdir_timer_times_every_rmdir_and_delegates(clock: FakeClock) -> None:
    """Successful and failed rmdirs are timed; everything else goes to the wrapped seam."""
    fs = FakeCgroupFs(clock)
    fs.add("/cg/a")
    fs.add("/cg/a/b")
    ticks = itertools.count(0.0, 0.001)
    timer = RmdirTimer(fs, clock=lambda: next(ticks))
    assert timer.children("/cg/a") == ["/cg/a/b"]
    assert timer.pid_dying(4242) == fs.pid_dying(4242)
    with pytest.raises(OSError, match="busy"):
        timer.rmdir("/cg/a")  # EBUSY: it has a child
    timer.stop_load_balance("/cg/a/b")  # delegated, not timed as an rmdir
    assert fs.load_balance_stopped == ["/cg/a/b"]
    timer.rmdir("/cg/a/b")
    assert timer.take() == pytest.approx([0.001, 0.001])
    assert timer.take() == []
    assert fs.rmdirs == ["/cg/a/b"]


# -- the pacer and the sweep loop against fakes ----------------------------------------------


class FakeNode:
    """Fake time and node: sleeps advance the clock; canary latencies and PSI totals are scripted."""

    def __init__(self, canaries: Iterator[float | None] | None = None) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.canaries = canaries if canaries is not None else itertools.repeat(0.0001)
        self.stalled = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def canary(self) -> float | None:
        return next(self.canaries)

    def pressure(self) -> dict[str, float]:
        """Some task stalls 10 % of the time."""
        return {"cpu": self.now * 0.1}

    def cpu(self) -> tuple[float, float]:
        return self.now * 0.1, self.now + 1.0

    def signals(self) -> NodeSignals:
        return NodeSignals(self.canary, self.pressure)


def test_calibration_measures_the_idle_node() -> None:
    """Canary p50/p90 from the calibration samples (10 ms apart) and the idle PSI share."""
    node = FakeNode(iter([0.001 * n for n in range(1, 11)]))
    pacer = Pacer(PacingSettings(calibration=10), node.signals(), sleep=node.sleep, clock=node.clock)
    baseline = pacer.calibrate()
    assert baseline.canary_p50 == pytest.approx(0.005)  # nearest rank of 10 samples
    assert baseline.canary_p90 == pytest.approx(0.009)
    assert baseline.pressure == {"cpu": pytest.approx(0.1)}
    assert node.sleeps == [0.01] * 9


def test_calibration_without_a_canary() -> None:
    """No canary (None): no canary baseline, and calibration stops at once."""
    node = FakeNode(itertools.repeat(None))
    pacer = Pacer(SETTINGS, node.signals(), sleep=node.sleep, clock=node.clock)
    assert pacer.calibrate().canary_p90 is None
    assert node.sleeps == []


def test_between_batches_measures_around_the_pause() -> None:
    """Canary, pause, canary; the first batch's median rmdir becomes the rmdir baseline."""
    node = FakeNode(iter([0.001] * 20 + [0.0011, 0.0012]))
    pacer = Pacer(SETTINGS, node.signals(), sleep=node.sleep, clock=node.clock)
    pacer.calibrate()
    pacer.batch_started()
    node.sleeps.clear()
    step = pacer.between_batches([0.0001, 0.0002, 0.0003], lambda: 12.5)
    assert pacer.baseline.rmdir == 0.0002
    assert node.sleeps == [SETTINGS.min_pause]
    assert (step.action, step.next_batch, step.canary_ms, step.sys_percent) == ("grow", 200, 1.2, 12.5)


FAKE_HIERARCHIES = [Hierarchy(f"/cg/{h}", "cgroup") for h in ("memory", "pids")]
POD = "kubepods/burstable/pod22222222"


class OldFs(FakeCgroupFs):
    """Every directory is an hour old, so the sweep may remove it."""

    def modified_at(self, path: str) -> float | None:
        return 0.0 if path in self.dirs else None


def leaked(fs: OldFs, count: int) -> Discovery:
    units = {}
    for n in range(count):
        cid = f"{n:064x}"
        unit = ContainerUnit(cid, pod=POD)
        for h in FAKE_HIERARCHIES:
            path = f"{h.mount}/{POD}/{cid}"
            fs.add(path)
            unit.dirs.append(path)
        units[cid] = unit
    return Discovery(FAKE_HIERARCHIES, units)


def adaptive_sweeper(fs: OldFs, node: FakeNode, tmp_path: Path, **settings: object) -> Sweeper:
    small: dict[str, object] = {"start_batch": 4, "increase": 4, "max_batch": 12, "min_batch": 2}
    pacing = PacingSettings(**{**small, "calibration": 5, **settings})  # type: ignore[arg-type]
    return Sweeper(
        fs,
        RuntimeDirs(str(tmp_path / "runc"), str(tmp_path / "bundles")),
        SweepOptions(min_age=60, pacing="adaptive", pacing_settings=pacing, max_sys_percent=100),
        clock=node.clock,
        wall=lambda: 3600.0,
        sleep=node.sleep,
        cpu=node.cpu,
        signals=node.signals(),
    )


def test_adaptive_sweep_grows_batches_while_calm(clock: FakeClock, tmp_path: Path) -> None:
    """A calm node: batches of 4, 8, 12, 12... dirs (2 per unit), every unit removed, pauses at the floor."""
    fs = OldFs(clock)
    discovery = leaked(fs, 20)  # 40 dirs
    node = FakeNode()
    report = adaptive_sweeper(fs, node, tmp_path).run(discovery)
    assert report.removed == 20 and report.dirs_removed == 40
    assert not any(path.endswith(tuple(discovery.units)) for path in fs.dirs)
    assert [b.target for b in report.batches] == [4, 8, 12, 12, 12]
    assert [b.dirs_removed for b in report.batches] == [4, 8, 12, 12, 4]
    assert [b.decision for b in report.batches] == ["grow"] * 4 + [""]
    assert report.pacing == "adaptive"
    assert report.baseline["canary_p90_ms"] == 0.1
    assert report.batches[0].canary_ms == 0.1
    assert report.batches[0].pressure == {"cpu": pytest.approx(0.1)}
    assert node.sleeps == [0.01] * 4 + [0.05] * 4  # calibration, then one pause per batch but the last


def test_adaptive_sweep_backs_off_when_the_canary_stays_slow(clock: FakeClock, tmp_path: Path) -> None:
    """Canaries at 10x idle after calibration: batches shrink to min, pauses double to max; all removed."""
    fs = OldFs(clock)
    discovery = leaked(fs, 8)
    node = FakeNode(itertools.chain([0.0001] * 5, itertools.repeat(0.001)))
    report = adaptive_sweeper(fs, node, tmp_path, max_pause=0.4).run(discovery)
    assert report.removed == 8
    assert [b.target for b in report.batches] == [4, 2, 2, 2, 2, 2, 2]  # 16 dirs
    assert [b.pause for b in report.batches] == [0.05, 0.1, 0.2, 0.4, 0.4, 0.4, 0.0]
    assert {d for b in report.batches[:-1] for d in b.congested} == {"canary:after", "canary:before"}
    assert report.slowed == pytest.approx(0.05 + 0.15 + 3 * 0.35)


class SlowRmdirFs(OldFs):
    """Every rmdir takes 10 ms of the fake node's time."""

    def __init__(self, clock: FakeClock, node: FakeNode) -> None:
        super().__init__(clock)
        self.node = node

    def rmdir(self, path: str) -> None:
        super().rmdir(path)
        self.node.now += 0.01


def test_adaptive_sweep_pauses_in_proportion_to_the_batch(clock: FakeClock, tmp_path: Path) -> None:
    """A calm node still gets (1 - duty) / duty of each batch's time to itself: 4 dirs x 10 ms -> 0.0933 s."""
    node = FakeNode()
    fs = SlowRmdirFs(clock, node)
    discovery = leaked(fs, 6)  # 12 dirs: batches of 4, 8
    report = adaptive_sweeper(fs, node, tmp_path, max_duty=0.3).run(discovery)
    assert report.removed == 6
    assert [b.dirs_removed for b in report.batches] == [4, 8]
    assert report.batches[0].pause == pytest.approx(0.04 * 0.7 / 0.3, abs=1e-4)
    assert node.sleeps[-1] == report.batches[0].pause


def test_fixed_sweep_reports_rmdir_latencies(clock: FakeClock, tmp_path: Path) -> None:
    """The fixed pace keeps its batches and pause, and its report gains the rmdir latencies."""
    fs = OldFs(clock)
    discovery = leaked(fs, 5)
    node = FakeNode()
    report = Sweeper(
        fs,
        RuntimeDirs(str(tmp_path), str(tmp_path)),
        SweepOptions(min_age=60, batch=4, pause=0.5, max_sys_percent=100, pacing="fixed"),
        clock=node.clock,
        wall=lambda: 3600.0,
        sleep=node.sleep,
        cpu=node.cpu,
    ).run(discovery)
    assert report.pacing == "fixed" and report.baseline == {}
    assert [b.target for b in report.batches] == [4, 4, 4]
    assert node.sleeps == [0.5, 0.5]
    assert all(b.rmdir_p50_ms is not None for b in report.batches)
    assert all(b.canary_ms is None and b.decision == "" for b in report.batches)


CTL = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")


@pytest.mark.parametrize("pacing", ["fixed", "adaptive"])
def test_cli_accepts_pacing(tmp_path: Path, pacing: str) -> None:
    """--pacing fixed|adaptive reaches the report; an empty sweep is still exit 0."""
    done = subprocess.run(
        [
            CTL,
            "sweep",
            "--kubepods",
            "rgsweep-absent-tree",
            *own_roots(tmp_path),
            "--pacing",
            pacing,
            "--max-batch",
            "50",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        env=own_env(tmp_path),
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["found"] == 0


def _empty_sweep(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [CTL, "sweep", "--kubepods", "rgsweep-absent-tree", *own_roots(tmp_path), "--format", "json",
            *args]  # fmt: skip
    env = own_env(tmp_path)
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)


def test_adaptive_is_the_default_pacing(tmp_path: Path) -> None:
    """Without --pacing the sweep paces itself (docs/sweep-pacing.md), in the CLI and the API."""
    assert DEFAULT_PACING == SweepOptions().pacing == "adaptive"
    done = _empty_sweep(tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["pacing"] == "adaptive"
    assert "warning" not in done.stderr


@pytest.mark.parametrize(
    ("args", "warned"),
    [
        (("--pause", "0"), True),
        (("--batch", "100", "--pacing", "adaptive"), True),
        (("--pause", "0", "--pacing", "fixed"), False),
    ],
)
def test_fixed_only_options_warn_under_adaptive(tmp_path: Path, args: tuple[str, ...], warned: bool) -> None:
    """--batch/--pause given to an adaptive sweep are named on stderr, not silently ignored."""
    done = _empty_sweep(tmp_path, *args)
    assert done.returncode == 0, done.stderr
    assert ("only apply to --pacing fixed" in done.stderr) is warned


def test_cli_rejects_unknown_pacing(tmp_path: Path) -> None:
    """--pacing must be fixed or adaptive: a usage error otherwise."""
    done = subprocess.run(
        [CTL, "sweep", "--pacing", "fast"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert "fixed" in done.stderr and "adaptive" in done.stderr
