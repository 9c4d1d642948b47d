"""The routing cache: where each call goes, written for the C launcher, kept across reboots.

The launcher (launcher/runc-guard.c) routes every runtime call without an
interpreter by this file; the settings load writes it whenever the settings file
parsed with a valid routing. It is also the *last good routing*: when a later
edit breaks the file, the shim routes by this copy instead of guessing (GPU pods
must not start on plain runc). So it lives in a persistent directory
(``/var/lib/runc-guard``, root-owned 0700), written atomically and fsync'd: a
reboot must not forget it (/run is a tmpfs).

Plain text the C side parses with no allocation, one ``key<TAB>value`` per line,
in this order (values never hold a tab, newline or NUL; such a routing is not
cached and every call takes the Python entry)::

    runc-guard-routes 2
    config  <settings file path>
    file    <dev> <ino> <size> <mtime_ns> <ctime_ns>
    runtime <runtime>
    pending <pending_dir>
    debug   0|1
    timeout <delete_timeout>                (repr of a float)
    finish  <finish_window>
    linger  <reporter_linger>
    journal <journal_socket>
    logfile <log_file>
    name    <invoked name> <runtime>      (one per [runtimes] entry)
    settings <the parsed file as JSON>    (when it fits and JSON carries it)
    end

``timeout`` to ``linger`` are what the launcher's start-up admission of a delete
needs (launcher/runc-guard.c: its slots, its step-aside and its helpers); ``journal``
and ``logfile`` stay in the format (the launcher checks they are there; the
step-aside's entry is sent by Python). Like the routing they are the file's own
values, never RUNC_GUARD_*.

``settings`` is the Python side's cache of the parsed file (``cached_settings``):
importing ``tomllib`` costs ~10-15 ms, more than a bare interpreter start, so every
Python process whose file has not changed reads it from here, bound to the same
identity as the routing; the launcher skips the line. JSON (``cjson``, ASCII only:
no tab, newline or NUL) carries every TOML value but dates and times: a file with
one, or too large for the launcher's buffer with it, is cached without the line
and parsed again each time, as before.

The launcher trusts it only when it and its directory belong to the euid and
nobody else may write them, and ``file`` is the settings file's identity now.
Stdlib only (the shim's hot path imports it).
"""

from __future__ import annotations

import os

from runc_guard.atomic import read_trusted, write_atomic

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

HEADER = "runc-guard-routes 2"
#: The launcher before its start-up admission wrote this; still a last good routing.
OLD_HEADERS = ("runc-guard-routes 1",)
#: The launcher's buffer (MAX_ROUTES) and name table (MAX_NAMES): a bigger routing is not cached.
MAX_BYTES = 65536
MAX_NAMES = 256
_FORBIDDEN = ("\t", "\n", "\0")
#: The settings the launcher's start-up admission of a delete reads, in the file's order.
ADMISSION_KEYS = ("delete_timeout", "finish_window", "reporter_linger", "journal_socket", "log_file")
_ADMISSION_LINES = dict(
    zip(ADMISSION_KEYS, ("timeout", "finish", "linger", "journal", "logfile"), strict=True)
)


def routes_file(state_dir: str, config: str) -> str:
    """``<state_dir>/routes<config with / as %>``: the name the launcher builds too."""
    return os.path.join(state_dir, "routes" + config.replace("/", "%"))


def render(
    config: str,
    key: tuple[int, ...],
    runtime: str,
    runtimes: Mapping[str, str],
    pending_dir: str,
    debug: bool,
    admission: Mapping[str, object],
    settings: Mapping[str, object] | None = None,
) -> bytes | None:
    """The file's bytes, or None when the launcher could not hold or parse this routing.

    ``settings``: the parsed settings file, cached for the Python side when it can be.
    """
    values = {k: admission[k] for k in ADMISSION_KEYS}  # KeyError: a caller's bug, not a node's
    words = [config, runtime, pending_dir, *(str(v) for v in values.values()), *runtimes, *runtimes.values()]
    if len(runtimes) > MAX_NAMES or any(not w or any(c in w for c in _FORBIDDEN) for w in words):
        return None
    lines = [
        HEADER,
        f"config\t{config}",
        "file\t" + " ".join(str(k) for k in key),
        f"runtime\t{runtime}",
        f"pending\t{pending_dir}",
        f"debug\t{1 if debug else 0}",
        *(f"{_ADMISSION_LINES[k]}\t{value}" for k, value in values.items()),
        *(f"name\t{name}\t{target}" for name, target in sorted(runtimes.items())),
    ]
    blob = ("\n".join([*lines, "end"]) + "\n").encode("utf-8", "surrogateescape")
    if len(blob) >= MAX_BYTES:
        return None
    from runc_guard import cjson  # ~0.3 ms (_json): only where a settings file exists

    try:
        parsed = cjson.dumps(settings) if settings is not None else None
    except (TypeError, ValueError, RecursionError):  # TOML dates and times; arrays nested ~1000 deep
        parsed = None
    if parsed is None:
        return blob
    cached = ("\n".join([*lines, f"settings\t{parsed}", "end"]) + "\n").encode("utf-8", "surrogateescape")
    return cached if len(cached) < MAX_BYTES else blob


def cached_settings(state_dir: str, config: str, key: tuple[int, ...]) -> dict[str, object] | None:
    """The parsed settings file cached with its routing, when the file's identity is still ``key``."""
    blob = read_trusted(routes_file(state_dir, config), MAX_BYTES)
    if blob is None:
        return None
    lines = blob.decode("utf-8", "surrogateescape").split("\n")
    identity = "file\t" + " ".join(str(k) for k in key)
    if lines[:3] != [HEADER, f"config\t{config}", identity] or lines[-2:] != ["end", ""]:
        return None
    kind, _, parsed = lines[-3].partition("\t")
    if kind != "settings":
        return None
    from runc_guard import cjson

    try:
        data = cjson.loads(parsed)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def last_good(state_dir: str, config: str) -> dict[str, object] | None:
    """``runtime``/``runtimes`` of the last version of ``config`` that parsed, whatever its identity.

    Any format version: a node upgraded with a broken file still routes by the copy the
    earlier launcher's runc-guard wrote.
    """
    blob = read_trusted(routes_file(state_dir, config), MAX_BYTES)
    if blob is None:
        return None
    lines = blob.decode("utf-8", "surrogateescape").split("\n")
    if lines[0] not in (HEADER, *OLD_HEADERS) or lines[1:2] != [f"config\t{config}"]:
        return None
    if lines[-2:] != ["end", ""]:
        return None
    runtime = ""
    table: dict[str, str] = {}
    for line in lines[2:-2]:
        kind, _, rest = line.partition("\t")
        if kind == "runtime":
            runtime = rest
        elif kind == "name":
            name, _, target = rest.partition("\t")
            if not name or not target:
                return None
            table[name] = target
    if not runtime:
        return None
    return {"runtime": runtime, "runtimes": table}


def keep(state_dir: str, config: str, blob: bytes) -> None:
    """Replace the routing cache with ``blob`` unless it already holds it (best effort).

    fsync'd: this copy is what routes the node after a reboot with a broken file.
    Only into a directory that is ours and writable by nobody else, as the launcher checks.
    """
    path = routes_file(state_dir, config)
    if read_trusted(path, MAX_BYTES) == blob:
        return
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        st = os.lstat(state_dir)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return
        write_atomic(path, blob, 0o600, durable=True, dir_mode=0o700)
    except OSError:
        pass
