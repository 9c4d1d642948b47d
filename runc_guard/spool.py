"""The spool of delete entries: one file per delete, in ``<cache_dir>/spool``, sent later.

Written by the delete (and the shim's step-aside) before they exit, read by the
one reporter that holds the spool's flock (``logs.drain_spool``) and by the
sweep. A file appears by rename, so it is never seen half-written. Stdlib only.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping

from runc_guard.atomic import write_atomic

#: Files of the spool end in this; the lock and temp files do not.
SUFFIX = ".entries"
LOCK = ".reporter.lock"


def spool_dir(cache_dir: str) -> str:
    return os.path.join(cache_dir, "spool")


def write_spool(directory: str, entries: list[dict[str, object]], sink: Mapping[str, str]) -> str:
    """One file per delete: the entries and where they go (journal socket, fallback file).

    Not fsync'd: the spool lives on a tmpfs (/run) like the journal's own
    runtime files, and a file half-written is never seen (rename). Raises OSError.
    """
    name = f"{time.time_ns():020d}-{os.getpid()}{SUFFIX}"
    path = os.path.join(directory, name)
    data = json.dumps({"sink": dict(sink), "entries": entries}, default=str).encode()
    write_atomic(path, data, mode=0o600, durable=False, dir_mode=0o700)
    return path


def pending_files(directory: str) -> list[str]:
    """The spool's entry files, oldest first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [os.path.join(directory, n) for n in sorted(names) if n.endswith(SUFFIX)]


def try_lock(directory: str) -> int | None:
    """The spool's reporter lock (flock), or None if another reporter holds it."""
    import fcntl

    try:
        fd = os.open(os.path.join(directory, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd
