"""delete.reclaim and the cleanup's Reclaimer: which memory cgroup is reclaimed, how, and when not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runc_guard.delete import reclaim
from runc_guard.delete.cleanup import drain
from tests.fakes import FakeCgroupFs, FakeClock


def _v1(path: Path, usage: int, dirty: int = 0) -> Path:
    path.mkdir()
    (path / "memory.usage_in_bytes").write_text(f"{usage}\n")
    stat = f"cache {usage}\nrss 0\ndirty {dirty}\nwriteback 0\ntotal_dirty {dirty}\n"
    (path / "memory.stat").write_text(stat)
    (path / "memory.force_empty").write_text("")
    return path


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake v1 memcg's force_empty empties it, as the kernel does when nothing stops it."""
    real = reclaim.write_control

    def write(path: str, data: bytes) -> int:
        failed = real(path, data)
        if not failed and path.endswith("memory.force_empty"):
            Path(path).with_name("memory.stat").write_text("cache 0\nrss 0\ndirty 0\nwriteback 0\n")
            Path(path).with_name("memory.usage_in_bytes").write_text("0\n")
        return failed

    monkeypatch.setattr(reclaim, "write_control", write)


def test_no_memory_controller_is_nothing_to_do(tmp_path: Path) -> None:
    """A directory without memory files (another hierarchy, or gone): nothing read as charged."""
    result = reclaim.reclaim(str(tmp_path), deadline=float("inf"))
    assert (result.before, result.after, result.reclaimed, result.skipped) == (None, None, 0, "")


def test_v1_force_empty_on_a_small_clean_charge(tmp_path: Path, kernel: None) -> None:
    """v1: memory.force_empty gets "0" when the charge is small and little of it is dirty."""
    cg = _v1(tmp_path / "cg", 3 << 20, dirty=1 << 20)
    result = reclaim.reclaim(str(cg), deadline=float("inf"))
    assert (cg / "memory.force_empty").read_text() == "0"
    assert result.method == reclaim.V1 and result.skipped == ""


def test_a_large_or_dirty_charge_is_left_alone(tmp_path: Path) -> None:
    """force_empty blocks until everything is reclaimed, and a v2 reclaim cut off at its budget would
    have spent it in vain: a large charge, or a dirty one, is left alone on both."""
    large = _v1(tmp_path / "large", reclaim.MAX_CHARGE + 1)
    dirty = _v1(tmp_path / "dirty", 8 << 20, dirty=reclaim.MAX_DIRTY + 1)
    v2 = tmp_path / "v2-dirty"
    v2.mkdir()
    (v2 / "memory.current").write_text(f"{8 << 20}\n")
    (v2 / "memory.stat").write_text(f"anon 0\nfile {8 << 20}\nfile_dirty {reclaim.MAX_DIRTY + 1}\n")
    (v2 / "memory.reclaim").write_text("")
    for cg in (large, dirty):
        result = reclaim.reclaim(str(cg), deadline=float("inf"))
        assert (cg / "memory.force_empty").read_text() == "" and result.skipped, result.skipped
        assert result.reclaimed == 0
    result = reclaim.reclaim(str(v2), deadline=float("inf"))
    assert (v2 / "memory.reclaim").read_text() == "" and result.skipped.startswith("too much dirty")


def test_v1_at_the_deadline_writes_nothing(tmp_path: Path) -> None:
    cg = _v1(tmp_path / "cg", 1 << 20)
    result = reclaim.reclaim(str(cg), deadline=0.0)
    assert (cg / "memory.force_empty").read_text() == "" and result.skipped == "deadline"


def test_v2_asks_in_chunks_and_stops_when_the_kernel_cannot_give_more(tmp_path: Path) -> None:
    """v2: memory.reclaim is written with at most CHUNK bytes; a charge that does not shrink ends it."""
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "memory.current").write_text(f"{40 << 20}\n")
    (cg / "memory.stat").write_text(f"anon 0\nfile {40 << 20}\nfile_dirty 0\nfile_writeback 0\n")
    (cg / "memory.reclaim").write_text("")
    result = reclaim.reclaim(str(cg), deadline=float("inf"))
    assert (cg / "memory.reclaim").read_text() == str(reclaim.CHUNK)
    assert result.method == reclaim.V2 and result.before == result.after == 40 << 20
    assert result.skipped == f"{reclaim.LEFT} (40960 KiB, 0 KiB dirty or under writeback)"


def test_page_cache_the_kernel_left_is_named_and_may_be_held(tmp_path: Path) -> None:
    """force_empty answers 0 even when it gave up (16 rounds without progress): memory.stat after it
    decides. What is left is named, and a finisher may still reclaim it after the reply."""
    cg = _v1(tmp_path / "cg", 2 << 20, dirty=1 << 20)
    result = reclaim.reclaim(str(cg), deadline=float("inf"))
    assert (cg / "memory.force_empty").read_text() == "0"
    assert result.skipped == f"{reclaim.LEFT} (2048 KiB, 1024 KiB dirty or under writeback)"
    assert reclaim.holdable(result.skipped)


def test_shmem_is_not_page_cache_a_reclaim_can_drop(tmp_path: Path) -> None:
    """Shmem (a tmpfs file that outlives the container) is counted in the cache but only swap could
    take it: nothing is written for it, the memcg is named as left charged, and never held."""
    cg = _v1(tmp_path / "cg", 1 << 20)
    (cg / "memory.stat").write_text(f"cache {1 << 20}\nrss 0\nshmem {1 << 20}\ndirty 0\nwriteback 0\n")
    result = reclaim.reclaim(str(cg), deadline=float("inf"))
    assert (cg / "memory.force_empty").read_text() == "" and result.skipped == reclaim.SHMEM
    assert not reclaim.holdable(result.skipped)
    assert reclaim.page_cache(str(cg), reclaim.V1) == (0, 0, 1 << 20)


def test_io_pressure_leaves_the_memcg_as_it_is(tmp_path: Path, kernel: None) -> None:
    """PSI says the node waits on its disk: no writeback is added (dirty pages); clean page cache is
    dropped without I/O and still reclaimed; no PSI at all does not stop it."""
    cg = _v1(tmp_path / "cg", 1 << 20, dirty=4096)
    busy = tmp_path / "io"
    busy.write_text("some avg10=35.00 avg60=20.00 avg300=5.00 total=1\n"
                    "full avg10=30.00 avg60=1.00 avg300=1.00 total=1\n")
    result = reclaim.reclaim(str(cg), float("inf"), pressure=str(busy))
    assert result.skipped.startswith("I/O pressure") and (cg / "memory.force_empty").read_text() == ""
    assert reclaim.io_pressure(str(busy)) == 35.0
    assert reclaim.io_pressure(str(tmp_path / "no-psi")) is None
    assert reclaim.reclaim(str(cg), float("inf"), pressure=str(tmp_path / "no-psi")).skipped == ""
    clean = _v1(tmp_path / "clean", 1 << 20)
    assert reclaim.reclaim(str(clean), float("inf"), pressure=str(busy)).skipped == ""
    assert (clean / "memory.force_empty").read_text() == "0"


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


def test_a_memcg_without_page_cache_is_not_forced(tmp_path: Path) -> None:
    """Charged but with no page cache (kernel memory, reparented at offline): nothing pins it, so
    nothing is written, and the clean delete does not pay force_empty's per-CPU drain."""
    cg = _v1(tmp_path / "cg", 300 << 10)
    (cg / "memory.stat").write_text("cache 0\nrss 0\ndirty 0\nwriteback 0\n")
    result = reclaim.reclaim(str(cg), deadline=float("inf"))
    assert (cg / "memory.force_empty").read_text() == "" and result.skipped == "" and result.reclaimed == 0


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
