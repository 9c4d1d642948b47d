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
#: containerd gives the dead-shim cleanup (the shim's whole ``delete``, runc
#: included) 5 s by default (io.containerd.timeout.shim.cleanup), counted from
#: the shim's start; runc-guard counts from its own process start. 4 s leaves the
#: shim ~1 s to unmount the rootfs after we return, and is what a 3-4 s teardown
#: needs: under the systemd driver stock runc waits on systemd's stop job and
#: finishes such teardowns inside containerd's 5 s, so a shorter deadline would
#: leave more behind than the runtime alone (measured in the systemd lab).
DEFAULT_DELETE_TIMEOUT = 4.0
#: The range config.py accepts for ``delete_timeout`` (seconds).
MAX_DELETE_TIMEOUT = 600.0
#: Where the delete path keeps its durable records (Settings.pending_dir's default).
DEFAULT_PENDING_DIR = "/run/runc-guard/pending"
DEFAULT_CACHE_DIR = "/run/runc-guard"
#: Where log entries go (Settings' defaults; the shim needs them before Settings exists).
DEFAULT_JOURNAL_SOCKET = "/run/systemd/journal/socket"
DEFAULT_LOG_FILE = "/var/log/runc-guard/events.jsonl"
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
    blob = _read_trusted(cache)
    if blob is None:
        return None
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


#: Keys that decide where a call goes; kept from the last file that parsed.
ROUTING_KEYS = ("runtime", "runtimes")


def _last_good_file(directory: str, path: str) -> str:
    return os.path.join(directory, "routing" + path.replace("/", "%") + ".last-good")


def _keep_last_good(directory: str, path: str, data: dict[str, object]) -> None:
    """Remember the routing of a file that parsed, for when a later edit breaks it."""
    routing = {k: data[k] for k in ROUTING_KEYS if k in data}
    runtime = routing.get("runtime", "runc")
    table = routing.get("runtimes", {})
    if not isinstance(runtime, str) or not runtime or not isinstance(table, dict):
        return
    if not all(isinstance(k, str) and isinstance(v, str) and v for k, v in table.items()):
        return
    try:
        blob = marshal.dumps((path, routing))
        from runc_guard.atomic import write_atomic

        write_atomic(_last_good_file(directory, path), blob, 0o600, durable=False, dir_mode=0o700)
    except (OSError, ValueError):
        pass


def last_good_routing(path: str, cache_directory: str | None) -> dict[str, object] | None:
    """``runtime``/``[runtimes]`` of the last version of ``path`` that parsed, or None.

    A TOML syntax error must not silently send ``runc-guard-nvidia`` to plain runc
    (GPU pods would start without GPUs): the shim routes by this copy instead.
    """
    if not cache_directory:
        return None
    found = _read_trusted(_last_good_file(cache_directory, path))
    if found is None:
        return None
    try:
        cached_path, routing = marshal.loads(found)
    except (ValueError, EOFError, TypeError):
        return None
    if cached_path != path or not isinstance(routing, dict):
        return None
    return routing


def first_report(cache_directory: str | None, path: str, problem: str) -> bool:
    """True the first time ``problem`` is seen for this version of ``path`` (once per edit).

    A broken settings file is reported to the journal once, not by every runtime
    call of every container: the marker's name holds the file's stat key and a
    checksum of the problem, so an edit (new ctime) or a new problem reports again.
    """
    if not cache_directory:
        return True
    import binascii

    try:
        key = "-".join(str(k) for k in _stat_key(os.stat(path)))
    except OSError:
        key = "absent"
    crc = binascii.crc32(problem.encode("utf-8", "surrogateescape"))
    marker = os.path.join(cache_directory, f"reported{path.replace('/', '%')}-{key}-{crc:08x}")
    try:
        os.makedirs(cache_directory, mode=0o700, exist_ok=True)
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


def _read_trusted(path: str) -> bytes | None:
    """A cache file's bytes, only if it is ours and not writable by others (marshal input)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not _trusted(os.fstat(fd)):
            return None
        return os.read(fd, MAX_CONFIG_BYTES * 4)
    finally:
        os.close(fd)


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
    if cache is not None and cache_directory:
        _write_cache(cache, path, key, data)
        _keep_last_good(cache_directory, path, data)
    return data


def delete_timeout_of(raw: Mapping[str, object], environ: Mapping[str, str]) -> float:
    """``delete_timeout`` as the delete path will use it, read cheaply for the shim.

    A bad value keeps the default here too (config.lenient_settings reports it).
    """
    value = environ.get("RUNC_GUARD_DELETE_TIMEOUT") or raw.get("delete_timeout", DEFAULT_DELETE_TIMEOUT)
    if isinstance(value, bool):
        return DEFAULT_DELETE_TIMEOUT
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return DEFAULT_DELETE_TIMEOUT
    return seconds if 0.0 <= seconds <= MAX_DELETE_TIMEOUT else DEFAULT_DELETE_TIMEOUT


def log_sink_of(raw: Mapping[str, object], environ: Mapping[str, str]) -> dict[str, str]:
    """journal_socket and log_file as the delete path would use them (absolute paths, else defaults)."""
    sink = {}
    for key, default in (("journal_socket", DEFAULT_JOURNAL_SOCKET), ("log_file", DEFAULT_LOG_FILE)):
        value = environ.get(f"RUNC_GUARD_{key.upper()}") or raw.get(key)
        sink[key] = value if isinstance(value, str) and value.startswith("/") else default
    return sink
