"""Wait until a container's cgroups are empty, then (optionally) remove them leaf-first.

runc 1.1 gives up after ~150 ms (v1) or one try (v2) while a memcg OOM teardown
takes ~2 s. Here nothing is a fixed retry count: each attempt re-reads every
directory of the container (and any child cgroup below it), removes what is
empty, and the only limit is the deadline. Between attempts we sleep on
``cgroup.events`` where the kernel offers it (see CgroupFs.wait_for_change).
The loop follows runc's RemovePath: ENOENT is success, children go first, and
only EBUSY is worth retrying; anything else fails fast.

What may be killed is the caller's decision (``may_kill``): runc's own destroy
SIGKILLs the cgroup's processes only for a container without a private PID
namespace. In a private namespace the kernel kills everything once init dies,
so every process still inside should be dying; one that stays alive and
un-signalled is not the container's (``watch_foreign``) and the delete steps aside.
"""

from __future__ import annotations

import errno
import time

from runc_guard.delete.cgroupfs import CgroupFsOps
from runc_guard.delete.reclaim import DIRTY, holdable
from runc_guard.errors import CgroupBusy, CgroupRemovalFailed, CleanupReport, ForeignProcess

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

#: Longest sleep while a cgroup2 ``cgroup.events`` can wake us: the event is the
#: real signal, this only bounds the damage if a process left the unified tree.
EVENT_WAIT = 0.25
#: A process in a private-PID-namespace container's cgroup that is seen alive and
#: not dying this many times, over at least FOREIGN_AFTER seconds, is not the
#: container's: the kernel's zap of the namespace would have SIGKILLed it.
FOREIGN_STRIKES = 3
FOREIGN_AFTER = 0.2
#: rmdir errors that waiting can fix. EBUSY: a child not removed yet, or the kernel
#: not done with the last exit. ENODEV: the cgroup is being torn down.
_RETRYABLE = (errno.EBUSY, errno.ENODEV, errno.EINTR)


def subtree_leaf_first(root: str, fs: CgroupFsOps) -> list[str]:
    """``root`` and every cgroup below it, children before parents."""
    order: list[str] = []
    stack = [(root, False)]
    while stack:
        path, expanded = stack.pop()
        if expanded:
            order.append(path)
            continue
        stack.append((path, True))
        stack.extend((child, False) for child in fs.children(path))
    return order


def live_pids(path: str, fs: CgroupFsOps) -> tuple[int, ...]:
    """Live pids in ``path``. A 0 is a process outside our PID namespace (cgroup v2):
    it keeps the cgroup populated but can never be signalled or looked up."""
    return tuple(pid for pid in fs.read_procs(path) if pid <= 0 or fs.pid_alive(pid))


def populated_dirs(roots: Sequence[str], fs: CgroupFsOps) -> list[str]:
    """The directories of ``roots``' subtrees that hold a live process: a container is empty only
    when nothing below it holds one either (a child cgroup: Docker-in-Docker, kind, systemd inside)."""
    return [path for root in roots for path in subtree_leaf_first(root, fs) if live_pids(path, fs)]


def _below(path: str, left: Iterable[str]) -> bool:
    """A cgroup in ``left`` lies below ``path``: ``path`` is not empty, whatever its own cgroup.procs says.

    The kernel refuses its rmdir (EBUSY), but not a v1 rename (cgroup1_rename has no child
    check), and a memory cgroup's reclaim takes its descendants' pages with it.
    """
    prefix = path.rstrip("/") + "/"
    return any(p.startswith(prefix) for p in left)


class Reclaimer:
    """Reclaims each empty memory cgroup once, before its rmdir, within one budget (delete.reclaim).

    Empty means no process in it and no cgroup below it (the caller's rule: :func:`attempt_removal`).
    The budget starts at the first cgroup that has pages charged, so the wait for
    the cgroups to empty does not eat it, and never runs past ``deadline``.
    ``budget`` 0: nothing is reclaimed (a caller that must not spend the time).
    """

    def __init__(
        self, fs: CgroupFsOps, report: CleanupReport, budget: float, deadline: float,
        clock: Callable[[], float] = time.monotonic, hold: Callable[[str, str], str | None] | None = None,
    ) -> None:
        self.fs = fs
        self.report = report
        self.budget = budget
        self.deadline = deadline
        self.clock = clock
        #: (path, why not reclaimed) -> the held path, or None: delete.memcg_hold, for a finisher to reclaim.
        self.hold = hold
        self.until: float | None = None
        self.done: set[str] = set()

    def __call__(self, path: str, top: bool = False) -> None:
        """Reclaim the empty ``path``; ``top``: it is one of the container's own directories (a root),
        the only kind a hold may rename: a descendant's held name would sit inside the tree that the
        runtime and the cleanup remove next."""
        if self.budget <= 0 or path in self.done:
            return
        self.done.add(path)
        hold = self.hold if top else None
        until = self.until if self.until is not None else min(self.deadline, self.clock() + self.budget)
        # Dirty pages are left to a hold when a finisher will run (v1): the kernel's reclaim can wait
        # 100 ms on them, on the reply's time. Where the hold cannot be (a unit's cgroup), they are
        # reclaimed below after all: a rare second look costs less than importing delete.memcg_hold
        # on every delete.
        result = self.fs.reclaim_memory(path, until, hold_dirty=hold is not None)
        if self.until is None and result.before:
            # The budget starts here, at the first memory cgroup with pages charged: not at the first
            # empty directory of any hierarchy (a freezer or pids directory empties first, and the
            # memory one, held up by a process dying slowly, seconds later).
            self.until = until
        self.report.reclaimed += result.reclaimed
        if result.skipped and hold is not None and holdable(result.skipped):
            held = hold(path, result.skipped)
            if held is not None:
                self.report.held[path] = held  # gone from ``path``: the rmdir after finds ENOENT
                return
            if result.skipped == DIRTY:  # not held after all (a record of that name, the rename failed)
                result = self.fs.reclaim_memory(path, until)
                self.report.reclaimed += result.reclaimed
        if result.skipped:
            self.report.unreclaimed[path] = result.skipped
        else:
            self.report.unreclaimed.pop(path, None)


def attempt_removal(
    roots: Sequence[str], fs: CgroupFsOps, report: CleanupReport, kill: bool, remove: bool = True,
    reclaim: Reclaimer | None = None,
) -> dict[str, tuple[int, ...]]:
    """One pass over every directory; returns what is left (path -> live pids).

    A directory is empty when no live process is in it and no cgroup is left
    below it (children go first: one still populated, or not removed). Only an
    empty one is reclaimed, held (only a root) or removed; a process anywhere
    below is in what is left, under its own path. With ``remove=False`` nothing
    is removed: its subtree empty of processes, a directory is simply done.
    ``reclaim``: an empty directory's memory is reclaimed first (removed or not).
    """
    remaining: dict[str, tuple[int, ...]] = {}
    for root in roots:
        left: list[str] = []  # this subtree's directories still there after their turn
        for path in subtree_leaf_first(root, fs):
            pids = live_pids(path, fs)
            if pids:
                if kill:
                    for pid in pids:
                        if pid > 0 and pid not in report.killed and fs.kill_if_member(pid, path):
                            report.killed.append(pid)
                remaining[path] = pids
                left.append(path)
                continue
            if _below(path, left):
                left.append(path)
                if remove:
                    remaining[path] = ()  # its rmdir would fail (EBUSY) until the child is gone
                continue
            if reclaim is not None:
                reclaim(path, top=path == root)
            if remove:
                _rmdir(path, fs, report, remaining)
            if not remove or path in remaining:
                left.append(path)
    return remaining


def remove_listed(
    paths: Sequence[str], fs: CgroupFsOps, report: CleanupReport, reclaim: Reclaimer | None = None
) -> dict[str, tuple[int, ...]]:
    """rmdir ``paths`` in the order given (leaf-first), without looking at them again.

    For a caller that has just read every one of them (children and
    ``cgroup.procs``) and decided from that look: a second read of each
    ``cgroup.procs`` would double the sweep's cgroupfs reads (a cgroup v1
    read builds a pid list the kernel frees later). A process or child cgroup
    that appeared since the look is still safe: the kernel refuses rmdir of a
    populated cgroup or one with children (EBUSY), and such a path is returned
    as remaining, like :func:`attempt_removal` does. ``reclaim``: each one's memory is
    reclaimed first (delete.reclaim).
    """
    remaining: dict[str, tuple[int, ...]] = {}
    for path in paths:
        if _below(path, remaining):
            remaining[path] = ()  # a child refused its rmdir: neither reclaimed nor removed (attempt_removal)
            continue
        if reclaim is not None:
            reclaim(path)
        _rmdir(path, fs, report, remaining)
    return remaining


def _rmdir(path: str, fs: CgroupFsOps, report: CleanupReport, remaining: dict[str, tuple[int, ...]]) -> None:
    """One rmdir the RemovePath way: ENOENT is done, EBUSY and the like stay, anything else fails."""
    try:
        fs.rmdir(path)
    except FileNotFoundError:
        return  # gone already: runc's RemovePath treats ENOENT as success too
    except OSError as exc:
        if exc.errno not in _RETRYABLE:
            raise CgroupRemovalFailed(
                path, errno.errorcode.get(exc.errno or 0, "?"), exc.strerror or "", report
            ) from exc
        remaining[path] = ()
        return
    report.removed.append(path)


class _ForeignWatch:
    """Counts how long each live, un-signalled pid has been seen (private PID namespace only)."""

    def __init__(self, fs: CgroupFsOps, clock: Callable[[], float]) -> None:
        self.fs = fs
        self.clock = clock
        self.first_seen: dict[int, float] = {}
        self.strikes: dict[int, int] = {}

    def check(self, remaining: dict[str, tuple[int, ...]]) -> tuple[str, int] | None:
        """The first (path, pid) that has proven not to be the container's, else None."""
        now = self.clock()
        for path, pids in remaining.items():
            for pid in pids:
                if pid <= 0 or self.fs.pid_dying(pid):
                    self.strikes.pop(pid, None)
                    continue
                self.strikes[pid] = self.strikes.get(pid, 0) + 1
                first = self.first_seen.setdefault(pid, now)
                if self.strikes[pid] >= FOREIGN_STRIKES and now - first >= FOREIGN_AFTER:
                    return path, pid
        return None


def drain(
    roots: Sequence[str],
    fs: CgroupFsOps,
    deadline: float,
    poll_interval: float,
    *,
    may_kill: bool,
    remove: bool = True,
    watch_foreign: bool = False,
    clock: Callable[[], float] = time.monotonic,
    reclaim_budget: float = 0.0,
    hold: Callable[[str, str], str | None] | None = None,
) -> CleanupReport:
    """Wait until ``roots`` (and their subtrees) are empty, removing them if ``remove``.

    ``reclaim_budget``: seconds to spend reclaiming the empty memory cgroups among
    them (each once, before its rmdir; see delete.reclaim); 0 reclaims nothing.
    ``hold``: where the budget cannot do it, a memory cgroup may be held aside for
    a reclaim after the reply instead (delete.memcg_hold; see Reclaimer).

    A plain deadline loop, as runc's RemovePath: attempt, and while anything is
    left, sleep until a cgroup changes or a poll interval passes. At least one
    attempt is made even when the deadline has already passed. Raises CgroupBusy
    at the deadline, CgroupRemovalFailed on an error waiting cannot fix, and
    ForeignProcess when ``watch_foreign`` finds a process that is not dying;
    each carries the CleanupReport.
    """
    report = CleanupReport()
    started = clock()
    watch = _ForeignWatch(fs, clock) if watch_foreign else None
    reclaim = Reclaimer(fs, report, reclaim_budget, deadline, clock, hold) if reclaim_budget > 0 else None
    while True:
        report.attempts += 1
        try:
            remaining = attempt_removal(roots, fs, report, may_kill, remove, reclaim)
        finally:
            report.waited_ms = int((clock() - started) * 1000)
        report.remaining = remaining
        if not remaining:
            return report
        if watch is not None:
            foreign = watch.check(remaining)
            if foreign is not None:
                raise ForeignProcess(foreign[0], foreign[1], report)
        now = clock()
        if now >= deadline:
            path, pids = max(remaining.items(), key=lambda item: len(item[1]))
            raise CgroupBusy(path, pids, report.waited_ms, report)
        populated = [path for path, pids in remaining.items() if pids]
        sleep = max(0.0, min(poll_interval, deadline - now))
        fs.wait_for_change(populated, sleep, max(sleep, min(EVENT_WAIT, deadline - now)))

