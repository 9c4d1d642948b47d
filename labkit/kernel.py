"""Real-kernel lab: busybox bundles, runc containers, freezer holds, cgroup inventories.

Shared by the kernel tests (tests/kernel), the containerd suite (integration/)
and ``make demo``. Everything here creates uniquely named objects and knows how
to remove them again, processes included, by the pid it started.

The slow-death trick (docs/background.md, the labs): processes moved into a cgroup v1 freezer
that is FROZEN keep a pending SIGKILL until it is THAWED, so they stay in the
container's other cgroups exactly as long as the test chooses.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from runc_guard.delete.cgroupfs import cgroup_mounts

CGROUP_ROOT = "/sys/fs/cgroup"
FREEZER = "/sys/fs/cgroup/freezer"
BUSYBOX = shutil.which("busybox") or "/bin/busybox"
RUNC = shutil.which("runc") or "/usr/sbin/runc"


def unique(prefix: str = "rgtest") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def cgroup_mount_points() -> list[str]:
    """Every mounted cgroup hierarchy (v1 and v2) in this mount namespace, sorted."""
    return sorted(cgroup_mounts())


def is_pure_v2() -> bool:
    return cgroup_mount_points() == [CGROUP_ROOT]


def dirs_named(relative: str) -> list[str]:
    """Existing directories ``<mount>/<relative>`` (and below) across every hierarchy."""
    found = []
    for mount in cgroup_mount_points():
        top = os.path.join(mount, relative.strip("/"))
        if os.path.isdir(top):
            for dirpath, _dirs, _files in os.walk(top):
                found.append(dirpath)
    return sorted(found)


def remove_tree(path: str) -> None:
    """rmdir a cgroup subtree leaf-first; tolerate what is already gone."""
    if not os.path.isdir(path):
        return
    for dirpath, _dirs, _files in sorted(os.walk(path), key=lambda t: -t[0].count("/")):
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(dirpath)


def procs(path: str) -> list[int]:
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def shim_of(init: int, task_id: str) -> int:
    """A task's shim: its init's parent (the shim is the subreaper), proven by its ``-id``."""
    with open(f"/proc/{init}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    with open(f"/proc/{ppid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    if b"-id" not in argv or argv[argv.index(b"-id") + 1].decode() != task_id:
        raise LookupError(f"parent {ppid} of init {init} is not the shim of {task_id}")
    return ppid


def read_lines(path: str) -> list[str]:
    """Lines of a text file; [] when it does not exist."""
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def read_jsonl(path: str) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in read_lines(path) if line.strip()]


def spool_reporters(spool: str) -> list[int]:
    """Pids with the spool's lock file open: the reporter (the delete that started it took the lock
    for it, so /proc/locks names that delete's pid, not the reporter's)."""
    lock = os.path.join(spool, ".reporter.lock")
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        if lock in links:
            found.append(pid)
    return found


def flock_holder(path: str) -> int:
    """The pid that took a flock on ``path`` (/proc/locks, without taking it); 0 if none."""
    try:
        ino = os.stat(path).st_ino
    except FileNotFoundError:
        return 0
    with open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            if fields[1] == "FLOCK" and fields[5].endswith(f":{ino}"):
                return int(fields[4])
    return 0


def spool_lock_holder(spool: str) -> int:
    """The pid that took the spool's reporter flock; 0 if none."""
    return flock_holder(os.path.join(spool, ".reporter.lock"))


def wait_reported(cache_dir: str, timeout: float = 10.0) -> bool:
    """Until runc-guard's detached helpers are done: the finisher, then the reporter.

    A delete cut short by its deadline may start a finisher (its entries come
    later); a delete spools its entries before it exits, and the reporter it
    forks sends them (journald or the JSON-lines file) and lets go of the
    spool's lock. Only looked at: taking a lock here would make a new helper
    leave its work to us.
    """
    from runc_guard.delete.report import FINISHER_LOCK
    from runc_guard.spool import pending_files, spool_dir

    finisher = os.path.join(cache_dir, FINISHER_LOCK)
    finished = wait_for(lambda: not flock_holder(finisher), timeout, 0.02)
    spool = spool_dir(cache_dir)
    sent = wait_for(lambda: not pending_files(spool) and not spool_lock_holder(spool), timeout, 0.01)
    return finished and sent


def reported_events(workdir: str, cache: str = "cache", log: str = "events.jsonl") -> list[dict]:  # type: ignore[type-arg]
    """runc-guard's entries in ``workdir`` (guard_env's layout), once its reporter is done."""
    wait_reported(os.path.join(workdir, cache))
    return read_jsonl(os.path.join(workdir, log))


#: poll, ppoll, select, pselect6, epoll_wait, nanosleep, clock_nanosleep (x86_64)
WAITING_SYSCALLS = {"7", "271", "23", "270", "232", "35", "230"}


def children(pid: int) -> list[int]:
    """The children of ``pid``'s main thread ([] once it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def guard_is_waiting(pid: int) -> bool:
    """runc-guard's runtime child is gone and it sits in poll/sleep (its wait loop)."""
    if children(pid):
        return False
    try:
        with open(f"/proc/{pid}/syscall") as f:
            return f.read().split(" ", 1)[0] in WAITING_SYSCALLS
    except OSError:
        return False


def exited(pid: int) -> bool:
    """``pid`` has exited: gone from /proc, or a zombie its parent has not reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


@dataclass
class FreezerHold:
    """A frozen v1 freezer cgroup that keeps SIGKILLed processes from dying."""

    path: str
    pids: list[int] = field(default_factory=list)

    @classmethod
    def create(cls, freezer_root: str = FREEZER) -> FreezerHold:
        path = os.path.join(freezer_root, unique("rgtest-hold"))
        os.mkdir(path)
        return cls(path)

    def hold(self, pids: list[int]) -> None:
        for pid in pids:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
                f.write(str(pid))
            self.pids.append(pid)
        # Write FROZEN until it reads FROZEN: the kernel freezes a sleeping task in place,
        # but a task that was running or runnable at the write is only woken (a fake
        # signal), and one in the cgroup2 freezer's trap goes straight back to sleep there
        # unfrozen (freeze_v2_first); each write tries the tasks not yet frozen again.
        def frozen() -> bool:
            self._state("FROZEN")
            return self._read_state() == "FROZEN"

        if not wait_for(frozen, 5):
            raise RuntimeError(f"{self.path} did not freeze: {self._read_state()}")

    def release(self) -> None:
        self._state("THAWED")

    def _state(self, value: str) -> None:
        with open(os.path.join(self.path, "freezer.state"), "w") as f:
            f.write(value)

    def _read_state(self) -> str:
        with open(os.path.join(self.path, "freezer.state")) as f:
            return f.read().strip()

    def destroy(self) -> None:
        """Thaw, SIGKILL what we held (by pid, only if still in the hold), then rmdir."""
        if not os.path.isdir(self.path):
            return
        with contextlib.suppress(OSError):
            self.release()
        for pid in procs(self.path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not procs(self.path), 10)
        with contextlib.suppress(OSError):
            os.rmdir(self.path)


def make_bundle(
    directory: str, cgroups_path: str, script: str, host_pid: bool = True,
    annotations: dict[str, str] | None = None,
) -> str:
    """An OCI bundle whose rootfs is a static busybox; returns the bundle dir.

    ``annotations`` land in runc's state as labels (a CRI pod's sandbox id and container type).
    """
    rootfs = os.path.join(directory, "rootfs")
    os.makedirs(os.path.join(rootfs, "bin"), exist_ok=True)
    shutil.copy2(BUSYBOX, os.path.join(rootfs, "bin", "busybox"))
    for applet in ("sh", "sleep", "cat"):
        with contextlib.suppress(FileExistsError):
            os.symlink("busybox", os.path.join(rootfs, "bin", applet))
    for d in ("proc", "dev", "sys", "tmp"):
        os.makedirs(os.path.join(rootfs, d), exist_ok=True)
    subprocess.run([RUNC, "spec"], cwd=directory, check=True)
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    config["process"]["terminal"] = False
    config["process"]["args"] = ["sh", "-c", script]
    config["root"]["readonly"] = False
    if host_pid:
        config["linux"]["namespaces"] = [ns for ns in config["linux"]["namespaces"] if ns["type"] != "pid"]
    config["linux"]["cgroupsPath"] = cgroups_path
    if annotations:
        config["annotations"] = dict(annotations)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    return directory


#: Init forks ``n`` sleepers and waits: a host-PID container with several children.
def sleepers_script(n: int) -> str:
    return " ".join(["sleep 1000 &"] * n) + " wait"


@dataclass
class RuncContainer:
    """A detached runc container in its own state root; removable whatever happened."""

    id: str
    root: str
    bundle: str
    cgroup_relative: str
    runc: str = RUNC

    @classmethod
    def start(
        cls, workdir: str, children: int = 3, parent: str | None = None, runc: str = RUNC,
        cid: str | None = None, annotations: dict[str, str] | None = None, host_pid: bool = True,
    ) -> RuncContainer:
        """Run a container with ``runc`` (Debian's by default; state is that runc's); host PID unless told.

        ``cid``: a fixed id (a container re-created under the id of one gone before).
        """
        cid = cid or unique("rgtest-ctr")
        parent = parent or unique("rgtest")
        relative = f"/{parent}/{cid}"
        directory = os.path.join(workdir, cid)
        if os.path.exists(directory):  # the id's earlier container keeps its bundle
            directory = os.path.join(workdir, unique(cid))
        script = sleepers_script(children)
        bundle = make_bundle(directory, relative, script, host_pid, annotations=annotations)
        root = os.path.join(workdir, "runc-root")
        ctr = cls(cid, root, bundle, relative, runc)
        # stdio must not be a pipe: the detached container keeps it open forever.
        with open(os.path.join(workdir, f"{cid}.stderr"), "wb") as err:
            try:
                subprocess.run(
                    [runc, "--root", root, "run", "-d", cid],
                    cwd=bundle,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    check=True,
                    timeout=30,
                )
                if not wait_for(lambda: len(ctr.pids()) >= children + 1, 10):
                    raise RuntimeError(f"container {cid} did not start {children} children")
            except BaseException:
                ctr.destroy()
                raise
        return ctr

    def state(self) -> dict:  # type: ignore[type-arg]
        with open(os.path.join(self.root, self.id, "state.json")) as f:
            return json.load(f)  # type: ignore[no-any-return]

    def cgroup_dirs(self) -> list[str]:
        return dirs_named(self.cgroup_relative)

    def any_cgroup(self) -> str:
        """A hierarchy that holds every process of the container (memory or the v2 tree)."""
        for candidate in (f"{CGROUP_ROOT}/memory", f"{CGROUP_ROOT}/unified", CGROUP_ROOT):
            path = candidate + self.cgroup_relative
            if os.path.isdir(path):
                return path
        raise FileNotFoundError(self.cgroup_relative)

    def pids(self) -> list[int]:
        return procs(self.any_cgroup()) if self.cgroup_dirs() else []

    def init_pid(self) -> int:
        return int(self.state()["init_process_pid"])

    def children(self) -> list[int]:
        init = self.init_pid()
        return [p for p in self.pids() if p != init]

    def make_nested(self, name: str = "nested") -> list[str]:
        """A child cgroup inside the container's cgroup in every hierarchy."""
        made = []
        for d in self.cgroup_dirs():
            if d.endswith(self.cgroup_relative):
                os.mkdir(os.path.join(d, name))
                made.append(os.path.join(d, name))
        return made

    def destroy(self) -> None:
        """Whatever state the test left: kill every process in its cgroups, remove all."""
        for d in self.cgroup_dirs():
            for pid in procs(d):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        subprocess.run(
            [self.runc, "--root", self.root, "delete", "--force", self.id],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
            timeout=30,
        )
        wait_for(lambda: not any(procs(d) for d in self.cgroup_dirs()), 10)
        parent = self.cgroup_relative.rsplit("/", 1)[0]
        for mount in cgroup_mount_points():
            remove_tree(os.path.join(mount, self.cgroup_relative.strip("/")))
            if parent.strip("/"):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(mount, parent.strip("/")))


@dataclass
class Lifecycle:
    """One container's life and delete (volume_writer_lifecycle): the delete's status and wall time."""

    id: str
    status: int
    delete_s: float
    stderr: str


def volume_writer_lifecycle(
    workdir: str, parent: str, volume: str, delete: list[str], env: dict[str, str], mib: int = 1,
    synced: bool = False,
) -> Lifecycle:
    """A real runc host-PID container in ``/<parent>/<id>`` that writes ``mib`` MiB into ``volume``
    (bind-mounted at /volume: a log in a volume that outlives it), dies (init SIGKILLed: the
    dead-shim path), and is deleted by ``delete`` (a runtime's argv) with ``delete --force``.
    ``synced``: the file is fsync'd, so its pages are clean when the delete comes.
    Whatever happened, no process of it is left and its state is gone."""
    cid = unique("rgtest-memcg")
    directory = os.path.join(workdir, cid)
    fsync = " conv=fsync" if synced else ""
    script = f"dd if=/dev/zero of=/volume/{cid}.log bs=1M count={mib}{fsync} 2>/dev/null; exec sleep 1000"
    bundle = make_bundle(directory, f"/{parent}/{cid}", script)
    os.symlink("busybox", os.path.join(bundle, "rootfs", "bin", "dd"))
    os.makedirs(os.path.join(bundle, "rootfs", "volume"))
    with open(os.path.join(bundle, "config.json")) as f:
        config = json.load(f)
    config["mounts"].append({"destination": "/volume", "type": "bind", "source": volume,
                             "options": ["rbind", "rw"]})  # fmt: skip
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump(config, f)
    root = os.path.join(workdir, "runc-root")
    relative = f"/{parent}/{cid}"
    try:
        quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        subprocess.run([RUNC, "--root", root, "run", "-d", cid], cwd=bundle, check=True, timeout=30, **quiet)
        log = os.path.join(volume, f"{cid}.log")
        if not wait_for(lambda: os.path.exists(log) and os.path.getsize(log) == mib << 20, 60):
            raise RuntimeError(f"{cid} did not write {mib} MiB")
        with open(os.path.join(root, cid, "state.json")) as f:
            init = int(json.load(f)["init_process_pid"])
        os.kill(init, signal.SIGKILL)
        wait_for(lambda: not any(procs(d) for d in dirs_named(relative)), 10)
        started = time.monotonic()
        done = subprocess.run([*delete, "--root", root, "delete", "--force", cid], capture_output=True,
                              text=True, env=env, check=False, timeout=60)  # fmt: skip
        return Lifecycle(cid, done.returncode, time.monotonic() - started, done.stderr)
    finally:
        for d in dirs_named(relative):
            for pid in procs(d):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        subprocess.run([RUNC, "--root", root, "delete", "--force", cid], capture_output=True, check=False)

def freeze_v2_first(container_dir: str, pids: list[int], name: str = "held") -> str:
    """Move ``pids`` into a child of the container's cgroup2 directory, frozen (``cgroup.freeze``).

    For the v1 freezer hold on a pure v2 tree: a task the v1 freezer holds first
    never enters the v2 freezer's trap, so a runtime's own v2 freeze of the
    container (runc 1.1's ``signalAllProcesses``) waits for it (up to runc's
    10 s) on some runs and not on others. Frozen by v2 first, it is counted
    frozen before the v1 hold takes it, and stays counted: the runtime's freeze
    finishes at once, every run. SIGKILL passes the v2 freezer, not the v1 one.
    """
    child = os.path.join(container_dir, name)
    os.mkdir(child)
    for pid in pids:
        with open(os.path.join(child, "cgroup.procs"), "w") as f:
            f.write(str(pid))
    with open(os.path.join(child, "cgroup.freeze"), "w") as f:
        f.write("1")

    def frozen() -> bool:
        with open(os.path.join(child, "cgroup.events")) as f:
            return "frozen 1" in f.read().split("\n")

    if not wait_for(frozen, 5):
        raise RuntimeError(f"{child} did not report frozen 1")
    return child


@contextlib.contextmanager
def container_with_hold(
    workdir: str,
    children: int = 3,
    held: int = 2,
    freezer_root: str = FREEZER,
    runc: str = RUNC,
    v2_frozen_first: bool = False,
) -> Iterator[tuple[RuncContainer, FreezerHold]]:
    """A host-PID container (started by ``runc``) with ``held`` of its children in a frozen freezer.

    ``v2_frozen_first`` (a pure v2 tree with a v1 freezer mounted beside it): the held
    children are frozen in a cgroup2 child first (:func:`freeze_v2_first`).
    """
    ctr = RuncContainer.start(workdir, children, runc=runc)
    hold = FreezerHold.create(freezer_root)
    try:
        pids = ctr.children()[:held]
        if v2_frozen_first:
            freeze_v2_first(os.path.join(CGROUP_ROOT, ctr.cgroup_relative.strip("/")), pids)
        hold.hold(pids)
        yield ctr, hold
    finally:
        hold.destroy()
        ctr.destroy()


@dataclass
class CraftedContainer:
    """Real cgroup dirs in every hierarchy plus a runc-like state.json naming them.

    For fault tests that need exact control: the 'runtime' is a script, and the
    only processes inside are ones the test started and moved there by pid.
    """

    id: str
    root: str
    relative: str
    dirs: list[str]
    started: list[subprocess.Popen] = field(default_factory=list)  # type: ignore[type-arg]

    def dir_in(self, hierarchy: str) -> str:
        return next(d for d in self.dirs if f"/{hierarchy}/" in d)

    def add_process(self, hierarchies: tuple[str, ...] = ("memory", "unified")) -> subprocess.Popen:  # type: ignore[type-arg]
        """Start ``sleep`` and move it into this container's cgroup in ``hierarchies``."""
        proc = subprocess.Popen(["sleep", "600"])
        self.started.append(proc)
        for hierarchy in hierarchies:
            with open(os.path.join(self.dir_in(hierarchy), "cgroup.procs"), "w") as f:
                f.write(str(proc.pid))
        return proc

    def state_path(self) -> str:
        return os.path.join(self.root, self.id, "state.json")

    def runtime(self, body: str = "", status: int = 0) -> str:
        """A stand-in runtime that deletes this container's state as runc does, runs ``body``,
        then exits ``status``."""
        path = os.path.join(os.path.dirname(self.root), f"fake-runtime-{uuid.uuid4().hex[:8]}")
        return script(path, f"rm -rf {self.root}/{self.id}\n{body}\nexit {status}")

    def cleanup(self) -> None:
        # thaw first: a SIGKILLed process in a frozen cgroup cannot be reaped
        for d in self.dirs:
            frozen = os.path.join(d, "freezer.state")
            if os.path.exists(frozen):
                with open(frozen, "w") as f:
                    f.write("THAWED")
            if os.path.exists(os.path.join(d, "cgroup.freeze")):
                with open(os.path.join(d, "cgroup.freeze"), "w") as f:
                    f.write("0")
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for d in self.dirs:
            wait_for(lambda d=d: not procs(d), 5)  # type: ignore[misc]
            remove_tree(d)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(d))


@contextlib.contextmanager
def crafted_container(workdir: str, init_pid: int = 1) -> Iterator[CraftedContainer]:
    """A CraftedContainer that is always cleaned up."""
    cid = unique("rgtest-crafted")
    relative = f"/{cid}-parent/{cid}"
    root = os.path.join(workdir, "root")
    paths: dict[str, str] = {}
    made: list[str] = []
    ctr = CraftedContainer(cid, root, relative, made)
    try:
        for mount in cgroup_mount_points():
            path = os.path.join(mount, relative.strip("/"))
            os.makedirs(path)
            made.append(path)
            name = os.path.basename(mount)
            key = "" if name == "unified" or mount == CGROUP_ROOT else name
            paths["name=systemd" if key == "systemd" else key] = path
        os.makedirs(os.path.join(root, cid))
        with open(ctr.state_path(), "w") as f:
            json.dump(
                {
                    "id": cid,
                    "init_process_pid": init_pid,
                    "init_process_start": 1,
                    "cgroup_paths": paths,
                    # A host-PID container (no NEWPID), as runc writes it: its
                    # stragglers are runc's, and so runc-guard's, to kill.
                    "config": {"cgroups": {"path": relative}, "namespaces": [{"type": "NEWNS", "path": ""}]},
                },
                f,
            )
        yield ctr
    finally:
        ctr.cleanup()


def script(path: str, body: str) -> str:
    """An executable /bin/sh script at ``path`` (a stand-in runtime)."""
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body + "\n")
    os.chmod(path, 0o755)
    return path
