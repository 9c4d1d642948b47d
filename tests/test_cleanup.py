"""The wait-and-remove loop, against a fake kernel whose processes die when told."""

from __future__ import annotations

import errno
import subprocess
import sys

import pytest

from runc_guard.delete.cleanup import Reclaimer, drain, remove_listed, subtree_leaf_first
from runc_guard.errors import (
    EXIT_CGROUP_BUSY,
    EXIT_CGROUP_ERROR,
    CgroupBusy,
    CgroupRemovalFailed,
    CleanupReport,
)
from tests.fakes import FakeCgroupFs, FakeClock

ROOTS = ["/cg/memory/k/c1", "/cg/pids/k/c1"]


def run(fs: FakeCgroupFs, clock: FakeClock, timeout: float = 3.0, kill: bool = True):  # type: ignore[no-untyped-def]
    return drain(ROOTS, fs, clock() + timeout, 0.02, may_kill=kill, clock=clock)


def test_removes_empty_tree_leaf_first(fake_fs: FakeCgroupFs, clock: FakeClock) -> None:
    """Children go before parents; one attempt, no waiting."""
    for root in ROOTS:
        fake_fs.add(root)
        fake_fs.add(root + "/nested")
        fake_fs.add(root + "/nested/deeper")
    report = run(fake_fs, clock)
    assert fake_fs.dirs == {}
    assert fake_fs.rmdirs.index(ROOTS[0] + "/nested/deeper") < fake_fs.rmdirs.index(ROOTS[0])
    assert (report.attempts, len(report.removed), fake_fs.waits) == (1, 6, [])


def test_already_gone_is_success(fake_fs: FakeCgroupFs, clock: FakeClock) -> None:
    """ENOENT counts as success: nothing reported removed, no error."""
    report = run(fake_fs, clock)
    assert (report.attempts, report.removed) == (1, [])


def test_waits_for_slow_exit_then_removes(fake_fs: FakeCgroupFs, clock: FakeClock) -> None:
    """Processes that take 1 s to die are waited for, not given up on after 150 ms."""
    fake_fs.dies_on_kill = False
    for root in ROOTS:
        fake_fs.add(root, [101, 102])
    start = clock()

    def exit_after_one_second(fs: FakeCgroupFs) -> None:
        if clock() - start >= 1.0:
            fs.exit(101)
            fs.exit(102)

    fake_fs.on_wait = exit_after_one_second
    report = run(fake_fs, clock)
    assert fake_fs.dirs == {}
    assert sorted(report.killed) == [101, 102]
    assert 1000 <= report.waited_ms <= 1100
    # every wait was on the populated cgroups, never a spin without sleeping
    assert all(paths and timeout > 0 for paths, timeout, _ in fake_fs.waits)


def test_deadline_gives_cgroup_busy_with_report(fake_fs: FakeCgroupFs, clock: FakeClock) -> None:
    """Processes that never die: CgroupBusy (exit 75) at the deadline, carrying the report."""
    fake_fs.dies_on_kill = False
    fake_fs.add(ROOTS[0], [7])
    with pytest.raises(CgroupBusy) as info:
        run(fake_fs, clock, timeout=0.5)
    exc = info.value
    assert exc.exit_code == EXIT_CGROUP_BUSY == 75
    assert exc.pids == (7,) and exc.path == ROOTS[0]
    assert 500 <= exc.waited_ms <= 520
    assert exc.report is not None and exc.report.attempts == len(fake_fs.waits) + 1
    assert "does not exist" not in str(exc)


def test_no_kill_when_disabled(fake_fs: FakeCgroupFs, clock: FakeClock) -> None:
    """kill_stragglers = false: nobody is signalled."""
    fake_fs.add(ROOTS[0], [7])
    with pytest.raises(CgroupBusy):
        run(fake_fs, clock, timeout=0.1, kill=False)
    assert fake_fs.killed == []


def test_only_members_are_killed(fake_fs: FakeCgroupFs, clock: FakeClock) -> None:
    """A pid listed in cgroup.procs but dead by the time we look is never signalled."""
    fake_fs.add(ROOTS[0], [7, 8])
    fake_fs.alive.discard(8)
    run(fake_fs, clock)
    assert fake_fs.killed == [7]


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.EPERM])
def test_non_retryable_rmdir_fails_fast(fake_fs: FakeCgroupFs, clock: FakeClock, code: int) -> None:
    """EROFS/EACCES/EPERM: CgroupRemovalFailed (exit 74) on the first attempt, no waiting."""
    fake_fs.add(ROOTS[0])
    fake_fs.rmdir_errors[ROOTS[0]] = code
    with pytest.raises(CgroupRemovalFailed) as info:
        run(fake_fs, clock)
    assert info.value.exit_code == EXIT_CGROUP_ERROR == 74
    assert errno.errorcode[code] in str(info.value)
    assert fake_fs.waits == []


def test_ebusy_without_pids_is_retried_until_it_clears(fake_fs: FakeCgroupFs, clock: FakeClock) -> None:
    """EBUSY with an empty cgroup.procs (kernel still tearing down) is retried on the poll interval."""
    fake_fs.add(ROOTS[0])
    fake_fs.rmdir_errors[ROOTS[0]] = errno.EBUSY

    def clear(fs: FakeCgroupFs) -> None:
        if len(fs.waits) == 3:
            del fs.rmdir_errors[ROOTS[0]]

    fake_fs.on_wait = clear
    report = run(fake_fs, clock)
    assert report.attempts == 4 and fake_fs.dirs == {}
    assert all(paths == () for paths, _, _ in fake_fs.waits)  # nothing to wake us: plain poll


def test_child_created_during_removal_is_removed_too(fake_fs: FakeCgroupFs, clock: FakeClock) -> None:
    """A child cgroup that appears between attempts is found and removed before its parent."""
    fake_fs.dies_on_kill = False
    fake_fs.add(ROOTS[0], [5])

    def late_child(fs: FakeCgroupFs) -> None:
        if len(fs.waits) == 1:
            fs.add(ROOTS[0] + "/late")
            fs.exit(5)

    fake_fs.on_wait = late_child
    run(fake_fs, clock)
    assert fake_fs.rmdirs == [ROOTS[0] + "/late", ROOTS[0]]


def test_at_least_one_attempt_after_deadline(fake_fs: FakeCgroupFs, clock: FakeClock) -> None:
    """Even with the deadline already past, one removal pass runs."""
    fake_fs.add(ROOTS[0])
    drain(ROOTS, fake_fs, clock() - 1, 0.02, may_kill=True, clock=clock)
    assert fake_fs.dirs == {}


def test_remove_listed_removes_in_order_without_reading(fake_fs: FakeCgroupFs) -> None:
    """The given paths go in the given order; gone is done, EBUSY is left, no cgroup.procs read."""
    paths = ["/cg/memory/k/c1/nested", "/cg/memory/k/c1", "/cg/pids/k/c1/gone", "/cg/pids/k/c1"]
    for path in (paths[0], paths[1], paths[3]):
        fake_fs.add(path)
    fake_fs.dirs[paths[3]] = [55]  # moved in after the caller's look: the kernel says EBUSY
    fake_fs.alive.add(55)
    reads: list[str] = []
    fake_fs.read_procs = lambda path: reads.append(path) or []  # type: ignore[method-assign]
    report = CleanupReport()
    assert remove_listed(paths, fake_fs, report) == {paths[3]: ()}
    assert report.removed == fake_fs.rmdirs == paths[:2]
    assert reads == []


def test_remove_listed_leaves_the_parent_of_a_child_it_could_not_remove(
    fake_fs: FakeCgroupFs, clock: FakeClock
) -> None:
    """A child cgroup populated since the look (the kernel refuses its rmdir): its parent is neither
    reclaimed (a memcg's reclaim takes its children's pages) nor removed; both are left (issue 42)."""
    child, parent = "/cg/memory/k/c1/sub", "/cg/memory/k/c1"
    fake_fs.add(child, [55])
    fake_fs.add(parent)
    fake_fs.charged.update({child: 1 << 20, parent: 1 << 20})
    report = CleanupReport()
    reclaim = Reclaimer(fake_fs, report, 1.0, clock() + 1, clock)
    assert remove_listed([child, parent], fake_fs, report, reclaim) == {child: (), parent: ()}
    assert fake_fs.reclaims == [(child, clock() + 1)] and fake_fs.rmdirs == []


def test_remove_listed_fails_fast_on_other_errors(fake_fs: FakeCgroupFs) -> None:
    """EROFS is no reason to wait: CgroupRemovalFailed, with what was removed so far."""
    fake_fs.add("/cg/memory/k/c1")
    fake_fs.add("/cg/pids/k/c1")
    fake_fs.rmdir_errors["/cg/pids/k/c1"] = errno.EROFS
    report = CleanupReport()
    with pytest.raises(CgroupRemovalFailed, match="EROFS"):
        remove_listed(["/cg/memory/k/c1", "/cg/pids/k/c1"], fake_fs, report)
    assert report.removed == ["/cg/memory/k/c1"]


def test_subtree_order(fake_fs: FakeCgroupFs) -> None:
    """Leaf-first order lists every descendant before its ancestor."""
    for p in ("/r", "/r/a", "/r/a/x", "/r/b"):
        fake_fs.add(p)
    order = subtree_leaf_first("/r", fake_fs)
    assert order[-1] == "/r" and order.index("/r/a/x") < order.index("/r/a")
    assert sorted(order) == ["/r", "/r/a", "/r/a/x", "/r/b"]


def test_clean_removal_does_not_load_tenacity() -> None:
    """One successful attempt never imports tenacity: a clean delete stays within its budget."""
    code = (
        "import sys; from tests.fakes import FakeClock, FakeCgroupFs;"
        "from runc_guard.delete.cleanup import drain;"
        "c = FakeClock(); fs = FakeCgroupFs(c); fs.add('/cg/a');"
        "drain(['/cg/a'], fs, c() + 3, 0.02, may_kill=True, clock=c);"
        "print('tenacity' in sys.modules, fs.dirs)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "False {}\n"
