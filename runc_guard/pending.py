"""Durable records of cgroups that a delete is responsible for removing.

Written before the runtime deletes its own state, because go-runc may SIGKILL us
at its deadline and then nothing else would remember these paths. A record is
removed only once every directory is gone; ``runc-guardctl sweep`` finishes the
job for records left behind. They live in /run: cgroups do not outlive a boot.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from runc_guard.atomic import write_atomic

MAX_RECORD_BYTES = 1 << 20


@dataclass(frozen=True)
class PendingRecord:
    container_id: str
    runtime_root: str
    cgroup_paths: list[str]
    init_pid: int
    init_start: int
    runtime: str
    created: float


def record_path(pending_dir: str, runtime_root: str, container_id: str) -> str:
    """One file per container; the root's hash keeps namespaces with equal ids apart."""
    root_hash = hashlib.sha256(os.path.normpath(runtime_root).encode()).hexdigest()[:12]
    return os.path.join(pending_dir, f"{container_id}@{root_hash}.json")


def write_record(pending_dir: str, record: PendingRecord) -> str:
    """Atomically and durably write ``record``; raise OSError (the delete goes on without it)."""
    path = record_path(pending_dir, record.runtime_root, record.container_id)
    data = json.dumps(asdict(record), sort_keys=True).encode()
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
    doc = json.loads(raw)
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


def iter_records(pending_dir: str) -> Iterator[tuple[str, PendingRecord | ValueError]]:
    """Every record under ``pending_dir`` (path, record-or-error), oldest first."""
    try:
        names = [n for n in os.listdir(pending_dir) if n.endswith(".json")]
    except FileNotFoundError:
        return
    paths = [os.path.join(pending_dir, n) for n in names]
    paths.sort(key=lambda p: os.stat(p).st_mtime if os.path.exists(p) else time.time())
    for path in paths:
        try:
            yield path, read_record(path)
        except (OSError, ValueError) as exc:
            yield path, ValueError(str(exc))
