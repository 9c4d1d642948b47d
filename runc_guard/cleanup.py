"""Wait until a container's cgroups are empty, then remove them leaf-first.

runc 1.1 gives up after ~150 ms (v1) or one try (v2) while a memcg OOM teardown
takes ~2 s. Here nothing is a fixed retry count: each attempt re-reads every
directory of the container (and any child cgroup below it), removes what is
empty, and the only limit is the deadline. Between attempts we sleep on
``cgroup.events`` where the kernel offers it (see CgroupFs.wait_for_change).
Following runc's RemovePath: ENOENT is success, children go first, and only
EBUSY is worth retrying; anything else fails fast.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from runc_guard.cgroupfs import CgroupFsOps
from runc_guard.errors import CgroupBusy, CgroupRemovalFailed

#: Longest sleep while a cgroup2 ``cgroup.events`` can wake us: the event is the
#: real signal, this only bounds the damage if a process left the unified tree.
EVENT_WAIT = 0.25


@dataclass
class CleanupReport:
    """What one cleanup did; filled in as it goes so a failure still reports it."""

    attempts: int = 0
    waited_ms: int = 0
    removed: list[str] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    #: Directories still present at the end -> live pids found in them.
    remaining: dict[str, tuple[int, ...]] = field(default_factory=dict)


class _StillBusy(Exception):
    """One attempt left directories behind; tenacity retries on exactly this."""

    def __init__(self, remaining: dict[str, tuple[int, ...]]) -> None:
        super().__init__(f"{len(remaining)} cgroup(s) remain")
        self.remaining = remaining


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


def _live_pids(path: str, fs: CgroupFsOps) -> tuple[int, ...]:
    return tuple(pid for pid in fs.read_procs(path) if fs.pid_alive(pid))


def attempt_removal(
    roots: Sequence[str], fs: CgroupFsOps, report: CleanupReport, kill: bool
) -> dict[str, tuple[int, ...]]:
    """One pass over every directory; returns what is left (path -> live pids)."""
    remaining: dict[str, tuple[int, ...]] = {}
    for root in roots:
        for path in subtree_leaf_first(root, fs):
            pids = _live_pids(path, fs)
            if pids:
                if kill:
                    for pid in pids:
                        if pid not in report.killed and fs.kill_if_member(pid, path):
                            report.killed.append(pid)
                remaining[path] = pids
                continue
            try:
                fs.rmdir(path)
            except FileNotFoundError:
                continue  # gone already: runc's RemovePath treats ENOENT as success too
            except OSError as exc:
                # EBUSY: a child we could not remove yet, or the kernel not done
                # with the last exit. ENODEV: the cgroup is being torn down.
                if exc.errno not in (errno.EBUSY, errno.ENODEV, errno.EINTR):
                    raise CgroupRemovalFailed(
                        path, errno.errorcode.get(exc.errno or 0, "?"), exc.strerror or ""
                    ) from exc
                remaining[path] = ()
                continue
            report.removed.append(path)
    return remaining


def remove_cgroups(
    roots: Sequence[str],
    fs: CgroupFsOps,
    deadline: float,
    poll_interval: float,
    kill_stragglers: bool,
    clock: Callable[[], float] = time.monotonic,
) -> CleanupReport:
    """Remove ``roots`` (and their subtrees) by ``deadline`` (a ``clock`` time).

    Raises CgroupBusy at the deadline and CgroupRemovalFailed on a non-retryable
    error; in both cases ``exc.report`` carries the CleanupReport. At least one
    attempt is made even when the deadline has already passed.
    """
    report = CleanupReport()
    started = clock()
    waiting_on: list[str] = []

    def one_attempt() -> None:
        report.attempts += 1
        remaining = attempt_removal(roots, fs, report, kill_stragglers)
        report.remaining = remaining
        if remaining:
            waiting_on[:] = [p for p, pids in remaining.items() if pids]
            raise _StillBusy(remaining)

    def sleep(seconds: float) -> None:
        event_wait = max(seconds, min(EVENT_WAIT, deadline - clock()))
        fs.wait_for_change(waiting_on, seconds, event_wait)

    def wait_time(_state: object = None) -> float:
        return max(0.0, min(poll_interval, deadline - clock()))

    def past_deadline(_state: object = None) -> bool:
        return clock() >= deadline

    def keep_trying() -> None:
        """Attempts 2..n. Only a cgroup that is still busy pays for tenacity's import
        (~15 ms); a clean delete, the common case, is done after one attempt."""
        from tenacity import Retrying, retry_if_exception_type

        if past_deadline():
            raise _StillBusy(report.remaining)
        sleep(wait_time())
        retrying = Retrying(
            retry=retry_if_exception_type(_StillBusy),
            stop=past_deadline,
            wait=wait_time,
            sleep=sleep,
            reraise=True,
        )
        retrying(one_attempt)

    try:
        try:
            one_attempt()
        except _StillBusy:
            keep_trying()
    except _StillBusy as exc:
        report.waited_ms = int((clock() - started) * 1000)
        path, pids = max(exc.remaining.items(), key=lambda item: len(item[1]))
        busy = CgroupBusy(path, pids, report.waited_ms)
        busy.report = report
        raise busy from None
    except CgroupRemovalFailed as exc:
        report.waited_ms = int((clock() - started) * 1000)
        exc.report = report
        raise
    report.waited_ms = int((clock() - started) * 1000)
    return report
