"""Does this kernel free a removed memory cgroup's page cache by itself? Asked by behaviour, once per boot.

Linux 7.x reparents a dead memcg's LRU folios to its parent when it goes offline
(the "reparent LRU folios" series): removed charged, the memcg is freed at once
and its pages stay cached, charged to the parent. There a reclaim before the
rmdir (delete.reclaim) frees nothing that would not be freed anyway and only
evicts. Every LTS kernel nodes run today (5.15, 6.1, 6.6, 6.12; this host's
6.18) still pins the memcg until its pages go. A version number cannot say which
(distributions backport, and the series may change before it lands), so the
kernel is asked: a probe memcg is charged with page cache that outlives it (a
file it read), then removed, and what its parent shows afterwards says which
kernel this is.

- v2: the parent's ``cgroup.stat`` ``nr_dying_descendants`` 0 with the pages
  still charged to it (``memory.current``): reparented; 1 after WAIT s: pinned.
- v1: the parent's own ``cache`` (memory.stat, not ``total_cache``) holds the
  pages once they are reparented; a pinned memcg keeps them in its own, so the
  parent's own stays ~0 while its ``total_cache`` counts them.

Anything else (no memory controller, not root, the pages gone meanwhile: a
node's proactive reclaim can take them) is unknown, and unknown is what the
delete already takes as "reclaim, as before" (delete.reclaim explains why). The
probe costs a mkdir, a child process reading PROBE_BYTES of a file, an rmdir and
up to WAIT s of polling: it runs in the detached finisher's start (once per boot:
the answer is cached in the cache directory, in /run) and in ``doctor``, never on
a delete.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping

from runc_guard.atomic import write_atomic
from runc_guard.delete.reclaim import PROBE_FILE, kernel_reparents
from runc_guard.procinfo import pid_exists

#: What the probe memcg is charged with (a file read from inside it: clean page cache, see _charge).
PROBE_BYTES = 1 << 20
#: How long the parent is watched after the rmdir: the kernel offlines a memcg from a workqueue.
WAIT = 2.0
#: Where the probe's file is written: page cache of a disk filesystem (/run and /dev/shm are tmpfs,
#: whose pages are shmem and tell nothing about file LRU pages).
SCRATCH = "/var/tmp"
#: A probe's own names: its cgroup below the memory root, its scratch directory (both carry its pid).
_STALE_CGROUP = re.compile(r"runc-guard-probe\.([0-9]+)")
_STALE_SCRATCH = re.compile(r"\.runc-guard-probe\.([0-9]+)\..+")


def _stat(path: str) -> dict[str, int]:
    with open(os.path.join(path, "memory.stat")) as f:
        return {k: int(v) for k, v in (line.split()[:2] for line in f if len(line.split()) >= 2)}


def _read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().split()[0])


def _nr_dying(parent: str) -> int:
    with open(os.path.join(parent, "cgroup.stat")) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("nr_dying_descendants "))


def decide_v1(own_cache: int, total_cache: int, charged: int) -> bool | None:
    """v1: the probe's pages moved into the parent's own cache (True), stayed in the dead child's
    (False: counted in the parent's total only), or neither can be told (None: they went)."""
    if own_cache >= charged * 0.9:
        return True
    if total_cache - own_cache >= charged * 0.9:
        return False
    return None


def decide_v2(nr_dying: int, current: int, charged: int) -> bool | None:
    """v2: no dying child and the pages still charged to the parent: reparented (True); a dying
    child: pinned (False); no dying child and the pages gone too: cannot tell (None)."""
    if nr_dying:
        return False
    return True if current >= charged * 0.9 else None


def _charge(memcg: str, directory: str) -> None:
    """A forked child joins ``memcg``, reads PROBE_BYTES of a file in ``directory``, exits: the pages
    are charged to the probe memcg, which is empty again once the child is reaped.

    Read, not written: a memcg that wrote a file is also held by the inode's writeback association
    (cgroup writeback), which reparenting the pages does not end. Measured in a Debian sid guest,
    kernel 7.2.13: a memcg that read 1 MiB was freed at its rmdir (its pages in the parent's
    ``memory.current``), one that wrote 1 MiB stayed dying for 60 s, reclaimed first or not. A probe
    that writes would call that kernel a pinning one.
    """
    path = os.path.join(directory, "probe")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        chunk = os.urandom(64 << 10)
        for _ in range(PROBE_BYTES // len(chunk)):
            os.write(fd, chunk)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # clean: dropped, so the child's read charges it
    finally:
        os.close(fd)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            with open(os.path.join(memcg, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            with open(path, "rb") as f:
                while f.read(64 << 10):
                    pass
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise OSError(f"the probe's child could not charge {memcg}")


def probe(
    mounts: Mapping[str, str], clock: Callable[[], float] = time.monotonic, scratch: str = SCRATCH
) -> tuple[bool | None, str]:
    """(reparents?, how it was told) for this kernel; None: cannot tell (see the module's rules)."""
    v1 = next((m for m, t in sorted(mounts.items()) if t == "cgroup"
               and os.path.exists(os.path.join(m, "memory.force_empty"))), None)  # fmt: skip
    v2 = next((m for m, t in sorted(mounts.items()) if t == "cgroup2" and _has_memory(m)), None)
    root = v1 or v2
    if root is None:
        return None, "no memory controller mounted"
    _remove_stale(root, scratch)
    parent = os.path.join(root, f"runc-guard-probe.{os.getpid()}")
    child = os.path.join(parent, "probe")
    try:
        directory = tempfile.mkdtemp(prefix=f".runc-guard-probe.{os.getpid()}.", dir=scratch)
    except OSError as exc:
        return None, f"no scratch directory: {exc.strerror}"
    try:
        os.mkdir(parent)
        if v1 is None:
            with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
                f.write("+memory")
        os.mkdir(child)
        _charge(child, directory)
        charged = _stat(child)["cache" if v1 else "file"]
        if charged < PROBE_BYTES * 0.9:
            return None, f"the probe memcg was charged {charged >> 10} KiB only"
        os.rmdir(child)
        until = clock() + WAIT
        while True:
            if v1:
                stat = _stat(parent)
                answer = decide_v1(stat["cache"], stat["total_cache"], charged)
                # a pinned memcg looks the same the whole time: only a move to the parent ends it early
                final = answer is True or clock() >= until
            else:
                current = _read_int(os.path.join(parent, "memory.current"))
                answer = decide_v2(_nr_dying(parent), current, charged)
                final = answer is not False or clock() >= until
            if final:
                break
            time.sleep(0.05)
        how = f"a probe memcg under {root}, {charged >> 10} KiB of page cache, removed"
        if answer is None:
            return None, how + ": its pages went meanwhile (proactive reclaim?), cannot tell"
        return answer, how + (": its pages moved to the parent" if answer else ": it stayed dying with them")
    except (OSError, KeyError, ValueError, StopIteration) as exc:
        return None, f"probe failed: {exc}"
    finally:
        # the file's pages go with it, and with them a pinned probe memcg (then its parent can go)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, "probe"))
        with contextlib.suppress(OSError):
            os.rmdir(directory)
        for path in (child, parent):
            with contextlib.suppress(OSError):
                os.rmdir(path)


def _remove_stale(root: str, scratch: str) -> None:
    """What a probe killed midway (a finisher SIGKILLed at its start) left: its cgroups and scratch
    directory, named by its pid. Only those of a pid no longer alive, and only by rmdir/unlink of our
    own names: a cgroup with anything in it stays (rmdir refuses), as does a live prober's."""
    for path in _stale(scratch, _STALE_SCRATCH):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(path, "probe"))  # the probe's file
        with contextlib.suppress(OSError):
            os.rmdir(path)
    for path in _stale(root, _STALE_CGROUP):
        for cgroup in (os.path.join(path, "probe"), path):  # leaf first
            with contextlib.suppress(OSError):
                os.rmdir(cgroup)


def _stale(base: str, pattern: re.Pattern[str]) -> list[str]:
    """Entries of ``base`` named by ``pattern`` whose pid (group 1) is not alive."""
    try:
        names = os.listdir(base)
    except OSError:
        return []
    return [os.path.join(base, n) for n in names
            if (m := pattern.fullmatch(n)) is not None and not pid_exists(int(m.group(1)))]  # fmt: skip


def _has_memory(mount: str) -> bool:
    try:
        with open(os.path.join(mount, "cgroup.controllers")) as f:
            return "memory" in f.read().split()
    except OSError:
        return False


def write_answer(cache_dir: str, answer: bool) -> None:
    """Cache ``answer`` for this kernel (delete.reclaim.kernel_reparents reads it)."""
    data = f"{int(answer)} {os.uname().release}\n".encode()
    write_atomic(os.path.join(cache_dir, PROBE_FILE), data, 0o644, durable=False, dir_mode=0o700)


def ensure_probed(cache_dir: str, mounts: Mapping[str, str], fresh: bool = False) -> tuple[bool | None, str]:
    """(the answer for this kernel, how it was told): the cached one, or a probe's when there is none
    or ``fresh`` (doctor); a probe's definite answer is cached (the finisher's start, doctor)."""
    cached = None if fresh else kernel_reparents(os.path.join(cache_dir, PROBE_FILE))
    if cached is not None:
        return cached, f"cached in {os.path.join(cache_dir, PROBE_FILE)}"
    answer, how = probe(mounts)
    if answer is not None:
        with contextlib.suppress(OSError):
            write_answer(cache_dir, answer)
    return answer, how


def describe(answer: bool | None) -> str:
    """What runc-guard does on a kernel that gives ``answer`` (doctor's line)."""
    if answer is True:
        return ("reparents a removed memory cgroup's page cache itself: removed, it is freed; "
                "runc-guard reclaims nothing before the rmdir (it would only evict)")
    if answer is False:
        return ("keeps a removed memory cgroup dying while page cache is charged to it: runc-guard "
                "reclaims its cold page cache (never by swap, never what is in use) before the rmdir")
    return ("cannot tell whether a removed memory cgroup's page cache is reparented: runc-guard "
            "reclaims as on a kernel that keeps it dying (every LTS kernel does)")
