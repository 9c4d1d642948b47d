"""Reclaim a container's memory cgroup before its rmdir, so that the kernel frees it.

A memory cgroup removed while pages are still charged to it stays in the kernel,
"dying" (``/proc/cgroups`` counts it, v2's ``cgroup.stat`` shows it in
``nr_dying_descendants``), until those pages are reclaimed, holding its per-CPU
statistics all the while. Memory cgroup ids are capped at 65,535: once they run
out, no cgroup with the memory controller can be created and no pod starts. A
container that wrote a file which outlives it (a log in an ``emptyDir`` or a
``hostPath``) pins one per incarnation; no runtime reclaims before its rmdir.

Page cache is charged to whoever touched it first, so a dead container's memcg
also holds pages that running containers still read (an image layer's files
through overlay's lower directory, a shared volume, a hostPath). Evicting them
makes those containers read them from disk again; the runtime alone leaves them
cached (issue 42 case 3). So only *cold* page cache is reclaimed: what sits on
the memcg's inactive file list, used once since it was charged. A page read
again by anyone (the dead container before it died, or a live sibling: the
kernel cannot tell which) is on the active list and stays, and so does the
memcg (dying, as with the runtime alone; the reason is named). Up to
ACTIVE_SLACK of active pages go with the cold ones: a file write activates a
few filesystem metadata pages (here 4-16 KiB per 1-256 MiB written, 152 KiB
for a file mlocked and let go), and a memcg pinned for those would be the
leak this module exists to stop; evicting them costs a running reader at most
that many pages read again, once.

- Never swap: a v1 memcg's own ``memory.swappiness`` is set to 0 first (cgroup
  reclaim then scans file pages only: get_scan_count's SCAN_FILE); v2 writes
  ``swappiness=0`` with ``memory.reclaim`` where the kernel takes it (6.11+), else
  sets ``memory.swap.max`` to 0, else reclaims only on a node without swap.
  Shmem (a pod's ``/dev/shm``, a memory-backed ``emptyDir`` shared with running
  siblings) is only ever taken by swap: it stays.
- Bounded: each request asks the kernel for at most STEP bytes, and for no more
  than RATE says it drops in the time left, and none starts past the deadline.
  v2 writes that to ``memory.reclaim``; v1 lowers ``memory.limit_in_bytes`` by it
  (mem_cgroup_resize_max reclaims until the usage fits, then returns).
  ``memory.force_empty``, which loops until the usage is 0 and no deadline can
  interrupt, only ever gets a tiny clean remainder (FINAL, and what per-CPU
  LRU batches still hold: BATCHED_PER_CPU).
- On a kernel that reparents a dead memcg's page cache itself (the "reparent LRU
  folios" series, Linux 7.x), removing the memcg frees it and a reclaim would
  only evict: nothing is reclaimed there. Which kernel this is is a behaviour
  probe's answer (node.memcg_probe), cached per boot; read here only when page
  cache is charged, never probed on a delete. Unknown (no probe has run yet)
  reclaims as before: every LTS kernel nodes run pins, where a memcg removed
  charged stays dying for good, while a cold-only reclaim on a kernel that did
  not need it costs at most a re-read of pages nobody had used twice.

Clean cold pages are dropped without I/O; dirty ones are written back first, so
a charge with more than MAX_DIRTY dirty (or a large one) is left alone or held
(delete.memcg_hold) rather than cost the reply.

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
#: One request to the kernel (v2 ``memory.reclaim``, v1 a lowered limit) asks for at most this much.
STEP = 8 << 20
#: ... and for no more than this many bytes per second left before the deadline: clean page cache goes
#: at ~10 GB/s here (v1, 64 MiB clean in 6.6 ms), dirty at ~1.2 GB/s (64 MiB in 51 ms); this is a
#: tenth of the slower, so a request started in time ends in time.
RATE = 128 << 20
PAGE = 4096
#: A request that freed nothing while dirty pages are left: the kernel has woken the flusher for them,
#: so the next one waits this long first, at most WRITEBACK_WAITS times, never past the deadline.
WRITEBACK_PAUSE = 0.01
WRITEBACK_WAITS = 10
#: v1: a remainder this small, none of it dirty or under writeback, at most this much of it active,
#: is finished by ``memory.force_empty``: its lru_add_drain_all takes the pages still in per-CPU LRU
#: batches (charged, on no list yet: no lowered limit sees those, and a budget read from the lists
#: misses them until they land there during the reclaim), and with no writeback to wait on, its
#: rounds over a few pages end at once. Anything larger or dirtier never goes to force_empty.
FINAL = 64 << 10
#: ... plus this much per CPU, for those batches (a folio batch holds 15 folios, 31 on newer kernels,
#: per CPU and kind). Seen here (6.1, 2 CPUs): 1 MiB read by a container on one CPU and its memcg
#: reclaimed from the other left 106-112 KiB in batches and 64-176 KiB on the inactive list.
BATCHED_PER_CPU = 128 << 10
#: Active (in-use) page cache reclaimed with the cold: more than this and none of it is (:func:`reclaimable`).
ACTIVE_SLACK = 256 << 10
#: Reclaimed only when at most this much page cache is reclaimable ... (a reclaim that gives up at its
#: budget would have cost the reply that time for nothing; a larger one is held on v1)
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
#: dirty, under writeback, the file LRU lists (shmem is on the anon ones).
_CACHE_KEY = {V1: b"cache", V2: b"file"}
_DIRTY_KEYS = {V1: (b"dirty", b"writeback"), V2: (b"file_dirty", b"file_writeback")}

#: Why a memcg goes dying although reclaim ran: page cache it could not drop (under writeback,
#: or mapped again meanwhile; a later, paced reclaim may), or shmem (a tmpfs file that outlives
#: the container, as a pod's shared /dev/shm or a memory-backed emptyDir: only swap could take
#: it, which no reclaim here allows).
LEFT = "page cache left after reclaim"
#: Why a v1 memcg with dirty pages is held rather than reclaimed on the reply's time (hold_dirty).
DIRTY = "dirty pages (left to writeback, reclaimed after the reply)"
SHMEM = "shmem charged (tmpfs pages outlive the container)"
#: Page cache on the active list: read again since it was charged, maybe by a running container
#: (a shared layer or volume). Left as the runtime leaves it; holding it would only delay the same.
IN_USE = "page cache in use"
#: Neither swappiness nor swap.max could rule swap out, and the node has swap: nothing reclaimed.
SWAP = "swap could not be ruled out"
#: What :func:`reclaim` gives up on that a later, paced reclaim can still do (delete.memcg_hold). Not an
#: error of the kernel's (``memory.reclaim: EBUSY``), an unreadable memory.stat or pages in use: those stay.
HOLDABLE = ("page cache too large", "too much dirty", "deadline", "I/O pressure", LEFT, DIRTY)


def holdable(reason: str) -> bool:
    return reason.startswith(HOLDABLE)


class Cache:
    """A memcg's page cache from its memory.stat, in bytes: ``file`` (shmem not included), of which
    ``dirty`` (or under writeback), ``cold`` (on the inactive list) and ``active``; ``shmem`` apart."""

    __slots__ = ("active", "cold", "dirty", "file", "shmem")

    def __init__(self, file: int, dirty: int, shmem: int, cold: int, active: int) -> None:
        self.file, self.dirty, self.shmem, self.cold, self.active = file, dirty, shmem, cold, active


def cache_of(path: str, method: str) -> Cache | None:
    """The page cache charged to the memcg at ``path``; None when memory.stat is unreadable."""
    try:
        with open(os.path.join(path, "memory.stat"), "rb") as f:
            stat = dict(line.split()[:2] for line in f.read().splitlines() if line.count(b" ") >= 1)
        dirty = sum(int(stat.get(key, b"0")) for key in _DIRTY_KEYS[method])
        shmem = int(stat.get(b"shmem", b"0"))
        file = max(0, int(stat.get(_CACHE_KEY[method], b"0")) - shmem)
        cold = min(file, int(stat.get(b"inactive_file", b"0")))
        return Cache(file, dirty, shmem, cold, int(stat.get(b"active_file", b"0")))
    except (OSError, ValueError):
        return None


def page_cache(path: str, method: str) -> tuple[int, int, int] | None:
    """(reclaimable page cache, of which dirty or under writeback, shmem) charged to the memcg at
    ``path``, in bytes; None when memory.stat is unreadable. Shmem is page cache to the kernel's
    counters but is not reclaimed without swap: it is counted apart."""
    cache = cache_of(path, method)
    return None if cache is None else (cache.file, cache.dirty, cache.shmem)


def reclaimable(cache: Cache) -> int:
    """What may be reclaimed: the cold pages, and the active ones too when no more than ACTIVE_SLACK."""
    return cache.cold + (cache.active if cache.active <= ACTIVE_SLACK else 0)


def in_use(cache: Cache) -> str:
    return f"{IN_USE} ({cache.active >> 10} KiB on the active list: a running container may read it)"


#: ``<cache_dir>/memcg-reparents``: node.memcg_probe's answer for this boot, ``1 <release>`` or
#: ``0 <release>`` (the release read back, so a cache left from another kernel is no answer).
PROBE_FILE = "memcg-reparents"


def kernel_reparents(path: str) -> bool | None:
    """Whether this kernel reparents a dead memcg's page cache itself (node.memcg_probe's cached
    answer for this kernel release); None: no answer yet, or it was for another kernel."""
    try:
        with open(path, "rb") as f:
            answer, release = f.read(256).split()[:2]
    except (OSError, ValueError):
        return None
    if release.decode("utf-8", "replace") != os.uname().release or answer not in (b"0", b"1"):
        return None
    return answer == b"1"


def swap_total(meminfo: str = "/proc/meminfo") -> int | None:
    """The node's swap in bytes (0: none); None when unreadable."""
    try:
        with open(meminfo, "rb") as f:
            for line in f:
                if line.startswith(b"SwapTotal:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        return None
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
    hold_dirty: bool = False, probe: str | None = None, meminfo: str = "/proc/meminfo",
) -> Reclaim:
    """Reclaim the cold page cache charged to the (empty, the container's own) memory cgroup at ``path``.

    Not under I/O pressure (``pressure``: PSI's file; unknown pressure does not stop it,
    the bounds above still hold). ``hold_dirty``: the caller can hold a v1 memcg aside for a
    finisher (delete.memcg_hold), so one with any dirty page is left to it (:data:`DIRTY`):
    the kernel's reclaim waits up to 100 ms (its writeback throttle) on a dirty page it cannot
    write itself, such as an ext4 metadata block the journal holds, then leaves it charged.
    ``probe``: node.memcg_probe's cached answer (:func:`kernel_reparents`), read only when page
    cache is charged; a kernel that reparents it gets no reclaim.
    """
    found = charged(path)
    if found is None:
        return Reclaim(None, None)
    method, before = found
    if before == 0:
        return Reclaim(0, 0, method)
    cache = cache_of(path, method)
    if cache is None:
        return Reclaim(before, before, method, skipped="memory.stat unreadable")
    if cache.file == 0:
        # No page cache: an exited cgroup's anonymous memory is gone and the kernel reparents its
        # kernel memory when it goes offline. A reclaim here would only cost the reply.
        return Reclaim(before, before, method, skipped=SHMEM if cache.shmem else "")
    if probe is not None and kernel_reparents(probe):
        return Reclaim(before, before, method)  # removed, its pages move to the parent: not dying
    budget = reclaimable(cache)
    if budget < PAGE:  # nothing cold: on the active list (in use), or unevictable (mlocked)
        skipped = in_use(cache) if cache.active >= PAGE else f"{LEFT} ({cache.file >> 10} KiB, none cold)"
        return Reclaim(before, before, method, skipped=skipped)
    stalled = io_pressure(pressure) if cache.dirty else None  # clean pages are dropped, never written
    if stalled is not None and stalled > IO_PRESSURE_MAX:
        return Reclaim(before, before, method, skipped=f"I/O pressure (some avg10 {stalled:.0f}%)")
    if budget > MAX_CHARGE:
        return Reclaim(before, before, method, skipped="page cache too large to reclaim on the reply's time")
    if cache.dirty > MAX_DIRTY:
        return Reclaim(before, before, method, skipped="too much dirty (writeback would block)")
    if cache.dirty and hold_dirty and method == V1:
        return Reclaim(before, before, method, skipped=DIRTY)
    why = forbid_swap(path, method, meminfo)
    if why:
        return Reclaim(before, before, method, skipped=why)
    result = reclaim_cold(path, method, budget, deadline, clock, meminfo)
    if not result.skipped:
        # What is left decides: pages on the active list were left on purpose (in use); cold ones
        # the kernel could not drop (under writeback, mapped and locked) a later reclaim may.
        left = cache_of(path, method)
        if left is not None and left.file and reclaimable(left) < PAGE and left.active >= PAGE:
            result.skipped = in_use(left)
        elif left is not None and left.file:
            kib, dirty = left.file >> 10, left.dirty >> 10
            result.skipped = f"{LEFT} ({kib} KiB, {dirty} KiB dirty or under writeback)"
        elif left is not None and left.shmem:
            result.skipped = SHMEM
    return result


def forbid_swap(path: str, method: str, meminfo: str = "/proc/meminfo") -> str:
    """Make every later reclaim of the memcg at ``path`` leave anonymous and shmem pages alone; ""
    when done (or the node has no swap), else why not. v1: its own ``memory.swappiness`` 0 (cgroup
    reclaim then scans file pages only). v2: ``memory.swap.max`` 0 where the file is; the reclaim
    itself also asks ``swappiness=0`` (:func:`reclaim_cold`)."""
    control = "memory.swappiness" if method == V1 else "memory.swap.max"
    failed = write_control(os.path.join(path, control), b"0")
    if failed == 0 or method == V2:
        return ""  # v2 without swap.max: memory.reclaim's own swappiness=0 decides (reclaim_cold)
    if swap_total(meminfo) == 0:
        return ""
    return f"{SWAP} (memory.swappiness: {_name(failed)})"


def reclaim_cold(
    path: str, method: str, cold: int, deadline: float, clock: Callable[[], float] = time.monotonic,
    meminfo: str = "/proc/meminfo", sleep: Callable[[float], None] = time.sleep,
) -> Reclaim:
    """Ask the kernel for at most ``cold`` bytes of the memcg at ``path``, a bounded step at a time.

    Each step asks for at most STEP bytes and at most RATE's worth of the time left, and none
    starts past ``deadline``. Stops when a step frees nothing more (what is left is in use, or
    the kernel cannot drop it now; dirty pages get WRITEBACK_WAITS short waits for the flusher).
    v1 may finish a tiny clean remainder with force_empty (FINAL). The caller has forbidden swap
    (:func:`forbid_swap`).
    """
    before = read_int(os.path.join(path, USAGE[method]))
    if before is None:
        return Reclaim(None, None, method)
    limit = _limit(path) if method == V1 else None
    asked, left, skipped, waits = 0, before, "", 0
    swappiness = b" swappiness=0"
    try:
        while asked + PAGE <= cold:
            remaining = deadline - clock()
            size = min(STEP, cold - asked, int(min(remaining, STEP / RATE) * RATE)) // PAGE * PAGE
            if size <= 0:
                skipped = "deadline"
                break
            if method == V2:
                failed = write_control(os.path.join(path, "memory.reclaim"), str(size).encode() + swappiness)
                if failed == errno.EINVAL and swappiness:  # a kernel before 6.11: no swappiness= key
                    if not _v2_swap_off(path, meminfo):
                        skipped = SWAP
                        break
                    swappiness = b""
                    continue
            else:
                lowered = str(max(0, left - size)).encode()  # resize_max reclaims until usage fits
                failed = write_control(os.path.join(path, "memory.limit_in_bytes"), lowered)
            asked += size
            now = read_int(os.path.join(path, USAGE[method]))
            if now is None:
                break
            progress, left = left - now, now
            if failed not in (0, errno.EAGAIN, errno.EBUSY):
                skipped = f"{'memory.reclaim' if method == V2 else 'memory.limit_in_bytes'}: {_name(failed)}"
                break
            if failed or progress < PAGE:
                cache = cache_of(path, method)
                if cache is None or not cache.dirty or waits >= WRITEBACK_WAITS:
                    break  # the kernel freed what it could: nothing more comes back now
                if deadline - clock() <= WRITEBACK_PAUSE:
                    skipped = "deadline"
                    break
                waits += 1
                asked -= size  # that step freed (almost) nothing: ask again once the flusher has run
                sleep(WRITEBACK_PAUSE)
        if method == V1 and not skipped:
            left = _finish_v1(path, left, deadline, clock, sleep)
    finally:
        if limit is not None:
            write_control(os.path.join(path, "memory.limit_in_bytes"), limit)
    return Reclaim(before, left, method, skipped=skipped)


USAGE = {V1: "memory.usage_in_bytes", V2: "memory.current"}


def _finish_v1(
    path: str, left: int, deadline: float, clock: Callable[[], float], sleep: Callable[[float], None]
) -> int:
    """force_empty on a v1 remainder of at most FINAL (and BATCHED_PER_CPU per CPU), at most FINAL
    of it active, once it is clean (WRITEBACK_WAITS short waits at most, within the deadline); the
    usage after."""
    bound = FINAL + BATCHED_PER_CPU * (os.cpu_count() or 1)
    for _ in range(WRITEBACK_WAITS + 1):
        cache = cache_of(path, V1)
        if cache is None or not 0 < cache.file <= bound or cache.active > FINAL:
            return left
        if not cache.dirty:
            break
        if deadline - clock() <= WRITEBACK_PAUSE:
            return left
        sleep(WRITEBACK_PAUSE)
    else:
        return left
    if clock() >= deadline:
        return left
    write_control(os.path.join(path, "memory.force_empty"), b"0")
    after = read_int(os.path.join(path, USAGE[V1]))
    return left if after is None else after


def _limit(path: str) -> bytes | None:
    """A v1 memcg's ``memory.limit_in_bytes``, to be put back after the lowered steps."""
    try:
        with open(os.path.join(path, "memory.limit_in_bytes"), "rb") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _v2_swap_off(path: str, meminfo: str) -> bool:
    """No swap for a v2 memcg's reclaim without memory.reclaim's swappiness key: swap.max 0, or no swap."""
    if write_control(os.path.join(path, "memory.swap.max"), b"0") == 0:
        return True
    return swap_total(meminfo) == 0
