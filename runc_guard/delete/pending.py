"""Durable records of cgroups that a delete is responsible for removing.

Written before the runtime deletes its own state, because go-runc may SIGKILL us
at its deadline and then nothing else would remember these paths. A record is
removed only once every directory is gone; ``runc-guardctl sweep`` finishes the
job for records left behind. They live in /run: cgroups do not outlive a boot.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time

from runc_guard import cjson
from runc_guard.atomic import read_trusted, write_atomic
from runc_guard.delete.bounds import crowded, prune_stale_locks
from runc_guard.invocation import valid_container_id
from runc_guard.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping

    from runc_guard.delete.cgroupfs import CgroupFsOps
    from runc_guard.settings import Settings

try:  # hashlib loads OpenSSL: ~2.5 ms of every delete's start-up, for one 12-digit name
    from _sha256 import sha256  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - another interpreter (3.12 calls it _sha2)
    from hashlib import sha256

MAX_RECORD_BYTES = 1 << 20


class PendingRecord(Value):
    """What a delete could not finish yet: enough for the next delete or the sweep to finish it."""

    __slots__ = (
        "bundle", "cgroup_paths", "container_id", "created", "init_pid", "init_start", "runtime",
        "runtime_root", "sandbox_id",
    )
    container_id: str
    runtime_root: str
    cgroup_paths: list[str]
    init_pid: int
    init_start: int
    runtime: str
    created: float
    #: The state's bundle and CRI sandbox: while containerd holds either, a finisher keeps off
    #: (kept here because runc 1.1 drops the state that names them). "" when unknown.
    bundle: str
    sandbox_id: str

    def __init__(
        self,
        container_id: str,
        runtime_root: str,
        cgroup_paths: list[str],
        init_pid: int,
        init_start: int,
        runtime: str,
        created: float,
        bundle: str = "",
        sandbox_id: str = "",
    ) -> None:
        self._init(locals())


def record_path(pending_dir: str, runtime_root: str, container_id: str) -> str:
    """One file per container; the root's hash keeps namespaces with equal ids apart."""
    root_hash = sha256(os.path.normpath(runtime_root).encode()).hexdigest()[:12]
    return os.path.join(pending_dir, f"{container_id}@{root_hash}.json")


#: Lock files of deletes in progress, one per (runtime root, id), in a directory
#: beside the records' (``/run/runc-guard/locks``), so records stay alone in theirs.
LOCK_DIR = "locks"
#: How often a delete that found its container claimed by another looks again.
CLAIM_POLL = 0.01
CLAIMED, BUSY, UNAVAILABLE = "claimed", "busy", "unavailable"


class Claim:
    """Hold the one delete of (root, id) on this node; ``with`` gives CLAIMED, BUSY or UNAVAILABLE.

    Two deletes of one id (containerd's retry racing a slow first try, the
    dead-shim cleanup racing the normal path) would otherwise drop each other's
    record. The second waits here for the first, until ``deadline``, then finds
    its record and finishes it. The lock is an flock on a file that is unlinked
    while still held; a waiter that then locks an unlinked file tries again.
    UNAVAILABLE: the pending directory cannot be written (the delete goes on).
    A class, not ``contextlib.contextmanager``: contextlib costs ~2 ms of every
    delete's start.
    """

    def __init__(
        self,
        pending_dir: str,
        runtime_root: str,
        container_id: str,
        deadline: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        name = os.path.basename(record_path(pending_dir, runtime_root, container_id))
        lock_dir = os.path.join(os.path.dirname(os.path.normpath(pending_dir)), LOCK_DIR)
        self.path = os.path.join(lock_dir, name[: -len(".json")] + ".lock")
        self.deadline = deadline
        self.clock = clock
        self.fd = -1

    def __enter__(self) -> str:
        path = self.path
        fd = -1
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            while True:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    fd = -1
                    if self.clock() >= self.deadline:
                        return BUSY
                    time.sleep(CLAIM_POLL)
                    continue
                try:
                    same = os.stat(path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    self.fd = fd
                    return CLAIMED
                os.close(fd)  # the holder unlinked it after we opened it: lock the new one
                fd = -1
        except OSError:
            if fd >= 0:
                os.close(fd)
            return UNAVAILABLE

    def __exit__(self, *exc_info: object) -> None:
        if self.fd < 0:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = -1
        lock_dir = os.path.dirname(self.path)
        if crowded(lock_dir):  # deletes SIGKILLed while they held theirs (delete.bounds)
            prune_stale_locks(lock_dir)


class UntrustedRecord(ValueError):
    """A record runc-guard must not act on: not its own file, not one it wrote, or naming what no
    delete of its container would touch. Left where it is for ``audit`` (and an operator).
    ``container_id``: the id it names, when it could be parsed (the sweep keeps that unit)."""

    def __init__(self, reason: str, container_id: str | None = None) -> None:
        super().__init__(reason)
        self.container_id = container_id


class RecordRule:
    """The one trust rule every reader of a pending record holds it to (:func:`read_record`).

    A record decides what runs as root (its ``runtime``) and what is drained,
    reclaimed, held (renamed) and removed (its ``cgroup_paths``), so it is
    trusted no more than the state.json it came from, and re-checked where it
    is acted on (node.finisher, right before): the id is an id and the root an
    absolute path; every path has the shape of a cgroup (``paths.check_path``:
    absolute, normalised, no symlink, on a cgroup filesystem below a mount) and
    the ownership of the container's own (``paths.ownership_problem``: the leaf
    names the container, or is crun's systemd ``container`` leaf of a scope that
    does and is in the record too; no pod/QoS/slice level); the runtime is one the
    settings route to (:func:`routed_runtimes`). The file itself must be ours
    (``atomic.read_trusted``, as for aside, held, spool and routes files).
    """

    def __init__(
        self,
        fs: CgroupFsOps,
        mounts: Mapping[str, str],
        runtimes: Iterable[str],
        patterns: Iterable[str] = (),
    ) -> None:
        self.fs = fs
        self.mounts = mounts
        self.runtimes = frozenset(runtimes)
        self.patterns = tuple(patterns)

    @classmethod
    def of(
        cls, settings: Settings, fs: CgroupFsOps, mounts: Mapping[str, str],
        environ: Mapping[str, str] | None = None,
    ) -> RecordRule:
        """The rule for ``settings``: their routing and cgroup name patterns, today's mounts."""
        names = [settings.runtime, *settings.runtimes.values()]
        routed = routed_runtimes(names, os.environ if environ is None else environ)
        return cls(fs, mounts, routed, settings.container_cgroup_patterns)

    def problem(self, record: PendingRecord) -> str | None:
        """Why ``record`` must not be acted on, or None."""
        # Here, not at the top: the shim's cheap look for a record (record_path) must not load them.
        from runc_guard.delete.paths import check_path, ownership_problem
        from runc_guard.errors import UnsafeCgroupPath

        if not valid_container_id(record.container_id) or not os.path.isabs(record.runtime_root):
            return f"not a container id and runtime root: {record.container_id!r}, {record.runtime_root!r}"
        problem = self.runtime_problem(record.runtime)
        if problem is not None:
            return problem
        # crun's systemd leaf (``<scope>/container``) is the container's only beside its scope
        scopes = record.cgroup_paths
        for path in record.cgroup_paths:
            try:
                check_path(path, self.fs, self.mounts)
            except UnsafeCgroupPath as exc:
                return str(exc)
            problem = ownership_problem(path, record.container_id, self.fs, None, self.patterns, scopes)
            if problem is not None:
                return problem
        return None

    def runtime_problem(self, runtime: str) -> str | None:
        if runtime in self.runtimes:
            return None
        return f"runtime {runtime!r} is not one the settings route to"


def routed_runtimes(names: Iterable[str], environ: Mapping[str, str]) -> frozenset[str]:
    """Every path by which a delete could have found a routed runtime name (runtime.resolve_runtime).

    A path as it is; a bare name in each absolute directory of ``PATH`` and of the
    default PATH (a sweep under systemd and a shim under containerd may differ).
    Pure: no file is looked at, so a record's runtime is only ever compared.
    """
    from runc_guard.runtime import DEFAULT_PATH

    found = set()
    directories = [d for d in f"{environ.get('PATH', '')}:{DEFAULT_PATH}".split(":") if os.path.isabs(d)]
    for name in names:
        if "/" in name:
            found.add(name)
        else:
            found.update(os.path.join(d, name) for d in directories)
    return frozenset(found)


def find_record(
    pending_dir: str, runtime_root: str, container_id: str, rule: RecordRule
) -> PendingRecord | None:
    """This container's record, or None when there is none. Raises UntrustedRecord (read_record)."""
    path = record_path(pending_dir, runtime_root, container_id)
    try:
        return read_record(path, rule)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UntrustedRecord(f"{path}: {exc.strerror}") from None


def write_record(pending_dir: str, record: PendingRecord) -> str:
    """Atomically and durably write ``record``; raise OSError (the delete goes on without it)."""
    path = record_path(pending_dir, record.runtime_root, record.container_id)
    data = cjson.dumps(record.as_dict(), sort_keys=True).encode()
    write_atomic(path, data, 0o600, durable=True, dir_mode=0o700)
    return path


def remove_record(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def read_record(path: str, rule: RecordRule) -> PendingRecord:
    """One record, only if runc-guard may act on it (``rule``); raise UntrustedRecord otherwise.

    The one reader of a record file: the delete, the finisher, the sweep and audit
    all come here. Raises FileNotFoundError when there is none.
    """
    raw = read_trusted(path, MAX_RECORD_BYTES + 1)
    if raw is None:
        if not os.path.lexists(path):
            raise FileNotFoundError(path)
        raise UntrustedRecord(f"{path}: not ours (a symlink, another owner, or writable by others)")
    if len(raw) > MAX_RECORD_BYTES:
        raise UntrustedRecord(f"{path}: larger than {MAX_RECORD_BYTES} bytes")
    try:
        doc = cjson.loads_object(raw)
    except ValueError as exc:
        raise UntrustedRecord(f"{path}: {exc}") from None
    try:
        record = PendingRecord(
            container_id=str(doc["container_id"]),
            runtime_root=str(doc["runtime_root"]),
            cgroup_paths=[str(p) for p in doc["cgroup_paths"]],
            init_pid=int(doc["init_pid"]),
            init_start=int(doc["init_start"]),
            runtime=str(doc["runtime"]),
            created=float(doc["created"]),
            bundle=str(doc.get("bundle", "")),
            sandbox_id=str(doc.get("sandbox_id", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UntrustedRecord(f"{path}: malformed record ({exc})") from None
    problem = rule.problem(record)
    if problem is not None:
        raise UntrustedRecord(f"{path}: {problem}", record.container_id)
    return record


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def iter_records(pending_dir: str, rule: RecordRule) -> Iterator[tuple[str, PendingRecord | ValueError]]:
    """Every record under ``pending_dir`` (path, record-or-error: read_record), oldest first.

    Vanish-safe: a record that a finishing delete removes between the listing
    and the read is simply skipped, never reported as a problem.
    """
    try:
        names = [n for n in os.listdir(pending_dir) if n.endswith(".json")]
    except (FileNotFoundError, NotADirectoryError):
        return
    dated = [(m, p) for p in (os.path.join(pending_dir, n) for n in names) if (m := _mtime(p)) is not None]
    for _, path in sorted(dated):
        try:
            yield path, read_record(path, rule)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                continue
            yield path, ValueError(str(exc))
        except ValueError as exc:
            yield path, exc
