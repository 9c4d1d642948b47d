"""The thin seam between runc-guard and the kernel's cgroup filesystems.

Everything that reads ``cgroup.procs``, removes a directory or sends a signal
goes through :class:`CgroupFs`, so the deciding code can be unit-tested against
a fake and proven against the real kernel in the kernel tests. Nothing here
decides *whether* to act; callers do that.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's enums cost ~1 ms of every start
import errno
import os
import select
import time

from runc_guard.libc import statfs_type
from runc_guard.procinfo import pid_exists, unescape_mountinfo

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Protocol

    from runc_guard.delete.reclaim import Reclaim
else:  # a plain base at run time: typing costs ~2.5 ms of every delete's start-up
    Protocol = object

#: Kernel features this process found missing and worked around (``pidfd_open``
#: before Linux 5.3, or filtered by seccomp); the delete's canonical entry lists them.
FALLBACKS: set[str] = set()

#: statfs(2) f_type of cgroup v1 and cgroup2 filesystems (linux/magic.h).
CGROUP_SUPER_MAGIC = 0x27E0EB
CGROUP2_SUPER_MAGIC = 0x63677270
CGROUP_MAGICS = frozenset({CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC})


class CgroupFsOps(Protocol):
    """What the cleanup and the sweep need from the kernel."""

    def fs_magic(self, path: str) -> int: ...
    def is_symlink(self, path: str) -> bool: ...
    def exists(self, path: str) -> bool: ...
    def children(self, path: str) -> list[str]: ...
    def read_procs(self, path: str) -> list[int]: ...
    def pid_alive(self, pid: int) -> bool: ...
    def pid_dying(self, pid: int) -> bool: ...
    def kill_if_member(self, pid: int, path: str) -> bool: ...
    def rmdir(self, path: str) -> None: ...
    def wait_for_change(self, paths: Iterable[str], timeout: float, event_timeout: float) -> None: ...
    def modified_at(self, path: str) -> float | None: ...
    def stop_load_balance(self, path: str) -> None: ...
    def reclaim_memory(self, path: str, deadline: float, hold_dirty: bool = False) -> Reclaim: ...
    def frozen(self, path: str) -> bool | None: ...
    def thaw(self, path: str) -> bool: ...


class RealCgroupFs:
    """The real kernel. Every method is one or two syscalls and documents its errors.

    ``memcg_probe``: node.memcg_probe's cached answer (delete.reclaim.PROBE_FILE in the cache
    directory), read only by a reclaim that finds page cache charged.
    """

    def __init__(self, memcg_probe: str | None = None) -> None:
        self.memcg_probe = memcg_probe

    def fs_magic(self, path: str) -> int:
        return statfs_type(path)

    def is_symlink(self, path: str) -> bool:
        return os.path.islink(path)

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def children(self, path: str) -> list[str]:
        """Child cgroup directories; [] when ``path`` is gone.

        Never follows a symlink and never crosses a mount point: a directory on
        another device (something mounted inside the cgroup tree) is not a child
        cgroup, and nothing below it is ours to signal or remove.
        """
        try:
            device = os.lstat(path).st_dev
            with os.scandir(path) as it:
                return [
                    e.path
                    for e in it
                    if e.is_dir(follow_symlinks=False) and e.stat(follow_symlinks=False).st_dev == device
                ]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def read_procs(self, path: str) -> list[int]:
        """Pids in ``path/cgroup.procs``; [] when the cgroup is gone (ENOENT/ENODEV)."""
        try:
            with open(os.path.join(path, "cgroup.procs"), "rb") as f:
                data = f.read()
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENODEV):
                return []
            raise
        return [int(x) for x in data.split()]

    def pid_alive(self, pid: int) -> bool:
        """kill(pid, 0), as procinfo.pid_exists asks it (pid <= 0 is never alive)."""
        return pid_exists(pid)

    def pid_dying(self, pid: int) -> bool:
        """Exiting, a zombie, gone, or with SIGKILL pending (see procinfo.dying)."""
        from runc_guard.procinfo import dying

        return dying(pid)

    def kill_if_member(self, pid: int, path: str) -> bool:
        """SIGKILL ``pid`` only if it provably is in cgroup ``path``; True if signalled.

        The pidfd pins one process. Membership is re-read *after* opening it, and a
        successful ``pidfd_send_signal(fd, 0)`` afterwards shows that process was
        still alive, so the pid we found in ``cgroup.procs`` was that process and
        not a recycled number. Only then does SIGKILL go through the same pidfd.
        pid <= 0 is never a process (0 is one outside our PID namespace).
        """
        if pid <= 0:
            return False
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        except OSError as exc:  # ENOSYS before Linux 5.3; EPERM/ENOSYS from a seccomp filter
            FALLBACKS.add(f"pidfd_open:{errno.errorcode.get(exc.errno or 0, exc.errno)}")
            return self._kill_by_pid(pid, path)
        try:
            if pid not in self.read_procs(path):
                return False
            _signal.pidfd_send_signal(fd, 0)
            _signal.pidfd_send_signal(fd, _signal.SIGKILL)
            return True
        except ProcessLookupError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM):
                raise
            FALLBACKS.add(f"pidfd_send_signal:{errno.errorcode.get(exc.errno or 0, exc.errno)}")
            return self._kill_by_pid(pid, path)
        finally:
            os.close(fd)

    def _kill_by_pid(self, pid: int, path: str) -> bool:
        """Without pidfds: SIGKILL by pid, as runc's signalAllProcesses does, after a start-time check.

        The start time read before and after the membership check must match: a pid
        that exited and was reused in between is another process and is left alone.
        What remains is the window between the second read and kill(2), the same
        one runc (which checks nothing) always has.
        """
        from runc_guard.procinfo import start_time

        before = start_time(pid)
        if before is None or pid not in self.read_procs(path) or start_time(pid) != before:
            return False
        try:
            os.kill(pid, _signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def reclaim_memory(self, path: str, deadline: float, hold_dirty: bool = False) -> Reclaim:
        """Reclaim the pages charged to the empty memory cgroup ``path`` (delete.reclaim), by ``deadline``."""
        from runc_guard.delete.reclaim import reclaim

        return reclaim(path, deadline, hold_dirty=hold_dirty, probe=self.memcg_probe)

    def stop_load_balance(self, path: str) -> None:
        """Write 0 to a cgroup v1 cpuset's ``cpuset.sched_load_balance``, before its rmdir.

        The kernel's offline of a v1 cpuset (cpuset_css_offline, under the global
        cgroup_mutex) clears this flag itself, through cpuset_update_flag ->
        validate_change, which compares the cpuset with every sibling: O(siblings)
        with cgroup_mutex held, ~0.5 ms next to 8000 leaked siblings on a 2-core VM.
        Written here, the same walk runs under cpuset_mutex only (the write path
        takes no cgroup_mutex) and the offline finds the flag clear. A leaf cpuset's
        flag does not change scheduling while its parent balances. Errors are the
        caller's to ignore: the rmdir works either way.
        """
        fd = os.open(os.path.join(path, "cpuset.sched_load_balance"), os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)

    def frozen(self, path: str) -> bool | None:
        """Does the v1 freezer at ``path`` say FROZEN or FREEZING? None: no v1 freezer there, or gone."""
        try:
            with open(os.path.join(path, "freezer.state"), "rb") as f:
                return f.read().strip() in (b"FROZEN", b"FREEZING")
        except OSError:
            return None

    def thaw(self, path: str) -> bool:
        """Write THAWED to the v1 freezer at ``path``; False when there is none (or it is gone)."""
        try:
            with open(os.path.join(path, "freezer.state"), "wb") as f:
                f.write(b"THAWED")
        except OSError:
            return False
        return True

    def modified_at(self, path: str) -> float | None:
        """mtime of a cgroup directory (its age for the sweep); None when it is gone.

        kernfs stamps a directory when it is created and does not touch it when
        children come and go, so this is its creation time. Sharp edge: if the
        kernel evicts and re-instantiates the inode the stamp becomes "now",
        which only makes the directory look younger (the sweep keeps it longer).
        """
        try:
            return os.lstat(path).st_mtime
        except (FileNotFoundError, NotADirectoryError):
            return None

    def wait_for_change(self, paths: Iterable[str], timeout: float, event_timeout: float) -> None:
        """Sleep until a cgroup2 ``cgroup.events`` of ``paths`` changes, else ``timeout``.

        kernfs signals POLLPRI on ``cgroup.events`` when ``populated`` flips, so on
        cgroup v2 (and the hybrid ``unified`` tree, which holds every process of
        the container too) the last exit wakes us at once and we can afford to
        sleep up to ``event_timeout`` otherwise. cgroup v1 has no such file, so
        there this is a plain sleep of one poll interval (``timeout``).
        ``paths`` must be cgroups found populated: one already empty returns at once.
        """
        poller = select.poll()
        fds: list[int] = []
        try:
            for path in paths:
                try:
                    fd = os.open(os.path.join(path, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    continue
                fds.append(fd)
                if b"populated 0" in os.pread(fd, 4096, 0):
                    return  # already empty: nothing to wait for
                poller.register(fd, select.POLLPRI | select.POLLERR)
            if not fds:
                time.sleep(timeout)
                return
            poller.poll(max(0, int(event_timeout * 1000)))
        finally:
            for fd in fds:
                os.close(fd)


def cgroup_mounts(mountinfo: str = "/proc/self/mountinfo") -> dict[str, str]:
    """Mount points of cgroup filesystems -> fs type (``cgroup`` or ``cgroup2``)."""
    mounts: dict[str, str] = {}
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype = right.split(" ", 1)[0]
            if fstype in ("cgroup", "cgroup2"):
                mount_point = left.split(" ")[4]
                mounts[unescape_mountinfo(mount_point)] = fstype
    return mounts
