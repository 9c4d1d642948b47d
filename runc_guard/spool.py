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
    from collections.abc import Mapping

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


def step_back(autogroup: str = "/proc/self/autogroup", mountinfo: str = "/proc/self/mountinfo") -> None:
    """A detached helper's second act: run below everything containerd does, and away from its caller.

    The helpers start their own session (so a kill of the shim's process group
    cannot reach them), and with ``sched_autogroup`` (on in Debian's kernels) the
    scheduler first shares the CPU between sessions: a helper alone in its session
    competed as an equal with the session of containerd, its shims and their
    runtimes, whatever its own nice. So both are lowered: the process's nice (all
    that counts without autogroup) and its autogroup's. Best effort: a kernel
    without autogroup has no such file.

    The caller's place is not the helper's: the runtime is started in the bundle
    directory, and a serving shim may live in a pod's cgroup (``ShimCgroup``).
    A helper that lingers there would hold the bundle as its cwd and keep the
    pod's cgroup populated (kubelet kills what it finds there before it can
    remove a pod's cgroup, and charges it to the pod's limits). So it moves to
    ``/`` and to the root of every cgroup hierarchy (``leave_callers_cgroups``).
    """
    try:
        os.setpriority(os.PRIO_PROCESS, 0, HELPER_NICE)
    except OSError:
        pass
    try:
        with open(autogroup, "w") as f:
            f.write(str(HELPER_NICE))
    except OSError:
        pass
    os.chdir("/")
    leave_callers_cgroups(mountinfo)


def leave_callers_cgroups(mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Join the root cgroup of every mounted hierarchy; returns the roots joined.

    Only this process moves (``cgroup.procs``, one pid), and only to a mount
    that shows its hierarchy's root (mountinfo's root field ``/``: the hierarchy's
    or this cgroup namespace's root, an ancestor of wherever we are), which
    accepts processes whatever its controllers (v2's no-internal-process rule
    exempts the root). A mount of a sub-cgroup is passed over: its root need not
    be an ancestor of ours. Best effort: a root that refuses (read-only) keeps
    the helper where it was in that hierarchy.
    """
    from runc_guard.procinfo import unescape_mountinfo

    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.readlines()
    except OSError:
        return []
    pid = str(os.getpid()).encode()
    joined = []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split(" ")
        if len(fields) < 5 or right.split(" ", 1)[0] not in ("cgroup", "cgroup2") or fields[3] != "/":
            continue
        mount = unescape_mountinfo(fields[4])
        try:
            fd = os.open(os.path.join(mount, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            os.write(fd, pid)
            joined.append(mount)
        except OSError:
            pass
        finally:
            os.close(fd)
    return joined


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
