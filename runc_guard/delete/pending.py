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
from runc_guard.atomic import write_atomic
from runc_guard.delete.bounds import crowded, prune_stale_locks
from runc_guard.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

try:  # hashlib loads OpenSSL: ~2.5 ms of every delete's start-up, for one 12-digit name
    from _sha256 import sha256  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - another interpreter (3.12 calls it _sha2)
    from hashlib import sha256

MAX_RECORD_BYTES = 1 << 20


class PendingRecord(Value):
    """What a delete could not finish yet: enough for the next delete or the sweep to finish it."""

    __slots__ = (
        "cgroup_paths", "container_id", "created", "init_pid", "init_start", "runtime", "runtime_root",
    )
    container_id: str
    runtime_root: str
    cgroup_paths: list[str]
    init_pid: int
    init_start: int
    runtime: str
    created: float

    def __init__(
        self,
        container_id: str,
        runtime_root: str,
        cgroup_paths: list[str],
        init_pid: int,
        init_start: int,
        runtime: str,
        created: float,
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


def find_record(pending_dir: str, runtime_root: str, container_id: str) -> PendingRecord | None:
    """This container's record, or None when there is none (or it is unreadable)."""
    path = record_path(pending_dir, runtime_root, container_id)
    try:
        return read_record(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None


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


def read_record(path: str) -> PendingRecord:
    """Parse one record; raise ValueError if it is not one runc-guard wrote."""
    with open(path, "rb") as f:
        raw = f.read(MAX_RECORD_BYTES + 1)
    if len(raw) > MAX_RECORD_BYTES:
        raise ValueError(f"{path}: larger than {MAX_RECORD_BYTES} bytes")
    doc = cjson.loads(raw)
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a JSON object")
    try:
        record = PendingRecord(
            container_id=str(doc["container_id"]),
            runtime_root=str(doc["runtime_root"]),
            cgroup_paths=[str(p) for p in doc["cgroup_paths"]],
            init_pid=int(doc["init_pid"]),
            init_start=int(doc["init_start"]),
            runtime=str(doc["runtime"]),
            created=float(doc["created"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: malformed record ({exc})") from None
    return record


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def iter_records(pending_dir: str) -> Iterator[tuple[str, PendingRecord | ValueError]]:
    """Every record under ``pending_dir`` (path, record-or-error), oldest first.

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
            yield path, read_record(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                continue
            yield path, ValueError(str(exc))
        except ValueError as exc:
            yield path, exc
