"""Read the TOML settings file without paying for ``tomllib`` on every runtime call.

Importing ``tomllib`` costs ~10-15 ms, more than a bare interpreter start, and the
shim runs for every ``runc state``/``exec`` of every container. So the parsed file
is cached with ``marshal`` (a builtin: free to import) under the cache directory,
keyed by the file's device, inode, size, mtime and ctime. ctime cannot be set
from user space, so an edited file always misses. The cache is trusted only if
it is owned by us and not writable by group or others: ``marshal.loads`` of
hostile bytes must never be reachable.
"""

from __future__ import annotations

import marshal
import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing and collections.abc cost imports the hot path does not pay
    from collections.abc import Mapping

DEFAULT_CONFIG = "/etc/runc-guard/config.toml"
DEFAULT_CACHE_DIR = "/run/runc-guard"
MAX_CONFIG_BYTES = 1 << 20


def config_path(environ: Mapping[str, str]) -> str:
    return environ.get("RUNC_GUARD_CONFIG") or DEFAULT_CONFIG


def cache_dir(environ: Mapping[str, str]) -> str:
    return environ.get("RUNC_GUARD_CACHE_DIR") or DEFAULT_CACHE_DIR


def _cache_file(directory: str, path: str) -> str:
    # The path is stored inside the cache and compared on read, so this name only
    # needs to be stable, not injective.
    return os.path.join(directory, "config" + path.replace("/", "%") + ".cache")


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _read_cache(cache: str, path: str, key: tuple[int, ...]) -> dict[str, object] | None:
    try:
        fd = os.open(cache, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not _trusted(os.fstat(fd)):
            return None
        blob = os.read(fd, MAX_CONFIG_BYTES * 4)
    finally:
        os.close(fd)
    try:
        cached_path, cached_key, data = marshal.loads(blob)
    except (ValueError, EOFError, TypeError):
        return None
    if cached_path != path or tuple(cached_key) != key or not isinstance(data, dict):
        return None
    return data


def _write_cache(cache: str, path: str, key: tuple[int, ...], data: dict[str, object]) -> None:
    """Best effort: a cache that cannot be written only costs the next call 10 ms."""
    try:
        blob = marshal.dumps((path, key, data))
    except ValueError:  # TOML dates and times are not marshallable: just don't cache
        return
    directory = os.path.dirname(cache)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if not _trusted(os.lstat(directory)):
            return
        from runc_guard.atomic import write_atomic  # only on a cache miss

        write_atomic(cache, blob, 0o600, durable=False, dir_mode=0o700)
    except OSError:
        pass


def read_settings_file(path: str, cache_directory: str | None) -> dict[str, object]:
    """The settings file as a dict; ``{}`` when it does not exist.

    Raises ``OSError`` when it exists but cannot be read and ``ValueError`` when
    it is not valid TOML; the caller turns both into a ConfigError.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return {}
    key = _stat_key(st)
    cache = _cache_file(cache_directory, path) if cache_directory else None
    if cache is not None:
        cached = _read_cache(cache, path, key)
        if cached is not None:
            return cached
    if st.st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes")
    import tomllib  # ~10 ms: only on a cache miss

    with open(path, "rb") as f:
        data: dict[str, object] = tomllib.load(f)
    if cache is not None:
        _write_cache(cache, path, key, data)
    return data
