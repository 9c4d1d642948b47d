"""delete.reclaim and the cleanup's Reclaimer: which memory cgroup is reclaimed, how, and when not."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from runc_guard.delete import reclaim
from runc_guard.delete.cleanup import drain
from tests.fakes import FakeCgroupFs, FakeClock

MIB = 1 << 20


class Memcg:
    """A memory cgroup directory whose control files act as the kernel's (``kernel`` patches the writes).

    v1: a lowered ``memory.limit_in_bytes`` reclaims inactive file pages until the usage fits, then
    answers EBUSY if it does not (mem_cgroup_resize_max); after the cold pages the kernel would
    deactivate and evict active ones too, which this fake does (what the reclaim must never ask for).
    v2: ``memory.reclaim`` takes what it is asked for, EAGAIN when it got less; ``swappiness=``
    is EINVAL on a kernel that does not take it. Shmem goes only by swap, never allowed here.
    """

    def __init__(
        self, path: Path, v: str = reclaim.V1, cold: int = 0, active: int = 0, dirty: int = 0,
        shmem: int = 0, kernel_mem: int = 0, swappiness_key: bool = True, swap_max: bool = True,
        batched: int = 0,
    ) -> None:
        self.path, self.v = path, v
        self.cold, self.active, self.dirty, self.shmem = cold, active, dirty, shmem
        #: charged page cache on no LRU list yet (per-CPU batches): only force_empty's drain takes it
        self.batched = batched
        self.kernel_mem = kernel_mem
        self.swappiness_key = swappiness_key
        self.writes: list[tuple[str, str]] = []
        path.mkdir()
        (path / "memory.stat").write_text("")
        names = ("memory.usage_in_bytes", "memory.limit_in_bytes", "memory.swappiness", "memory.force_empty")
        if v == reclaim.V2:
            names = ("memory.current", "memory.reclaim") + (("memory.swap.max",) if swap_max else ())
        for name in names:
            (path / name).write_text("")
        (path / "memory.limit_in_bytes").write_text("9223372036854771712\n") if v == reclaim.V1 else None
        self.sync()

    @property
    def usage(self) -> int:
        return self.cold + self.active + self.shmem + self.batched + self.kernel_mem

    def sync(self) -> None:
        cache = self.cold + self.active + self.shmem + self.batched
        if self.v == reclaim.V1:
            stat = (f"cache {cache}\nrss 0\nshmem {self.shmem}\ndirty {self.dirty}\nwriteback 0\n"
                    f"inactive_file {self.cold}\nactive_file {self.active}\ntotal_dirty {self.dirty}\n")
            (self.path / "memory.usage_in_bytes").write_text(f"{self.usage}\n")
        else:
            stat = (f"anon 0\nfile {cache}\nshmem {self.shmem}\nfile_dirty {self.dirty}\n"
                    f"file_writeback 0\ninactive_file {self.cold}\nactive_file {self.active}\n")
            (self.path / "memory.current").write_text(f"{self.usage}\n")
        (self.path / "memory.stat").write_text(stat)

    def _evict(self, want: int) -> int:
        took = min(want, self.cold)
        self.cold -= took
        more = min(want - took, self.active)  # the kernel deactivates and evicts in-use pages too
        self.active -= more
        self.dirty = min(self.dirty, self.cold + self.active)
        return took + more

    def write(self, control: str, data: str) -> int:
        if not (self.path / control).exists():
            return errno.ENOENT
        self.writes.append((control, data))
        if control == "memory.limit_in_bytes":
            if data.isdigit():
                self._evict(max(0, self.usage - int(data)))
            failed = errno.EBUSY if data.isdigit() and self.usage > int(data) else 0
        elif control == "memory.reclaim":
            size, *keys = data.split()
            if keys and not self.swappiness_key:
                return errno.EINVAL
            failed = 0 if self._evict(int(size)) == int(size) else errno.EAGAIN
        elif control == "memory.force_empty":
            self.cold, self.batched = self.cold + self.batched, 0
            self._evict(self.usage)
            failed = 0
        else:
            failed = 0
        self.sync()
        return failed


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> dict[str, Memcg]:
    """Fake memcgs by path; every control-file write goes to the one it names."""
    memcgs: dict[str, Memcg] = {}
    real = reclaim.write_control

    def write(path: str, data: bytes) -> int:
        memcg = memcgs.get(os.path.dirname(path))
        if memcg is None:
            return real(path, data)
        return memcg.write(os.path.basename(path), data.decode())

    monkeypatch.setattr(reclaim, "write_control", write)
    return memcgs


def _memcg(kernel: dict[str, Memcg], path: Path, **kw: object) -> Memcg:
    memcg = Memcg(path, **kw)  # type: ignore[arg-type]
    kernel[str(path)] = memcg
    return memcg


def _no_swap(tmp_path: Path) -> str:
    meminfo = tmp_path / "meminfo-noswap"
    meminfo.write_text("MemTotal: 100 kB\nSwapTotal:        0 kB\n")
    return str(meminfo)


def _lowered(memcg: Memcg) -> list[int]:
    """Each lowered v1 limit written, in order (not the one put back at the end)."""
    limits = [d for c, d in memcg.writes if c == "memory.limit_in_bytes" and d.isdigit()]
    return [int(d) for d in limits if int(d) < 1 << 60]


def test_no_memory_controller_is_nothing_to_do(tmp_path: Path) -> None:
    """A directory without memory files (another hierarchy, or gone): nothing read as charged."""
    result = reclaim.reclaim(str(tmp_path), deadline=float("inf"))
    assert (result.before, result.after, result.reclaimed, result.skipped) == (None, None, 0, "")


def test_v1_cold_page_cache_goes_through_lowered_limits_never_force_empty(
    tmp_path: Path, kernel: dict[str, Memcg]
) -> None:
    """v1 (issue 42 case 3): memory.swappiness 0 first, then the limit lowered a STEP at most each time
    until the cold cache is gone, then the limit put back. Before: one memory.force_empty, which
    loops until the usage is 0 and no deadline can interrupt."""
    cg = _memcg(kernel, tmp_path / "cg", cold=20 * MIB, kernel_mem=300 << 10)
    result = reclaim.reclaim(str(cg.path), deadline=float("inf"))
    controls = [c for c, _ in cg.writes]
    assert controls[0] == "memory.swappiness" and cg.writes[0][1] == "0"
    assert "memory.force_empty" not in controls
    assert cg.writes[-1] == ("memory.limit_in_bytes", "9223372036854771712")  # put back
    limits = _lowered(cg)
    usages = [20 * MIB + (300 << 10), *limits[:-1]]
    assert all(0 < u - lim <= reclaim.STEP for u, lim in zip(usages, limits, strict=True)), limits
    assert result.method == reclaim.V1 and result.skipped == "" and result.reclaimed == 20 * MIB


def test_page_cache_on_the_active_list_is_never_asked_for(
    tmp_path: Path, kernel: dict[str, Memcg]
) -> None:
    """A live sibling re-reading a shared file keeps its pages on the dead memcg's active list: only
    the cold (inactive) part is reclaimed, at most that much is asked for, and the memcg is named
    ``page cache in use``, never held (a later reclaim would evict the same pages). All active:
    nothing is written at all."""
    mixed = _memcg(kernel, tmp_path / "mixed", cold=2 * MIB, active=64 * MIB)
    result = reclaim.reclaim(str(mixed.path), deadline=float("inf"))
    assert mixed.active == 64 * MIB and mixed.cold == 0, "the kernel was never asked for in-use pages"
    assert result.reclaimed == 2 * MIB and result.skipped.startswith(reclaim.IN_USE), result.skipped
    assert not reclaim.holdable(result.skipped)
    hot = _memcg(kernel, tmp_path / "hot", active=64 * MIB)
    result = reclaim.reclaim(str(hot.path), deadline=float("inf"))
    assert hot.writes == [] and result.skipped == f"{reclaim.IN_USE} (65536 KiB on the active list: " \
        "a running container may read it)"
    v2 = _memcg(kernel, tmp_path / "v2", v=reclaim.V2, cold=MIB, active=32 * MIB)
    result = reclaim.reclaim(str(v2.path), deadline=float("inf"))
    assert v2.active == 32 * MIB and result.reclaimed == MIB and result.skipped.startswith(reclaim.IN_USE)


def test_a_few_active_metadata_pages_go_with_the_cold_ones(tmp_path: Path, kernel: dict[str, Memcg]) -> None:
    """A file write activates a few filesystem metadata pages (4-16 KiB here): up to ACTIVE_SLACK of
    active pages are reclaimed with the cold ones, so such a memcg is freed, not pinned for them."""
    cg = _memcg(kernel, tmp_path / "cg", cold=MIB, active=16 << 10)
    result = reclaim.reclaim(str(cg.path), deadline=float("inf"))
    assert result.skipped == "" and cg.cold == cg.active == 0
    over = _memcg(kernel, tmp_path / "over", cold=MIB, active=reclaim.ACTIVE_SLACK + 4096)
    result = reclaim.reclaim(str(over.path), deadline=float("inf"))
    assert over.active == reclaim.ACTIVE_SLACK + 4096 and result.skipped.startswith(reclaim.IN_USE)


def test_no_request_outlasts_the_deadline(tmp_path: Path, kernel: dict[str, Memcg]) -> None:
    """Each request asks for at most STEP and at most RATE's worth of the time left, and none starts
    past the deadline: with 100 MiB cold and 0.2 s left (each look at the clock 0.05 s later),
    a few requests of at most RATE x the time left, then ``deadline`` (holdable: a finisher may go on)."""
    cg = _memcg(kernel, tmp_path / "cg", cold=100 * MIB)
    clock = FakeClock()
    start, times = clock.now, []

    def tick() -> float:
        clock.now += 0.05
        times.append(clock.now)
        return clock.now

    result = reclaim.reclaim(str(cg.path), deadline=start + 0.2, clock=tick)
    limits = _lowered(cg)
    usages = [100 * MIB, *limits[:-1]]
    asked = [u - lim for u, lim in zip(usages, limits, strict=True)]
    assert asked and all(0 < a <= reclaim.STEP for a in asked), asked
    # the time left when each request was sized (its look at the clock) bounds it
    bounds = [(start + 0.2 - t) * reclaim.RATE for t in times]
    assert all(a <= bound for a, bound in zip(asked, bounds, strict=False)), (asked, bounds)
    assert result.skipped == "deadline" and reclaim.holdable(result.skipped)
    assert reclaim.reclaim(str(cg.path), deadline=0.0).skipped == "deadline"


def test_v2_asks_swappiness_0_and_steps(tmp_path: Path, kernel: dict[str, Memcg]) -> None:
    """v2: memory.swap.max 0, then memory.reclaim with ``swappiness=0``, a STEP at most each time."""
    cg = _memcg(kernel, tmp_path / "cg", v=reclaim.V2, cold=20 * MIB)
    result = reclaim.reclaim(str(cg.path), deadline=float("inf"))
    assert cg.writes[0] == ("memory.swap.max", "0")
    reclaims = [d for c, d in cg.writes if c == "memory.reclaim"]
    step = f"{reclaim.STEP} swappiness=0"
    assert reclaims == [step, step, f"{4 * MIB} swappiness=0"]
    assert result.skipped == "" and result.reclaimed == 20 * MIB


def test_v2_without_the_swappiness_key_needs_swap_max_or_no_swap(
    tmp_path: Path, kernel: dict[str, Memcg]
) -> None:
    """A kernel before 6.11 refuses ``swappiness=`` (EINVAL): with swap.max set to 0 the plain write
    follows; without swap.max (no swap accounting) only a node without swap is reclaimed."""
    swapmax = _memcg(kernel, tmp_path / "swapmax", v=reclaim.V2, cold=MIB, swappiness_key=False)
    assert reclaim.reclaim(str(swapmax.path), float("inf")).skipped == ""
    assert [d for c, d in swapmax.writes if c == "memory.reclaim"] == [f"{MIB} swappiness=0", str(MIB)]
    bare = _memcg(kernel, tmp_path / "bare", v=reclaim.V2, cold=MIB, swappiness_key=False, swap_max=False)
    swap_on = tmp_path / "meminfo"
    swap_on.write_text("SwapTotal:  4194300 kB\n")
    result = reclaim.reclaim(str(bare.path), float("inf"), meminfo=str(swap_on))
    assert result.skipped == reclaim.SWAP and bare.cold == MIB
    assert reclaim.reclaim(str(bare.path), float("inf"), meminfo=_no_swap(tmp_path)).skipped == ""


def test_a_large_or_dirty_charge_is_left_alone(tmp_path: Path, kernel: dict[str, Memcg]) -> None:
    """A v2 reclaim or a v1 hold is for what the reply cannot do: a large cold cache or a dirty one
    is left alone here (and held on v1 by the caller)."""
    large = _memcg(kernel, tmp_path / "large", cold=reclaim.MAX_CHARGE + MIB)
    dirty = _memcg(kernel, tmp_path / "dirty", cold=8 * MIB, dirty=reclaim.MAX_DIRTY + 1)
    v2 = _memcg(kernel, tmp_path / "v2", v=reclaim.V2, cold=8 * MIB, dirty=reclaim.MAX_DIRTY + 1)
    for cg in (large, dirty, v2):
        result = reclaim.reclaim(str(cg.path), deadline=float("inf"))
        assert cg.writes == [] and result.skipped and result.reclaimed == 0, result.skipped
    assert reclaim.reclaim(str(v2.path), float("inf")).skipped.startswith("too much dirty")


def test_page_cache_the_kernel_left_is_named_and_may_be_held(
    tmp_path: Path, kernel: dict[str, Memcg], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cold pages the kernel would not drop (mapped and locked, under writeback): the lowered limit
    answers EBUSY, memory.stat after it decides, what is left is named and a finisher may go on."""
    cg = _memcg(kernel, tmp_path / "cg", cold=2 * MIB, dirty=MIB)
    monkeypatch.setattr(cg, "_evict", lambda want: 0)
    result = reclaim.reclaim(str(cg.path), deadline=float("inf"))
    assert result.skipped == f"{reclaim.LEFT} (2048 KiB, 1024 KiB dirty or under writeback)"
    assert reclaim.holdable(result.skipped)


def test_shmem_is_not_page_cache_a_reclaim_can_drop(tmp_path: Path, kernel: dict[str, Memcg]) -> None:
    """Shmem (a tmpfs file that outlives the container) only swap could take: alone, nothing is
    written and the memcg is named, never held. Beside a page of file cache (issue 42 case 3: the
    size gate counts file pages only), the reclaim runs with swap ruled out first and takes only the
    file page."""
    alone = _memcg(kernel, tmp_path / "alone", shmem=MIB)
    result = reclaim.reclaim(str(alone.path), deadline=float("inf"))
    assert alone.writes == [] and result.skipped == reclaim.SHMEM and not reclaim.holdable(result.skipped)
    assert reclaim.page_cache(str(alone.path), reclaim.V1) == (0, 0, MIB)
    both = _memcg(kernel, tmp_path / "both", cold=4096, shmem=2048 * MIB)
    result = reclaim.reclaim(str(both.path), deadline=float("inf"))
    assert both.writes[0] == ("memory.swappiness", "0") and both.shmem == 2048 * MIB and both.cold == 0
    assert result.skipped == reclaim.SHMEM


def test_io_pressure_leaves_the_memcg_as_it_is(tmp_path: Path, kernel: dict[str, Memcg]) -> None:
    """PSI says the node waits on its disk: no writeback is added (dirty pages); clean page cache is
    dropped without I/O and still reclaimed; no PSI at all does not stop it."""
    cg = _memcg(kernel, tmp_path / "cg", cold=MIB, dirty=4096)
    busy = tmp_path / "io"
    busy.write_text("some avg10=35.00 avg60=20.00 avg300=5.00 total=1\n"
                    "full avg10=30.00 avg60=1.00 avg300=1.00 total=1\n")
    result = reclaim.reclaim(str(cg.path), float("inf"), pressure=str(busy))
    assert result.skipped.startswith("I/O pressure") and cg.writes == []
    assert reclaim.io_pressure(str(busy)) == 35.0
    assert reclaim.io_pressure(str(tmp_path / "no-psi")) is None
    assert reclaim.reclaim(str(cg.path), float("inf"), pressure=str(tmp_path / "no-psi")).skipped == ""
    clean = _memcg(kernel, tmp_path / "clean", cold=MIB)
    assert reclaim.reclaim(str(clean.path), float("inf"), pressure=str(busy)).skipped == ""
    assert clean.cold == 0


def test_a_kernel_that_reparents_gets_no_reclaim(tmp_path: Path, kernel: dict[str, Memcg]) -> None:
    """node.memcg_probe's cached answer: ``1`` for this kernel release, nothing is written (removing
    the memcg frees it there, a reclaim only evicts); ``0``, another release's answer, or none at
    all (unknown: every LTS kernel pins) reclaim as before."""
    probe = tmp_path / reclaim.PROBE_FILE
    release = os.uname().release
    cases = {f"1 {release}\n": False, f"0 {release}\n": True, "1 3.10.0-other\n": True, None: True}
    for n, (content, reclaims) in enumerate(cases.items()):
        if content is None:
            probe.unlink()
        else:
            probe.write_text(content)
        cg = _memcg(kernel, tmp_path / f"cg{n}", cold=MIB)
        result = reclaim.reclaim(str(cg.path), float("inf"), probe=str(probe))
        assert (cg.writes != []) == reclaims and result.skipped == "", (content, cg.writes)
    assert reclaim.kernel_reparents(str(tmp_path / "none")) is None


def test_an_empty_charge_writes_nothing(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "memory.current").write_text("0\n")
    assert reclaim.reclaim(str(cg), deadline=float("inf")).before == 0
    assert not (cg / "memory.reclaim").exists()


def test_drain_reclaims_each_empty_memcg_once_before_its_rmdir() -> None:
    """Only empty directories, each once, and before the rmdir; the report counts what it reclaimed."""
    clock = FakeClock()
    fs = FakeCgroupFs(clock)
    fs.add("/cg/memory/pod/ctr")
    fs.add("/cg/pids/pod/ctr")
    fs.charged["/cg/memory/pod/ctr"] = 5 << 20
    report = drain(["/cg/memory/pod/ctr", "/cg/pids/pod/ctr"], fs, clock() + 4, 0.1, may_kill=False,
                   clock=clock, reclaim_budget=0.1)  # fmt: skip
    assert fs.reclaims == [("/cg/memory/pod/ctr", clock.now + 0.1)]
    assert report.reclaimed == 5 << 20 and report.unreclaimed == {}
    assert fs.rmdirs == ["/cg/memory/pod/ctr", "/cg/pids/pod/ctr"]


def test_drain_without_a_budget_reclaims_nothing() -> None:
    clock = FakeClock()
    fs = FakeCgroupFs(clock)
    fs.add("/cg/memory/pod/ctr")
    fs.charged["/cg/memory/pod/ctr"] = 5 << 20
    report = drain(["/cg/memory/pod/ctr"], fs, clock() + 4, 0.1, may_kill=False, clock=clock)
    assert fs.reclaims == [] and report.reclaimed == 0 and fs.rmdirs == ["/cg/memory/pod/ctr"]


def test_a_populated_memcg_is_never_reclaimed_and_one_left_charged_is_reported() -> None:
    """A cgroup with a live process is not reclaimed (a live workload's cache is not ours to evict);
    once empty it is; one the kernel cannot reclaim is removed anyway and named in the report."""
    clock = FakeClock()
    fs = FakeCgroupFs(clock)
    fs.add("/cg/memory/pod/ctr", pids=[42])
    fs.add("/cg/memory/pod/ctr/child")
    fs.charged.update({"/cg/memory/pod/ctr": 1 << 20, "/cg/memory/pod/ctr/child": 1 << 20})
    fs.unreclaimable["/cg/memory/pod/ctr/child"] = "too much dirty (writeback would block)"

    def exit_later(fs: FakeCgroupFs) -> None:
        assert [p for p, _ in fs.reclaims] == ["/cg/memory/pod/ctr/child"]
        fs.exit(42)

    fs.on_wait = exit_later
    report = drain(["/cg/memory/pod/ctr"], fs, clock() + 4, 0.1, may_kill=False, clock=clock,
                   reclaim_budget=0.1)  # fmt: skip
    assert [p for p, _ in fs.reclaims] == ["/cg/memory/pod/ctr/child", "/cg/memory/pod/ctr"]
    assert report.unreclaimed == {"/cg/memory/pod/ctr/child": "too much dirty (writeback would block)"}
    assert report.reclaimed == 1 << 20 and os.path.basename(fs.rmdirs[-1]) == "ctr"


def test_a_memcg_without_page_cache_is_not_forced(tmp_path: Path, kernel: dict[str, Memcg]) -> None:
    """Charged but with no page cache (kernel memory, reparented at offline): nothing pins it, so
    nothing is written, and the clean delete pays no reclaim."""
    cg = _memcg(kernel, tmp_path / "cg", kernel_mem=300 << 10)
    result = reclaim.reclaim(str(cg.path), deadline=float("inf"))
    assert cg.writes == [] and result.skipped == "" and result.reclaimed == 0


def test_the_budget_starts_at_the_first_charged_memcg_not_the_first_empty_directory() -> None:
    """A container's freezer directory empties first, its memory one only once a slow process has died
    (seconds later): the reclaim's 0.1 s counts from the memory cgroup, not from the freezer."""
    clock = FakeClock()
    fs = FakeCgroupFs(clock)
    fs.add("/cg/freezer/pod/ctr")
    fs.add("/cg/memory/pod/ctr", pids=[42])
    fs.charged["/cg/memory/pod/ctr"] = 1 << 20

    def exit_later(fs: FakeCgroupFs) -> None:
        if clock.now - start > 2.0:
            fs.exit(42)

    start = clock.now
    fs.on_wait = exit_later
    report = drain(["/cg/freezer/pod/ctr", "/cg/memory/pod/ctr"], fs, clock() + 4, 0.1, may_kill=False,
                   clock=clock, reclaim_budget=0.1)  # fmt: skip
    [(path, until)] = fs.reclaims
    assert path == "/cg/memory/pod/ctr" and until > start + 2.0, (until, start)
    assert report.reclaimed == 1 << 20 and report.unreclaimed == {}


def test_dirty_pages_get_short_waits_for_the_flusher_within_the_deadline(
    tmp_path: Path, kernel: dict[str, Memcg]
) -> None:
    """A request that frees nothing while dirty pages are left (the kernel woke the flusher for
    them) is asked again after WRITEBACK_PAUSE, at most WRITEBACK_WAITS times: here the pages are
    written back after the second wait and then go."""
    cg = _memcg(kernel, tmp_path / "cg", cold=MIB, dirty=MIB)
    real_evict = cg._evict
    slept: list[float] = []
    cg._evict = lambda want: 0 if cg.dirty else real_evict(want)  # type: ignore[method-assign]

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 2:
            cg.dirty = 0
            cg.sync()

    result = reclaim.reclaim_cold(str(cg.path), reclaim.V1, MIB, float("inf"), sleep=sleep)
    assert slept == [reclaim.WRITEBACK_PAUSE] * 2 and cg.cold == 0 and result.skipped == ""
    stuck = _memcg(kernel, tmp_path / "stuck", cold=MIB, dirty=MIB)
    stuck._evict = lambda want: 0  # type: ignore[method-assign]
    slept.clear()
    reclaim.reclaim_cold(str(stuck.path), reclaim.V1, MIB, float("inf"), sleep=slept.append)
    assert len(slept) == reclaim.WRITEBACK_WAITS


def test_v1_finishes_only_a_tiny_clean_remainder_with_force_empty(
    tmp_path: Path, kernel: dict[str, Memcg]
) -> None:
    """Pages still in per-CPU LRU batches are invisible to a lowered limit; force_empty's drain takes
    them. It is written only for a clean remainder of at most FINAL plus BATCHED_PER_CPU per CPU,
    never a dirty or larger one."""
    bound = reclaim.FINAL + reclaim.BATCHED_PER_CPU * (os.cpu_count() or 1)
    cases = (("tiny", 0, 16 << 10, 0, True), ("dirty", 4096, 16 << 10, 0, False),
             ("large", 0, bound + 4096, 0, False), ("batched", 0, reclaim.FINAL, 112 << 10, True),
             ("batched-large", 0, 16 << 10, bound, False))
    for name, dirty, left, batched, finished in cases:
        cg = _memcg(kernel, tmp_path / name, cold=MIB + left, dirty=dirty, batched=batched)
        real_evict = cg._evict
        cg._evict = lambda want, e=real_evict, c=cg, keep=left: e(min(want, c.cold - keep))  # type: ignore[misc]
        reclaim.reclaim_cold(str(cg.path), reclaim.V1, MIB + left, float("inf"), sleep=lambda _: None)
        assert (("memory.force_empty", "0") in cg.writes) == finished, (name, cg.writes)
