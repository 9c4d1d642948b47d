"""A fake cgroup filesystem and clock: unit tests decide what the 'kernel' does."""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterable

from runc_guard.delete.cgroupfs import CGROUP_SUPER_MAGIC
from runc_guard.delete.reclaim import DIRTY, Reclaim


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeCgroupFs:
    """Directories with pids; pids die when the test says so; rmdir follows cgroup rules.

    rmdir fails with EBUSY while a directory has live pids or children, like the
    kernel. ``on_wait`` runs each time the code under test sleeps, so a test can
    make processes exit "later"; every sleep advances the fake clock.
    """

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.dirs: dict[str, list[int]] = {}
        self.alive: set[int] = set()
        self.symlinks: set[str] = set()
        self.magic: dict[str, int] = {}
        self.rmdir_errors: dict[str, int] = {}
        self.killed: list[int] = []
        self.rmdirs: list[str] = []
        self.waits: list[tuple[tuple[str, ...], float, float]] = []
        self.on_wait: Callable[[FakeCgroupFs], None] | None = None
        self.dies_on_kill = True
        #: Live pids that are on their way out (SIGKILL pending, exiting).
        self.dying: set[int] = set()
        #: Directory mtimes; a directory added without one is as new as the clock.
        self.mtimes: dict[str, float] = {}
        #: Directories whose v1 cpuset sched_load_balance was cleared, in order.
        self.load_balance_stopped: list[str] = []
        #: Bytes charged to a memory cgroup (a path absent here has no memory controller).
        self.charged: dict[str, int] = {}
        #: Memory cgroups the kernel cannot reclaim (why: the value), and each reclaim as (path, deadline).
        self.unreclaimable: dict[str, str] = {}
        #: memcgs with dirty pages: left for a hold when the caller can hold them (delete.reclaim)
        self.dirty: set[str] = set()
        self.reclaims: list[tuple[str, float]] = []
        #: v1 freezers: path -> frozen (a path absent here has no freezer); each thaw, in order.
        self.freezers: dict[str, bool] = {}
        self.thawed: list[str] = []

    def add(self, path: str, pids: Iterable[int] = (), mtime: float | None = None) -> None:
        self.dirs[path] = list(pids)
        self.alive.update(p for p in self.dirs[path] if p > 0)
        if mtime is not None:
            self.mtimes[path] = mtime

    def modified_at(self, path: str) -> float | None:
        return self.mtimes.get(path, self.clock.now) if path in self.dirs else None

    def pid_dying(self, pid: int) -> bool:
        return pid in self.dying or pid not in self.alive

    def fs_magic(self, path: str) -> int:
        for prefix, magic in sorted(self.magic.items(), key=lambda kv: -len(kv[0])):
            if path == prefix or path.startswith(prefix + "/"):
                return magic
        return CGROUP_SUPER_MAGIC

    def is_symlink(self, path: str) -> bool:
        return path in self.symlinks

    def exists(self, path: str) -> bool:
        return path in self.dirs or any(d.startswith(path + "/") for d in self.dirs) or path in self.symlinks

    def children(self, path: str) -> list[str]:
        prefix = path + "/"
        return [d for d in self.dirs if d.startswith(prefix) and "/" not in d[len(prefix) :]]

    def read_procs(self, path: str) -> list[int]:
        return list(self.dirs.get(path, []))

    def pid_alive(self, pid: int) -> bool:
        return pid in self.alive

    def kill_if_member(self, pid: int, path: str) -> bool:
        if pid not in self.dirs.get(path, []) or pid not in self.alive:
            return False
        self.killed.append(pid)
        if self.dies_on_kill:
            self.exit(pid)
        return True

    def exit(self, pid: int) -> None:
        self.alive.discard(pid)
        for pids in self.dirs.values():
            if pid in pids:
                pids.remove(pid)

    def rmdir(self, path: str) -> None:
        if path in self.rmdir_errors:
            code = self.rmdir_errors[path]
            raise OSError(code, errno.errorcode.get(code, "?"), path)
        if path not in self.dirs:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        if self.children(path) or any(p in self.alive for p in self.dirs[path]):
            raise OSError(errno.EBUSY, "Device or resource busy", path)
        del self.dirs[path]
        self.rmdirs.append(path)

    def stop_load_balance(self, path: str) -> None:
        if path not in self.dirs:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        self.load_balance_stopped.append(path)

    def reclaim_memory(self, path: str, deadline: float, hold_dirty: bool = False) -> Reclaim:
        if path not in self.charged or path not in self.dirs:
            return Reclaim(None, None)
        self.reclaims.append((path, deadline))
        before = self.charged[path]
        if hold_dirty and path in self.dirty:
            return Reclaim(before, before, "force_empty", skipped=DIRTY)
        if path in self.unreclaimable:
            return Reclaim(before, before, "reclaim", skipped=self.unreclaimable[path])
        self.charged[path] = 0
        return Reclaim(before, 0, "reclaim")

    def frozen(self, path: str) -> bool | None:
        return self.freezers.get(path) if path in self.dirs else None

    def thaw(self, path: str) -> bool:
        if path not in self.dirs or path not in self.freezers:
            return False
        self.freezers[path] = False
        self.thawed.append(path)
        return True

    def wait_for_change(self, paths: Iterable[str], timeout: float, event_timeout: float) -> None:
        self.waits.append((tuple(paths), timeout, event_timeout))
        self.clock.now += timeout
        if self.on_wait is not None:
            self.on_wait(self)
