"""What the delete path writes under /run stays bounded, with or without the timers.

``/run`` is a tmpfs that also holds containerd's and runc's state: full, it
breaks every ``runc create`` on the node. The sweep and metrics timers prune
and rotate what runc-guard writes there, but a node whose timers are off (an
install that did not enable them, a failed unit) must not fill it either. So
each path that writes prunes after itself, and only when a cheap test says
there is something to prune: one ``stat`` of the directory, whose size grows
with its entries (tmpfs counts 20 bytes an entry, ext4 a block per ~80), so the
common delete pays one syscall and a crowded directory is listed rarely.

- the stats file (``deletes.jsonl``): rotated to ``.1`` by its writer at
  STATS_CAP_BYTES (``atomic.append_line``), four times metrics' own rotation
  size, so a running metrics always rotates first and never loses a line; only
  with metrics not running does ``.1`` get replaced;
- aside records: the sweep's own pruning rule (nothing they name is left), then
  the oldest beyond MAX_ASIDE_RECORDS (the cgroups a dropped record named stay
  visible to the sweep and audit, which scan the cgroup trees themselves);
- lock files of deletes that were SIGKILLed before they let go: removed once
  nobody holds them (the claim protocol tolerates it: a waiter that locks an
  unlinked file tries again).
Stdlib only.
"""

from __future__ import annotations

import fcntl
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

#: A directory larger than this (bytes of its own inode) is worth listing and pruning.
CROWDED_DIR_BYTES = 64 << 10
#: deletes.jsonl is rotated by the writer past this: metrics rotates at 1 MiB (ROTATE_BYTES).
STATS_CAP_BYTES = 4 << 20
#: Aside records kept at most, newest first (a few hundred bytes each).
MAX_ASIDE_RECORDS = 2000
#: A lock file nobody holds is stale once this old (a live delete holds its own).
STALE_LOCK_AGE = 60.0


def crowded(directory: str, limit: int = CROWDED_DIR_BYTES) -> bool:
    """Is ``directory`` large enough to be worth pruning? (one stat; False when unreadable)"""
    try:
        return os.stat(directory).st_size > limit
    except OSError:
        return False


def drop_oldest(directory: str, keep: int, suffix: str) -> int:
    """Unlink the oldest ``*suffix`` files of ``directory`` (by mtime) beyond ``keep``; the count."""
    aged = []
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.endswith(suffix) and not entry.name.startswith("."):
                    try:
                        aged.append((entry.stat(follow_symlinks=False).st_mtime, entry.path))
                    except OSError:
                        continue
    except OSError:
        return 0
    aged.sort(reverse=True)
    return unlink_all(path for _mtime, path in aged[keep:])


def unlink_all(paths: Iterable[str]) -> int:
    """Unlink each of ``paths`` that still exists; how many went (a vanished one is not an error)."""
    dropped = 0
    for path in paths:
        try:
            os.unlink(path)
            dropped += 1
        except OSError:
            pass
    return dropped


def prune_stale_locks(lock_dir: str, older_than: float = STALE_LOCK_AGE, now: float | None = None) -> int:
    """Unlink lock files nobody holds and that are older than ``older_than`` s; the count.

    A lock is unlinked only while we hold its flock and it is still the file at its
    name (same inode), exactly as its own holder would at the end of a delete.
    """
    now = time.time() if now is None else now
    try:
        names = [n for n in os.listdir(lock_dir) if n.endswith(".lock")]
    except OSError:
        return 0
    removed = 0
    for name in names:
        path = os.path.join(lock_dir, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if now - st.st_mtime < older_than:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.stat(path).st_ino == st.st_ino:
                os.unlink(path)
                removed += 1
        except OSError:
            continue  # held by a live delete, or gone meanwhile
        finally:
            os.close(fd)
    return removed
