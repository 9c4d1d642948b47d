"""Reclaim a container's memory cgroup before its rmdir, so that the kernel frees it.

A memory cgroup removed while pages are still charged to it stays in the kernel,
"dying" (``/proc/cgroups`` counts it, v2's ``cgroup.stat`` shows it in
``nr_dying_descendants``), until those pages are reclaimed, holding its per-CPU
statistics all the while. Memory cgroup ids are capped at 65,535: once they run
out, no cgroup with the memory controller can be created and no pod starts. A
container that wrote a file which outlives it (a log in an ``emptyDir`` or a
``hostPath``) pins one per incarnation; no runtime reclaims before its rmdir.

- v2: ``memory.reclaim`` (Linux 5.19+) reclaims up to the bytes written from
  this cgroup alone and answers EAGAIN when it could not reclaim that much; a
  write per CHUNK, so a deadline bounds it.
- v1: ``memory.force_empty`` reclaims everything charged and blocks until it
  has, or until 16 retries fail (mem_cgroup_force_empty): it cannot be bounded
  from outside.

Both run only on a charge of at most MAX_CHARGE with at most MAX_DIRTY dirty or
under writeback: dropping clean page cache is cheap, writeback is what makes it
slow (measured here, v1: 64 MiB clean 6.6 ms, 8 MiB dirty 7.2 ms, 64 MiB dirty
51 ms; a node's network disk writes back slower). A larger or dirtier cache is
left as the runtime alone leaves it, rather than cost the reply a budget spent
in vain.

Only the caller's path is written, never a parent: reclaiming a pod's or QoS
cgroup would evict a running sibling's cache. The caller proves the path is the
container's own and empty: no process in it and no cgroup below it (a v1
reclaim takes the whole subtree's pages: cleanup.attempt_removal). Every failure is "not reclaimed":
the rmdir goes on as the runtime's would, the memcg then dying as it does today.
Stdlib only.
"""

from __future__ import annotations

import errno
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

#: What a delete spends reclaiming before its reply, at most (the deadline bounds it too): the
#: common case (a few MiB of page cache) takes a few ms; a large cache is left as it is today.
DELETE_BUDGET = 0.1
#: What the sweep spends on one leaked container's memory cgroups (niced, paced, off every reply).
SWEEP_BUDGET = 1.0
#: One ``memory.reclaim`` write asks for at most this much (v2).
CHUNK = 16 << 20
#: Reclaimed only when at most this much page cache is charged ... (v1's force_empty is all or nothing, and a
#: v2 reclaim that gives up at its budget would have cost the reply that time for nothing)
MAX_CHARGE = 128 << 20
#: ... of which at most this much is dirty or under writeback (memory.stat).
MAX_DIRTY = 4 << 20

#: Above this share of time some task stalled on I/O (PSI, /proc/pressure/io ``some avg10``, %),
#: reclaiming dirty pages would add writeback to a node already waiting on its disk: the memcg is
#: left as it is. Clean page cache is dropped without any I/O, so it is reclaimed regardless.
IO_PRESSURE_MAX = 20.0
IO_PRESSURE = "/proc/pressure/io"

V1, V2 = "force_empty", "reclaim"


class Reclaim:
    """What one reclaim did: bytes charged before and left after (None: no memory controller)."""

    __slots__ = ("after", "before", "method", "skipped")

    def __init__(self, before: int | None, after: int | None, method: str = "", skipped: str = "") -> None:
        self.before = before
        self.after = after
        self.method = method
        #: Why pages are left charged: nothing written although they were, or what the write left
        #: ("" when it reclaimed all the page cache, or none was charged).
        self.skipped = skipped

    @property
    def reclaimed(self) -> int:
        if self.before is None or self.after is None:
            return 0
        return max(0, self.before - self.after)


def read_int(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def write_control(path: str, data: bytes) -> int:
    """One write to a control file; 0 or the errno it failed with."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        return exc.errno or errno.EIO
    try:
        os.write(fd, data)
        return 0
    except OSError as exc:
        return exc.errno or errno.EIO
    finally:
        os.close(fd)


def _name(code: int) -> str:
    return errno.errorcode.get(code, str(code))


#: memory.stat's lines, v1's own (not its total_ ones) and v2's: page cache (shmem included),
#: dirty, under writeback.
_CACHE_KEY = {V1: b"cache", V2: b"file"}
_DIRTY_KEYS = {V1: (b"dirty", b"writeback"), V2: (b"file_dirty", b"file_writeback")}

#: Why a memcg goes dying although reclaim ran: page cache it could not drop (under writeback,
#: or mapped again meanwhile; a later, paced reclaim may), or shmem (a tmpfs file that outlives
#: the container, as a pod's shared /dev/shm or a memory-backed emptyDir: only swap could take
#: it, which no reclaim here asks for).
LEFT = "page cache left after reclaim"
#: Why a v1 memcg with dirty pages is held rather than reclaimed on the reply's time (hold_dirty).
DIRTY = "dirty pages (left to writeback, reclaimed after the reply)"
SHMEM = "shmem charged (tmpfs pages outlive the container)"
#: What :func:`reclaim` gives up on that a later, paced reclaim can still do (delete.memcg_hold). Not an
#: error of the kernel's (``memory.force_empty: EBUSY``) or an unreadable memory.stat: those stay as they are.
HOLDABLE = ("page cache too large", "too much dirty", "deadline", "I/O pressure", LEFT, DIRTY)


def holdable(reason: str) -> bool:
    return reason.startswith(HOLDABLE)


def page_cache(path: str, method: str) -> tuple[int, int, int] | None:
    """(reclaimable page cache, of which dirty or under writeback, shmem) charged to the memcg at
    ``path``, in bytes; None when memory.stat is unreadable. Shmem is page cache to the kernel's
    counters but is not reclaimed without swap: it is counted apart."""
    try:
        with open(os.path.join(path, "memory.stat"), "rb") as f:
            stat = dict(line.split()[:2] for line in f.read().splitlines() if line.count(b" ") >= 1)
        dirty = sum(int(stat.get(key, b"0")) for key in _DIRTY_KEYS[method])
        shmem = int(stat.get(b"shmem", b"0"))
        return max(0, int(stat.get(_CACHE_KEY[method], b"0")) - shmem), dirty, shmem
    except (OSError, ValueError):
        return None


def charged(path: str) -> tuple[str, int] | None:
    """(method, bytes charged) of the memory cgroup at ``path``; None: no memory controller there."""
    current = read_int(os.path.join(path, "memory.current"))
    if current is not None:
        return V2, current
    usage = read_int(os.path.join(path, "memory.usage_in_bytes"))
    if usage is not None:
        return V1, usage
    return None


def io_pressure(path: str = IO_PRESSURE) -> float | None:
    """PSI's ``some avg10`` for I/O (percent); None without PSI (CONFIG_PSI off, psi=0, old kernel)."""
    try:
        with open(path, "rb") as f:
            first = f.readline().split()
        return float(dict(field.split(b"=", 1) for field in first[1:])[b"avg10"])
    except (OSError, ValueError, KeyError, IndexError):
        return None


def reclaim(
    path: str, deadline: float, clock: Callable[[], float] = time.monotonic, pressure: str = IO_PRESSURE,
    hold_dirty: bool = False,
) -> Reclaim:
    """Reclaim what is charged to the (empty, the container's own) memory cgroup at ``path``.

    Not under I/O pressure (``pressure``: PSI's file; unknown pressure does not stop it,
    the bounds above still hold). ``hold_dirty``: the caller can hold a v1 memcg aside for a
    finisher (delete.memcg_hold), so one with any dirty page is left to it (:data:`DIRTY`):
    the kernel's reclaim waits up to 100 ms (its writeback throttle) on a dirty page it cannot
    write itself, such as an ext4 metadata block the journal holds, then leaves it charged.
    """
    found = charged(path)
    if found is None:
        return Reclaim(None, None)
    method, before = found
    if before == 0:
        return Reclaim(0, 0, method)
    cache = page_cache(path, method)
    if cache is None:
        return Reclaim(before, before, method, skipped="memory.stat unreadable")
    if cache[0] == 0:
        # No page cache: an exited cgroup's anonymous memory is gone and the kernel reparents its
        # kernel memory when it goes offline. A force_empty here would only cost the reply ~2.5 ms.
        return Reclaim(before, before, method, skipped=SHMEM if cache[2] else "")
    stalled = io_pressure(pressure) if cache[1] else None  # clean pages are dropped, never written
    if stalled is not None and stalled > IO_PRESSURE_MAX:
        return Reclaim(before, before, method, skipped=f"I/O pressure (some avg10 {stalled:.0f}%)")
    if cache[0] > MAX_CHARGE:
        return Reclaim(before, before, method, skipped="page cache too large to reclaim on the reply's time")
    if cache[1] > MAX_DIRTY:
        return Reclaim(before, before, method, skipped="too much dirty (writeback would block)")
    if cache[1] and hold_dirty and method == V1:
        return Reclaim(before, before, method, skipped=DIRTY)
    result = (_reclaim_v2 if method == V2 else _reclaim_v1)(path, before, deadline, clock)
    if not result.skipped:
        # The kernel said done; memory.stat says whether it is: force_empty gives up after 16
        # rounds without progress (pages under writeback), and kernel memory still counted in the
        # usage until offline does not pin the memcg. One read (~0.1 ms), only after a reclaim.
        left = page_cache(path, method)
        if left is not None and left[0]:
            result.skipped = f"{LEFT} ({left[0] >> 10} KiB, {left[1] >> 10} KiB dirty or under writeback)"
        elif left is not None and left[2]:
            result.skipped = SHMEM
    return result


def _reclaim_v2(path: str, before: int, deadline: float, clock: Callable[[], float]) -> Reclaim:
    control = os.path.join(path, "memory.reclaim")
    left = before
    stalls = 0
    while left > 0 and clock() < deadline:
        failed = write_control(control, str(min(left, CHUNK)).encode())
        now = read_int(os.path.join(path, "memory.current"))
        if now is None:
            break
        if failed not in (0, errno.EAGAIN):
            return Reclaim(before, now, V2, skipped=f"memory.reclaim: {_name(failed)}")
        stalls = 0 if now < left else stalls + 1
        left = now
        if stalls >= 2:
            break  # nothing more the kernel can reclaim now (unevictable, or under writeback)
    if left == 0:
        return Reclaim(before, 0, V2)
    return Reclaim(before, left, V2, skipped="deadline" if clock() >= deadline else "")


def _reclaim_v1(path: str, before: int, deadline: float, clock: Callable[[], float]) -> Reclaim:
    if clock() >= deadline:
        return Reclaim(before, before, V1, skipped="deadline")
    failed = write_control(os.path.join(path, "memory.force_empty"), b"0")
    after = read_int(os.path.join(path, "memory.usage_in_bytes"))
    if failed:
        return Reclaim(before, after, V1, skipped=f"memory.force_empty: {_name(failed)}")
    return Reclaim(before, after, V1)
