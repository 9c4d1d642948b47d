"""Atomic file writes: a whole file replaced, or one line appended; readers never see half.

``write_atomic`` is the one implementation for every file runc-guard writes in
place: pending records (which must survive a crash, so fsync'd with their
directory), the settings cache, the spool, the metrics textfile and state, and
containerd's config. ``append_line`` is the one for line logs (the stats
lines, the fallback event file, the runtime's ``--log``). Stdlib only.
"""

from __future__ import annotations

import os


def json_records(directory: str) -> list[str]:
    """The record files (``*.json``, not a writer's hidden temp file) in ``directory``, by name."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json") and not n.startswith("."))
    except OSError:
        return []
    return [os.path.join(directory, name) for name in names]


def read_trusted_json(path: str, limit: int) -> dict[str, object] | None:
    """A JSON object from :func:`read_trusted`'s bytes; None: absent, foreign, malformed, not an object."""
    from runc_guard import cjson

    raw = read_trusted(path, limit)
    if raw is None:
        return None
    try:
        return cjson.loads_object(raw)
    except ValueError:
        return None


def write_json_record(path: str, doc: dict[str, object]) -> bool:
    """A small record in /run (root's only, not fsync'd: it does not outlive a boot); False on failure."""
    from runc_guard import cjson

    try:
        write_atomic(path, cjson.dumps(doc).encode(), 0o600, durable=False, dir_mode=0o700)
    except OSError:
        return False
    return True


def read_trusted(path: str, limit: int) -> bytes | None:
    """A file's bytes (at most ``limit``), only if it is ours and writable by nobody else.

    The one gate in front of ``marshal.loads`` (the settings cache, the spool):
    hostile bytes must never reach it. None when absent, foreign or unreadable.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return None
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def append_line(
    path: str, line: str, mode: int = 0o644, make_dirs: bool = False, rotate_at: int | None = None
) -> bool:
    """Append ``line`` (with its newline) in one write(2); False if it cannot be written.

    O_APPEND makes each line land whole even with concurrent writers (deletes of
    a storm). Never raises: a log line must never fail what it reports.
    ``rotate_at``: once the file is larger, rename it to ``<path>.1`` (replacing
    that), so a file nobody else rotates stays bounded (delete.bounds).
    """
    try:
        if make_dirs:
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, mode)
    except OSError:
        return False
    try:
        os.write(fd, line.encode("utf-8", "surrogateescape"))
        if rotate_at is not None and os.fstat(fd).st_size > rotate_at:
            os.replace(path, path + ".1")
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_atomic(
    path: str,
    data: bytes,
    mode: int = 0o644,
    *,
    like: str | None = None,
    durable: bool = True,
    dir_mode: int = 0o755,
) -> None:
    """Write ``data`` to a temp file beside ``path``, then rename it over ``path``.

    ``like``: copy mode (and owner, as root) from that file when it exists, so an
    edited config keeps its permissions. ``durable``: fsync the file and its
    directory, so the rename survives a crash (the pending records need this; a
    cache does not). Missing parent directories are created with ``dir_mode``.
    Raises OSError; the temp file never stays behind.
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=dir_mode, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o600)
    except FileExistsError:  # left by a crashed writer with our pid: it is ours to replace
        os.unlink(tmp)
        fd = os.open(tmp, flags, 0o600)
    try:
        try:
            _write_all(fd, data)
            ref = os.stat(like) if like and os.path.exists(like) else None
            os.fchmod(fd, (ref.st_mode & 0o7777) if ref else mode)
            if ref is not None and os.geteuid() == 0:
                os.fchown(fd, ref.st_uid, ref.st_gid)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
