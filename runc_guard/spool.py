"""The spool of delete entries: one file per delete, in ``<cache_dir>/spool``, sent later.

Written by the delete (and the shim's step-aside) before they exit, read by the
one reporter that holds the spool's flock (``reporter.drain_spool``) and by the
sweep. A file appears by rename, so it is never seen half-written. The format
is ``marshal`` (a builtin: the shim's step-aside in a crash storm must not pay
for ``json``'s import); like the settings cache, a file is read only if it is
ours and not writable by others, so hostile bytes never reach ``marshal.loads``.
Stdlib only.
"""

from __future__ import annotations

import marshal
import os
import time

from runc_guard.atomic import read_trusted, write_atomic

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping

#: Files of the spool end in this; the lock and temp files do not.
SUFFIX = ".entries"
LOCK = ".reporter.lock"
#: A delete's entries are a few KiB; a sandbox's with its siblings' a few tens.
MAX_SPOOL_BYTES = 16 << 20


def spool_dir(cache_dir: str) -> str:
    return os.path.join(cache_dir, "spool")


def write_spool(directory: str, entries: list[dict[str, object]], sink: Mapping[str, str]) -> str:
    """One file per delete: the entries and where they go (journal socket, fallback file).

    Not fsync'd: the spool lives on a tmpfs (/run) like the journal's own
    runtime files, and a file half-written is never seen (rename). Raises OSError.
    """
    name = f"{time.time_ns():020d}-{os.getpid()}{SUFFIX}"
    path = os.path.join(directory, name)
    doc = {"sink": dict(sink), "entries": entries}
    try:
        data = marshal.dumps(doc)
    except ValueError:  # a value marshal cannot carry: as text, as json's default=str would
        data = marshal.dumps(_plain(doc))  # type: ignore[arg-type]
    write_atomic(path, data, mode=0o600, durable=False, dir_mode=0o700)
    return path


def _plain(value: object) -> object:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def read_spooled(path: str) -> dict[str, object]:
    """One spool file's document. Raises FileNotFoundError (another reporter sent it) and
    ValueError (not ours, or not a spool document: never unmarshalled)."""
    data = read_trusted(path, MAX_SPOOL_BYTES)
    if data is None:
        if not os.path.lexists(path):
            raise FileNotFoundError(path)
        raise ValueError(f"{path} is not ours, or is writable by others")
    try:
        doc = marshal.loads(data)
    except (EOFError, TypeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a spool document")
    return doc


def pending_files(directory: str) -> list[str]:
    """The spool's entry files, oldest first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [os.path.join(directory, n) for n in sorted(names) if n.endswith(SUFFIX)]


def try_lock(directory: str, name: str = LOCK) -> int | None:
    """A detached helper's lock (flock; the spool's reporter by default), or None if it is held."""
    import fcntl

    try:
        fd = os.open(os.path.join(directory, name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


#: A detached helper's nice, for itself and for its session's autogroup (the lowest: 19).
HELPER_NICE = 19


#: Set by a helper's spawner (delete.report.spawn_detached): the ``/proc/<pid>/cgroup`` text of the
#: process whose cgroups bound the helper (:func:`helper_home`), found from the spawner's ancestry
#: while it is still there. Absent (the launcher's start): the helper looks from its own. The
#: helper takes it out of its environment: the runtimes it runs never see it, and a helper it
#: starts (the finisher's reporter) stays where the first one already is.
HOME_ENV = "RUNC_GUARD_HELPER_HOME"
#: Ancestors looked at, at most (a shim's delete is 2-4 below containerd).
MAX_ANCESTORS = 32


def lower_priority(pid: int, proc: str = "/proc") -> None:
    """Run the helper ``pid`` below everything containerd does: its spawner's first act.

    The helpers start their own session (so a kill of the shim's process group
    cannot reach them), and with ``sched_autogroup`` (on in Debian's kernels) the
    scheduler first shares the CPU between sessions: a helper alone in its session
    competes as an equal with the session of containerd, its shims and their
    runtimes, whatever its own nice. So both are lowered: the process's nice (all
    that counts without autogroup) and its autogroup's. Done by the spawner as the
    helper's interpreter starts (its largest cost: ~0.5 s of CPU on an emulated
    node), not by the helper once it has started; the launcher does it in the
    child before its exec. Best effort: a kernel without autogroup has no such file.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, pid, HELPER_NICE)
    except OSError:
        pass
    try:
        with open(f"{proc}/{pid}/autogroup", "w") as f:
            f.write(str(HELPER_NICE))
    except OSError:
        pass


def step_back(
    mountinfo: str = "/proc/self/mountinfo",
    environ: MutableMapping[str, str] | None = None,
    proc: str = "/proc",
) -> list[str] | None:
    """A detached helper's second act: away from its caller (its spawner lowered its priority:
    :func:`lower_priority`).

    The caller's place is not the helper's: the runtime is started in the bundle
    directory, and a serving shim may live in a pod's cgroup (``ShimCgroup``).
    A helper that lingers there would hold the bundle as its cwd and keep the
    pod's cgroup populated (kubelet kills what it finds there before it can
    remove a pod's cgroup, and charges it to the pod's limits). So it moves to
    ``/``, and into containerd's own cgroups (:func:`helper_home`, :func:`join_home`):
    where the node's admin bounds containerd's work (memory, pids, CPU, the
    system-reserved accounting), never a hierarchy's root unless containerd is
    there itself, and never onto CPUs its caller could not use. Returns the
    directories joined. When containerd's place is unknown the helper stays in
    its caller's cgroups, as the runtime it runs would: [] when those are no
    pod's (a sweep's service), None when they are (``kubepods``): the helper
    then says so once (:func:`note_once`).
    """
    os.chdir("/")
    environ = os.environ if environ is None else environ
    home = environ.pop(HOME_ENV) if HOME_ENV in environ else helper_home(os.getpid(), proc)
    if not home:
        own = _read(f"{proc}/self/cgroup").decode("utf-8", "surrogateescape")
        return None if _in_kubepods(own) else []
    return join_home(home, mountinfo)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 16)
    except OSError:
        return b""


def _parent(pid: int, proc: str) -> int:
    """The parent's pid from ``/proc/<pid>/stat`` (after the ``(comm)`` that may hold spaces); 0: gone."""
    raw = _read(f"{proc}/{pid}/stat")
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return 0


def helper_home(pid: int, proc: str = "/proc") -> str | None:
    """The cgroups a helper started below ``pid`` joins: ``/proc/<x>/cgroup`` text; None: unknown.

    containerd's own (its service cgroup: ``system.slice/containerd.service``
    under systemd), for the nearest ancestor named ``containerd``: a dead-shim
    cleanup's delete runs below it. A serving shim was re-parented away from it;
    it was started in containerd's cgroups and stays there unless ``ShimCgroup``
    moved it into a pod's, so the nearest ``containerd-shim*`` ancestor's count
    when no path of theirs has a ``kubepods`` level. Neither: unknown (a caller
    that is no containerd's, or a shim inside a pod).
    """
    shim: str | None = None
    for _ in range(MAX_ANCESTORS):
        pid = _parent(pid, proc)
        if pid <= 0:
            break
        comm = _read(f"{proc}/{pid}/comm").strip()
        if comm == b"containerd" or (shim is None and comm.startswith(b"containerd-shim")):
            cgroups = _read(f"{proc}/{pid}/cgroup").decode("utf-8", "surrogateescape")
            if comm == b"containerd" and cgroups:
                return cgroups
            if cgroups and not _in_kubepods(cgroups):
                shim = cgroups
        if pid == 1:
            break
    return shim


def _in_kubepods(cgroups: str) -> bool:
    """Does a ``/proc/<pid>/cgroup`` text name a cgroup below kubelet's (a ``kubepods*`` level)?"""
    return any(part.startswith("kubepods") for line in cgroups.splitlines()
               for part in line.partition(":")[2].partition(":")[2].split("/"))  # fmt: skip


def _home_paths(home: str) -> tuple[str | None, list[tuple[frozenset[str], str]]]:
    """(the cgroup2 path, [(v1 controllers, path)]) of a ``/proc/<pid>/cgroup`` text; paths that
    leave this cgroup namespace (``/..``) are left out."""
    unified: str | None = None
    v1: list[tuple[frozenset[str], str]] = []
    for line in home.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path.startswith("/") or ".." in path.split("/"):
            continue
        if number == "0" and not controllers:
            unified = path
        elif controllers:
            v1.append((frozenset(controllers.split(",")), path))
    return unified, v1


def join_home(home: str, mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Join, in every mounted hierarchy, the cgroup ``home`` names for it; returns the directories joined.

    Only this process moves (``cgroup.procs``, one pid), and only through a mount
    that shows its hierarchy's root (mountinfo's root field ``/``), where the
    path ``home`` names is that hierarchy's. A hierarchy ``home`` does not name,
    or whose cgroup refuses (read-only, a v2 cgroup with controllers below it),
    keeps the helper where it was. A cpuset move resets the CPU affinity to the
    new cpuset's CPUs (v1 before kernel 6.2 always; any kernel when the old
    mask came from the cpuset, not sched_setaffinity): the caller's mask is given
    back where it is narrower, so a helper started on a pod's CPUs never spreads
    onto CPUs isolated for others.
    """
    from runc_guard.procinfo import unescape_mountinfo

    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.readlines()
    except OSError:
        return []
    unified, v1 = _home_paths(home)
    try:
        before = os.sched_getaffinity(0)
    except OSError:
        before = set()
    pid = str(os.getpid()).encode()
    joined = []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(" "), right.split(" ")
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2") or fields[3] != "/":
            continue
        options = set(tail[2].strip().split(","))
        path = unified if tail[0] == "cgroup2" else next((p for c, p in v1 if c <= options), None)
        if path is None:
            continue
        directory = unescape_mountinfo(fields[4]).rstrip("/") + path.rstrip("/")
        try:
            fd = os.open(os.path.join(directory or "/", "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            os.write(fd, pid)
            joined.append(directory)
        except OSError:
            pass
        finally:
            os.close(fd)
    _never_wider(before)
    return joined


def _never_wider(before: set[int]) -> None:
    """Give the CPU affinity ``before`` back where a cgroup move widened it (only ever narrower)."""
    try:
        now = os.sched_getaffinity(0)
        if before and not now <= before and now & before:
            os.sched_setaffinity(0, now & before)
    except OSError:
        pass


#: The note (one per directory and boot, /run) that a helper stayed in its caller's cgroups.
HELPER_STAYED = ".helper-stayed"
STAYED_REASON = (
    "no containerd (nor a shim in containerd's cgroups) above this helper: it stays in the pod's"
    " cgroups its caller ran in, as the runtime would"
)


def note_once(directory: str, name: str) -> bool:
    """True the first time ``name`` is noted in ``directory`` (a file made with O_EXCL; /run: per boot)."""
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        os.close(os.open(os.path.join(directory, name), flags, 0o600))
    except OSError:
        return False
    return True


def keep_only_stdio_and(held: int) -> None:
    """A detached helper's first act: close every inherited fd but stdio (/dev/null) and its lock.

    A pipe or the claim flock of the delete that started it must not outlive that delete.
    """
    try:
        top = os.sysconf("SC_OPEN_MAX")
    except (OSError, ValueError):
        top = 1 << 20
    os.closerange(3, held)
    os.closerange(held + 1, top)
