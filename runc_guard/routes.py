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

    runc-guard-routes 1
    config  <settings file path>
    file    <dev> <ino> <size> <mtime_ns> <ctime_ns>
    runtime <runtime>
    pending <pending_dir>
    debug   0|1
    name    <invoked name> <runtime>      (one per [runtimes] entry)
    end

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

HEADER = "runc-guard-routes 1"
#: The launcher's buffer (MAX_ROUTES) and name table (MAX_NAMES): a bigger routing is not cached.
MAX_BYTES = 65536
MAX_NAMES = 256
_FORBIDDEN = ("\t", "\n", "\0")


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
) -> bytes | None:
    """The file's bytes, or None when the launcher could not hold or parse this routing."""
    words = [config, runtime, pending_dir, *runtimes, *runtimes.values()]
    if len(runtimes) > MAX_NAMES or any(not w or any(c in w for c in _FORBIDDEN) for w in words):
        return None
    lines = [
        HEADER,
        f"config\t{config}",
        "file\t" + " ".join(str(k) for k in key),
        f"runtime\t{runtime}",
        f"pending\t{pending_dir}",
        f"debug\t{1 if debug else 0}",
        *(f"name\t{name}\t{target}" for name, target in sorted(runtimes.items())),
        "end",
    ]
    blob = ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")
    return blob if len(blob) < MAX_BYTES else None


def last_good(state_dir: str, config: str) -> dict[str, object] | None:
    """``runtime``/``runtimes`` of the last version of ``config`` that parsed, whatever its identity."""
    blob = read_trusted(routes_file(state_dir, config), MAX_BYTES)
    if blob is None:
        return None
    lines = blob.decode("utf-8", "surrogateescape").split("\n")
    if len(lines) < 8 or lines[0] != HEADER or lines[1] != f"config\t{config}" or lines[-2:] != ["end", ""]:
        return None
    runtime = lines[3].partition("\t")
    if runtime[0] != "runtime" or not runtime[2]:
        return None
    table: dict[str, str] = {}
    for line in lines[6:-2]:
        kind, _, rest = line.partition("\t")
        name, _, target = rest.partition("\t")
        if kind != "name" or not name or not target:
            return None
        table[name] = target
    return {"runtime": runtime[2], "runtimes": table}


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
