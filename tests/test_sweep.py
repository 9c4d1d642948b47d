"""The sweep's decisions (pure) and its acting loop against a fake kernel."""

from __future__ import annotations

import errno
import itertools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from runc_guard.delete.pending import PendingRecord, write_record
from runc_guard.errors import EXIT_SWEEP_LOCKED, SweepLocked
from runc_guard.node.discovery import ContainerUnit, Discovery, Hierarchy
from runc_guard.node.sweep import (
    MIN_SLOWDOWN_STEP,
    RuntimeDirs,
    Sweeper,
    SweepOptions,
    UnitFacts,
    decide,
    read_facts,
    slowdown_step,
    sweep_lock,
    sys_percent,
)
from tests.fakes import FakeCgroupFs, FakeClock
from tests.hermetic import own_env, own_roots

NOW = 10_000.0
HIERARCHIES = [Hierarchy(f"/cg/{h}", "cgroup") for h in ("memory", "pids", "systemd")]
POD = "kubepods/burstable/pod11111111"


class AgedFs(FakeCgroupFs):
    """The shared fake kernel plus directory ages (mtime), defaulting to an hour old."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.mtimes: dict[str, float] = {}

    def modified_at(self, path: str) -> float | None:
        if path not in self.dirs:
            return None
        return self.mtimes.get(path, NOW - 3600)


def cid(n: int) -> str:
    return f"{n:064x}"


def add_unit(fs: AgedFs, n: int, hierarchies: list[Hierarchy] = HIERARCHIES) -> ContainerUnit:
    unit = ContainerUnit(cid(n), pod=POD)
    for h in hierarchies:
        path = f"{h.mount}/{POD}/{cid(n)}"
        fs.add(path)
        unit.dirs.append(path)
    return unit


@pytest.fixture
def fs(clock: FakeClock) -> AgedFs:
    return AgedFs(clock)


@pytest.fixture
def runtime(tmp_path: Path) -> RuntimeDirs:
    return RuntimeDirs(str(tmp_path / "runc"), str(tmp_path / "bundles"))


class Recorder:
    """Fake time for the loop: sleeps advance the clock; sys% is what the test says."""

    def __init__(self, sys_percents: list[float] | None = None) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.percents = list(sys_percents or [])
        self.system = 0.0
        self.total = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def cpu(self) -> tuple[float, float]:
        """Each sample adds 1 s of CPU time, the next listed percentage of it system time."""
        percent = self.percents.pop(0) if self.percents else 0.0
        self.system += percent / 100.0
        self.total += 1.0
        return self.system, self.total


def sweeper(fs: AgedFs, runtime: RuntimeDirs, rec: Recorder, **options: object) -> Sweeper:
    """The loop with fake time; the fixed pace unless a test asks (adaptive has its own tests)."""
    options.setdefault("pacing", "fixed")
    return Sweeper(
        fs, runtime, SweepOptions(**options),  # type: ignore[arg-type]
        clock=rec.clock, wall=lambda: NOW, sleep=rec.sleep, cpu=rec.cpu,
    )


# -- decide --------------------------------------------------------------------


FLAGS = list(itertools.product([False, True], repeat=6))


@pytest.mark.parametrize(("unsafe", "present", "populated", "state", "bundle", "young"), FLAGS)
def test_decide_removes_only_when_every_condition_holds(
    unsafe: bool, present: bool, populated: bool, state: bool, bundle: bool, young: bool
) -> None:
    """Every combination: removal iff safe, present, empty, no state, no bundle and old enough."""
    facts = UnitFacts(
        present=("/cg/memory/x",) if present else (),
        populated=("/cg/memory/x",) if populated and present else (),
        has_state=state,
        has_bundle=bundle,
        newest=(NOW - 10 if young else NOW - 61) if present else None,
        unsafe="bad" if unsafe else None,
    )
    verdict = decide(facts, NOW, 60)
    should_remove = not unsafe and present and not populated and not state and not bundle and not young
    assert (verdict.action == "remove") == should_remove
    if unsafe:
        assert verdict == type(verdict)("keep", "unsafe_path")
    elif not present:
        assert verdict.action == "forget"
    elif not should_remove:
        assert verdict.action == "keep"


@pytest.mark.parametrize(
    ("facts", "reason"),
    [
        (UnitFacts(("a",), ("a",), True, True, NOW), "populated"),
        (UnitFacts(("a",), (), True, True, NOW), "runtime_state"),
        (UnitFacts(("a",), (), False, True, NOW), "bundle"),
        (UnitFacts(("a",), (), False, False, NOW - 59.9), "too_young"),
    ],
)
def test_decide_names_the_first_reason_to_keep(facts: UnitFacts, reason: str) -> None:
    """The reason reported is the most telling one: processes, then state, bundle, age."""
    assert decide(facts, NOW, 60).reason == reason


def test_decide_min_age_boundary() -> None:
    """Exactly min_age old is old enough; a hair younger is not."""
    assert decide(UnitFacts(("a",), (), False, False, NOW - 60), NOW, 60).action == "remove"
    assert decide(UnitFacts(("a",), (), False, False, NOW - 59.99), NOW, 60).action == "keep"


def test_sys_percent() -> None:
    """System share of the total CPU time between two samples; None when no time passed."""
    assert sys_percent((10.0, 100.0), (13.0, 110.0)) == pytest.approx(30.0)
    assert sys_percent((10.0, 100.0), (10.0, 100.0)) is None


def test_slowdown_step_doubles_within_cap() -> None:
    """Above the limit the waits go pause, pause, 2x, 4x ... and never past the cap in total."""
    steps, slowed = [], 0.0
    while (step := slowdown_step(80.0, 30.0, slowed, 10.0, 1.0)) > 0:
        steps.append(step)
        slowed += step
    assert steps == [1.0, 1.0, 2.0, 4.0, 2.0]
    assert sum(steps) == 10.0


@pytest.mark.parametrize(
    ("percent", "expected"), [(None, 0.0), (30.0, 0.0), (12.0, 0.0), (30.1, MIN_SLOWDOWN_STEP)]
)
def test_slowdown_step_only_above_limit(percent: float | None, expected: float) -> None:
    """At or below the limit (or unknown) nothing waits; above it, at least MIN_SLOWDOWN_STEP."""
    assert slowdown_step(percent, 30.0, 0.0, 60.0, 0.0) == expected


# -- read ------------------------------------------------------------------------


def test_runtime_dirs_state_and_bundle(runtime: RuntimeDirs, tmp_path: Path) -> None:
    """State and bundle are found in any namespace; a record's own root counts too; absent roots are fine."""
    assert not runtime.has_state(cid(1)) and not runtime.has_bundle(cid(1))
    (tmp_path / "runc" / "k8s.io" / cid(1)).mkdir(parents=True)
    (tmp_path / "bundles" / "moby" / cid(2)).mkdir(parents=True)
    (tmp_path / "private" / cid(3)).mkdir(parents=True)
    assert runtime.has_state(cid(1)) and not runtime.has_bundle(cid(1))
    assert runtime.has_bundle(cid(2)) and not runtime.has_state(cid(2))
    assert runtime.has_state(cid(3), str(tmp_path / "private"))
    assert not runtime.has_state(cid(3))


def test_read_facts_sees_children_and_skips_missing(fs: AgedFs, runtime: RuntimeDirs) -> None:
    """A populated child makes the unit populated; a hierarchy without the dir is just absent."""
    unit = add_unit(fs, 1, HIERARCHIES[:2])
    unit.dirs.append(f"/cg/systemd/{POD}/{cid(1)}")  # not there
    child = f"/cg/pids/{POD}/{cid(1)}/nested"
    fs.add(child, [77])
    fs.mtimes[child] = NOW - 5
    facts = read_facts(unit, fs, runtime)
    assert set(facts.present) == {*unit.dirs[:2], child}
    assert facts.present.index(child) < facts.present.index(unit.dirs[1])
    assert facts.populated == (child,)
    assert facts.newest == NOW - 5


# -- act -------------------------------------------------------------------------


def discovery_of(*units: ContainerUnit) -> Discovery:
    return Discovery(HIERARCHIES, {u.container_id: u for u in units})


def test_sweep_removes_orphans_and_keeps_survivors(
    fs: AgedFs, runtime: RuntimeDirs, tmp_path: Path
) -> None:
    """Orphans go in every hierarchy; each survivor stays in every hierarchy with its reason."""
    orphans = [add_unit(fs, n) for n in range(1, 6)]
    populated = add_unit(fs, 10)
    fs.dirs[populated.dirs[1]] = [555]  # one process, in one hierarchy only
    fs.alive.add(555)
    stateful = add_unit(fs, 11)
    (tmp_path / "runc" / "k8s.io" / cid(11)).mkdir(parents=True)
    bundled = add_unit(fs, 12)
    (tmp_path / "bundles" / "k8s.io" / cid(12)).mkdir(parents=True)
    young = add_unit(fs, 13)
    fs.mtimes[young.dirs[2]] = NOW - 1
    survivors = [populated, stateful, bundled, young]
    pod_dirs = {f"{h.mount}/{POD}" for h in HIERARCHIES}
    for d in pod_dirs:
        fs.add(d)
    report = sweeper(fs, runtime, Recorder()).run(discovery_of(*orphans, *survivors))
    assert all(d not in fs.dirs for u in orphans for d in u.dirs)
    assert all(d in fs.dirs for u in survivors for d in u.dirs)
    assert pod_dirs <= set(fs.dirs)
    assert (report.found, report.candidates, report.removed, report.dirs_removed) == (9, 5, 5, 15)
    assert report.kept == {"populated": 1, "runtime_state": 1, "bundle": 1, "too_young": 1}
    assert report.errors == []


def test_dry_run_changes_nothing(fs: AgedFs, runtime: RuntimeDirs, tmp_path: Path) -> None:
    """A dry run removes no directory and no record, and lists what it would remove."""
    units = [add_unit(fs, n) for n in range(1, 4)]
    record = write_record(
        str(tmp_path / "pending"),
        PendingRecord(cid(1), "/run/x", units[0].dirs, 1, 1, "runc", 0.0),
    )
    units[0].record = record
    before = dict(fs.dirs)
    report = sweeper(fs, runtime, Recorder(), dry_run=True).run(discovery_of(*units))
    assert fs.dirs == before and fs.rmdirs == []
    assert os.path.exists(record)
    assert report.candidates == 3 and report.removed == 0
    assert sorted(c["id"] for c in report.containers if c["action"] == "would_remove") == [
        cid(1), cid(2), cid(3)
    ]


def test_batches_and_pauses(fs: AgedFs, runtime: RuntimeDirs) -> None:
    """Batches close once they hold --batch dirs (whole units only); a pause follows each but the last."""
    units = [add_unit(fs, n) for n in range(1, 8)]  # 3 dirs each, 21 dirs
    rec = Recorder()
    report = sweeper(fs, runtime, rec, batch=6, pause=0.5, max_sys_percent=100).run(
        discovery_of(*units)
    )
    assert [b.dirs_removed for b in report.batches] == [6, 6, 6, 3]
    assert [b.containers for b in report.batches] == [2, 2, 2, 1]
    assert rec.sleeps == [0.5, 0.5, 0.5]
    assert [b.pause for b in report.batches] == [0.5, 0.5, 0.5, 0.0]
    for earlier, later in itertools.pairwise(report.batches):
        assert later.started >= earlier.finished + 0.5


def test_batch_smaller_than_a_unit_still_removes_whole_units(fs: AgedFs, runtime: RuntimeDirs) -> None:
    """--batch 1 means one container per batch, never half a container."""
    units = [add_unit(fs, n) for n in range(1, 4)]
    report = sweeper(fs, runtime, Recorder(), batch=1, pause=0).run(discovery_of(*units))
    assert [b.dirs_removed for b in report.batches] == [3, 3, 3]


def test_high_sys_percent_slows_down(fs: AgedFs, runtime: RuntimeDirs) -> None:
    """While sys% stays above the limit the wait doubles up to --max-slowdown, then the sweep goes on."""
    units = [add_unit(fs, n) for n in range(1, 3)]
    # cpu() samples: batch start, after pause (90%), after each slowdown step.
    rec = Recorder([0, 90, 0, 90, 0, 90, 0, 90, 0, 90, 0, 90])
    report = sweeper(fs, runtime, rec, batch=3, pause=1.0, max_sys_percent=30, max_slowdown=5).run(
        discovery_of(*units)
    )
    assert rec.sleeps == [1.0, 1.0, 1.0, 2.0, 1.0]
    assert report.batches[0].slowed == 5.0
    assert report.slowed == 5.0
    assert report.removed == 2


def test_slowdown_ends_when_sys_percent_drops(fs: AgedFs, runtime: RuntimeDirs) -> None:
    """One step below the limit is enough to continue."""
    units = [add_unit(fs, n) for n in range(1, 3)]
    rec = Recorder([0, 90, 0, 10])
    report = sweeper(fs, runtime, rec, batch=3, pause=0, max_sys_percent=30).run(discovery_of(*units))
    assert rec.sleeps == [MIN_SLOWDOWN_STEP]
    assert report.batches[0].sys_percent is not None and report.batches[0].sys_percent > 30


def test_recheck_right_before_removal(fs: AgedFs, runtime: RuntimeDirs, tmp_path: Path) -> None:
    """A unit that gains a process or runtime state after planning is kept, not removed."""
    units = [add_unit(fs, n) for n in range(1, 4)]
    rec = Recorder()
    real_sleep = rec.sleep

    def sleep_and_change(seconds: float) -> None:
        real_sleep(seconds)
        fs.dirs[units[1].dirs[0]] = [999]
        fs.alive.add(999)
        (tmp_path / "runc" / "k8s.io" / cid(3)).mkdir(parents=True, exist_ok=True)

    rec.sleep = sleep_and_change  # type: ignore[method-assign]
    report = sweeper(fs, runtime, rec, batch=3, pause=0.1).run(discovery_of(*units))
    assert report.removed == 1
    assert report.kept == {"populated": 1, "runtime_state": 1}
    assert all(d in fs.dirs for d in units[1].dirs + units[2].dirs)


def test_records_are_finished(fs: AgedFs, runtime: RuntimeDirs, tmp_path: Path) -> None:
    """A removed unit's record is deleted; a record whose dirs are all gone is cleared too."""
    pending = str(tmp_path / "pending")
    removed = add_unit(fs, 1)
    gone = ContainerUnit(cid(2), dirs=[f"/cg/memory/{POD}/{cid(2)}"], pod=POD)
    kept = add_unit(fs, 3)
    fs.dirs[kept.dirs[0]] = [1234]
    fs.alive.add(1234)
    for unit in (removed, gone, kept):
        unit.record = write_record(
            pending, PendingRecord(unit.container_id, "/run/x", unit.dirs, 1, 1, "runc", 0.0)
        )
    report = sweeper(fs, runtime, Recorder()).run(discovery_of(removed, gone, kept))
    assert not os.path.exists(removed.record or "")
    assert not os.path.exists(gone.record or "")
    assert os.path.exists(kept.record or "")
    assert (report.removed, report.gone, report.records_cleared) == (1, 1, 2)


def test_unsafe_unit_is_kept_and_record_errors_reported(fs: AgedFs, runtime: RuntimeDirs) -> None:
    """An unsafe record keeps its unit; record errors from discovery appear in the report."""
    unit = add_unit(fs, 1)
    unit.unsafe = "refusing cgroup path"
    discovery = discovery_of(unit)
    discovery.record_errors["/pending/x.json"] = "malformed record"
    report = sweeper(fs, runtime, Recorder()).run(discovery)
    assert all(d in fs.dirs for d in unit.dirs)
    assert report.kept == {"unsafe_path": 1}
    assert report.errors == ["/pending/x.json: malformed record"]


def test_rmdir_errors_are_reported_and_the_sweep_goes_on(fs: AgedFs, runtime: RuntimeDirs) -> None:
    """EROFS on one unit is an error in the report; EBUSY is 'busy'; the others are still removed."""
    units = [add_unit(fs, n) for n in range(1, 4)]
    fs.rmdir_errors[units[0].dirs[0]] = errno.EROFS
    fs.rmdir_errors[units[1].dirs[1]] = errno.EBUSY
    report = sweeper(fs, runtime, Recorder()).run(discovery_of(*units))
    assert report.removed == 1
    assert report.kept == {"busy": 1}
    assert len(report.errors) == 1 and "EROFS" in report.errors[0]
    assert all(d not in fs.dirs for d in units[2].dirs)


class CountingFs(AgedFs):
    """AgedFs that counts the sweep's looks: cgroup.procs reads and child listings per path."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.procs_reads: dict[str, int] = {}
        self.listings: dict[str, int] = {}
        #: Runs before each rmdir: a test makes the node change between the look and the removal.
        self.before_rmdir: Callable[[str], None] = lambda path: None

    def read_procs(self, path: str) -> list[int]:
        self.procs_reads[path] = self.procs_reads.get(path, 0) + 1
        return super().read_procs(path)

    def children(self, path: str) -> list[str]:
        self.listings[path] = self.listings.get(path, 0) + 1
        return super().children(path)

    def rmdir(self, path: str) -> None:
        self.before_rmdir(path)
        listed = dict(self.listings)
        try:
            super().rmdir(path)
        finally:
            self.listings = listed  # the fake kernel's own EBUSY check is no look of the sweep's


def test_each_directory_is_read_once_before_its_removal(clock: FakeClock, runtime: RuntimeDirs) -> None:
    """One look per directory (cgroup.procs and children), then rmdir: no second read before removing."""
    fs = CountingFs(clock)
    units = [add_unit(fs, n) for n in range(1, 4)]
    child = f"{units[0].dirs[1]}/nested"
    fs.add(child)
    report = sweeper(fs, runtime, Recorder(), batch=3, pause=0).run(discovery_of(*units))
    dirs = [d for u in units for d in u.dirs] + [child]
    assert report.removed == 3 and report.dirs_removed == len(dirs)
    assert fs.procs_reads == dict.fromkeys(dirs, 1)
    assert fs.listings == dict.fromkeys(dirs, 1)
    assert fs.rmdirs.index(child) < fs.rmdirs.index(units[0].dirs[1])


def test_unit_with_a_process_is_kept_whole_and_reported(clock: FakeClock, runtime: RuntimeDirs) -> None:
    """A process in one nested child of one hierarchy keeps every directory of its unit, with the reason."""
    fs = CountingFs(clock)
    units = [add_unit(fs, n) for n in range(1, 4)]
    child = f"{units[1].dirs[2]}/nested"
    fs.add(child, [4242])
    report = sweeper(fs, runtime, Recorder(), batch=3, pause=0).run(discovery_of(*units))
    assert report.removed == 2
    assert report.kept == {"populated": 1}
    assert {"id": cid(2), "pod": POD, "dirs": 4, "action": "kept:populated"} in report.containers
    assert not {*units[1].dirs, child} & set(fs.rmdirs)
    assert all(d in fs.dirs for d in [*units[1].dirs, child])


def test_process_that_arrives_after_the_look_keeps_its_dir_busy(
    clock: FakeClock, runtime: RuntimeDirs
) -> None:
    """A process that moves in between the look and the rmdir: the kernel refuses (EBUSY); kept as busy."""
    fs = CountingFs(clock)
    units = [add_unit(fs, n) for n in range(1, 3)]
    late = units[0].dirs[2]

    def arrive(path: str) -> None:
        if path == units[0].dirs[0]:
            fs.dirs[late] = [777]
            fs.alive.add(777)

    fs.before_rmdir = arrive
    report = sweeper(fs, runtime, Recorder()).run(discovery_of(*units))
    assert late in fs.dirs and fs.dirs[late] == [777]
    assert report.kept == {"busy": 1}
    assert {"id": cid(1), "pod": POD, "dirs": 1, "action": "kept:busy"} in report.containers
    assert report.removed == 1 and all(d not in fs.dirs for d in units[1].dirs)
    assert report.errors == []


CPUSET = [Hierarchy("/cg/cpuset", "cgroup"), *HIERARCHIES]


def test_v1_cpusets_of_removed_units_stop_load_balance_before_rmdir(
    clock: FakeClock, runtime: RuntimeDirs
) -> None:
    """Only in the v1 cpuset hierarchy, only for units being removed, before the unit's rmdirs."""
    fs = CountingFs(clock)
    fs.add("/cg/cpuset/cpuset.sched_load_balance")  # the hierarchy's root file: v1 cpuset
    order: list[str] = []
    fs.before_rmdir = order.append
    units = [add_unit(fs, n, CPUSET) for n in range(1, 4)]
    nested = f"{units[0].dirs[0]}/nested"
    fs.add(nested)
    fs.dirs[units[1].dirs[1]] = [31337]  # a process: kept, its cpuset untouched
    fs.alive.add(31337)
    discovery = Discovery(CPUSET, {u.container_id: u for u in units})
    report = sweeper(fs, runtime, Recorder()).run(discovery)
    assert report.removed == 2 and report.kept == {"populated": 1}
    assert fs.load_balance_stopped == [nested, units[0].dirs[0], units[2].dirs[0]]
    assert order.index(nested) < order.index(units[0].dirs[0])


def test_load_balance_errors_do_not_stop_the_removal(clock: FakeClock, runtime: RuntimeDirs) -> None:
    """A cpuset whose flag cannot be written is removed anyway (the kernel then clears it itself)."""

    class ReadOnlyFlag(CountingFs):
        def stop_load_balance(self, path: str) -> None:
            raise PermissionError(errno.EACCES, "Permission denied", path)

    fs = ReadOnlyFlag(clock)
    fs.add("/cg/cpuset/cpuset.sched_load_balance")
    units = [add_unit(fs, n, CPUSET) for n in range(1, 3)]
    report = sweeper(fs, runtime, Recorder()).run(Discovery(CPUSET, {u.container_id: u for u in units}))
    assert report.removed == 2 and report.errors == []
    assert all(d not in fs.dirs for u in units for d in u.dirs)


def test_no_cpuset_hierarchy_no_flag_writes(fs: AgedFs, runtime: RuntimeDirs) -> None:
    """Without a v1 cpuset hierarchy (cgroup2, or cpuset not mounted) nothing is written."""
    units = [add_unit(fs, n) for n in range(1, 3)]
    report = sweeper(fs, runtime, Recorder()).run(discovery_of(*units))
    assert report.removed == 2 and fs.load_balance_stopped == []


def test_progress_is_reported(fs: AgedFs, runtime: RuntimeDirs) -> None:
    """The progress callback sees every removal with the total."""
    units = [add_unit(fs, n) for n in range(1, 4)]
    seen: list[tuple[int, int]] = []
    loop = sweeper(fs, runtime, Recorder())
    loop.progress = lambda done, total: seen.append((done, total))
    loop.run(discovery_of(*units))
    assert seen == [(1, 3), (2, 3), (3, 3)]


def test_sweep_lock_is_exclusive(tmp_path: Path) -> None:
    """A second sweep on the node fails with SweepLocked (exit 73) until the first is done."""
    lock = str(tmp_path / "run" / "sweep.lock")
    with sweep_lock(lock):
        with pytest.raises(SweepLocked) as info, sweep_lock(lock):
            pass
        assert info.value.exit_code == EXIT_SWEEP_LOCKED == 73
    with sweep_lock(lock):
        pass


# -- the command line -------------------------------------------------------------

CTL = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")


def run_ctl(tmp_path: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = own_env(tmp_path, **extra_env)
    return subprocess.run([CTL, *args], capture_output=True, text=True, env=env, timeout=60,
                          check=False)


def test_cli_exit_66_without_cgroup_hierarchy(tmp_path: Path) -> None:
    """Nothing mounted below --cgroup-root: the sweep cannot run, exit 66 and one line saying why."""
    done = run_ctl(tmp_path, "sweep", "--cgroup-root", str(tmp_path))
    assert done.returncode == 66
    assert done.stderr == f"runc-guardctl: no cgroup filesystem is mounted at or below {tmp_path}\n"


def test_cli_exit_73_while_another_sweep_runs(tmp_path: Path) -> None:
    """A second sweep while one holds the node's lock exits 73 (that sweep does the work) and
    touches nothing."""
    with sweep_lock(str(tmp_path / "run" / "sweep.lock")):
        done = run_ctl(tmp_path, "sweep", "--kubepods", "rgsweep-absent-tree", *own_roots(tmp_path))
    assert done.returncode == 73
    assert "another sweep holds" in done.stderr


def test_cli_empty_sweep_summary(tmp_path: Path) -> None:
    """A sweep that finds nothing says so and exits 0."""
    done = run_ctl(tmp_path, "sweep", "--kubepods", "rgsweep-absent-tree", *own_roots(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("found 0 container cgroup(s) in ")


def test_cli_sweep_drops_aside_records_once_nothing_they_name_is_left(tmp_path: Path) -> None:
    """Stepped-aside deletes leave records for audit; the sweep drops those whose cgroups are all
    gone (a node's crash loops must not fill /run) and keeps the one whose directory remains."""
    from runc_guard.delete.aside import iter_aside, write_aside

    cache = str(tmp_path / "run" / "cache")
    still = tmp_path / "still-there"
    still.mkdir()
    kept = write_aside(cache, str(tmp_path), "c-kept", [str(still)], "unsure")
    write_aside(cache, str(tmp_path), "c-gone", [str(tmp_path / "vanished")], "unsure")
    done = run_ctl(tmp_path, "sweep", "--kubepods", "rgsweep-absent-tree", *own_roots(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "aside records 1" in done.stdout, done.stdout
    assert [p for p, _ in iter_aside(cache)] == [kept]


def test_cli_rejects_escaping_kubepods(tmp_path: Path) -> None:
    """--kubepods ../x is a usage error (exit 2), before anything is read."""
    done = run_ctl(tmp_path, "sweep", "--kubepods", "../etc")
    assert done.returncode == 2
    assert "not a relative path below a hierarchy" in done.stderr


@pytest.mark.parametrize(
    ("words", "cword", "expected"),
    [("runc-guardctl sw", "1", "plain,sweep"), ("runc-guardctl sweep --dry", "2", "plain,--dry-run"),
     ("runc-guardctl audit --metrics", "2", "plain,--metrics-file")],
)
def test_shell_completion(tmp_path: Path, words: str, cword: str, expected: str) -> None:
    """bash completion via click's _RUNC_GUARDCTL_COMPLETE knows the new commands and options."""
    done = run_ctl(tmp_path, _RUNC_GUARDCTL_COMPLETE="bash_complete", COMP_WORDS=words,
                   COMP_CWORD=cword)
    assert done.returncode == 0
    assert expected in done.stdout.splitlines()


@pytest.mark.parametrize("command", ["sweep", "audit", "metrics"])
def test_help_names_defaults_and_exit_codes(tmp_path: Path, command: str) -> None:
    """Each --help shows defaults an operator can act on and, where relevant, what exits mean."""
    done = run_ctl(tmp_path, command, "--help")
    assert done.returncode == 0
    assert "[default: /sys/fs/cgroup]" in done.stdout
    if command == "sweep":
        assert "--dry-run" in done.stdout
    if command != "metrics":
        assert "Exit status" in done.stdout
