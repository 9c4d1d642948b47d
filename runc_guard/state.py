"""Read what runc recorded about a container in ``<root>/<id>/state.json``.

The file is untrusted input: it is parsed with a size cap and every field is
type-checked here; whether the cgroup paths are safe to act on is decided
separately (``cgroups.check_container_paths``).
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass, field

from runc_guard.errors import StateUnreadable

#: runc's state.json is ~10-40 KiB (it embeds the OCI-derived config).
MAX_STATE_BYTES = 8 << 20


@dataclass(frozen=True)
class ContainerState:
    """The parts of runc's state that runc-guard needs after runc has deleted it."""

    container_id: str
    cgroup_paths: dict[str, str]
    init_pid: int
    init_start: int
    #: ``config.cgroups.path`` (cgroupfs driver, absolute) or "" when not given.
    cgroups_path: str = ""
    systemd_name: str = field(default="")


def state_file(root: str, container_id: str) -> str:
    """``<root>/<id>/state.json``; ``container_id`` must already be valid (argv.valid_container_id)."""
    return os.path.join(root, container_id, "state.json")


def _read_capped(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if (st.st_mode & 0o170000) != 0o100000:
            raise StateUnreadable(f"{path} is not a regular file")
        if st.st_size > MAX_STATE_BYTES:
            raise StateUnreadable(f"{path} is {st.st_size} bytes, over the {MAX_STATE_BYTES} cap")
        chunks = []
        remaining = MAX_STATE_BYTES + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > MAX_STATE_BYTES:
            raise StateUnreadable(f"{path} grew past the {MAX_STATE_BYTES} byte cap")
        return data
    finally:
        os.close(fd)


def parse_state(raw: bytes, container_id: str, path: str = "state.json") -> ContainerState:
    """Validate runc's state JSON; raise StateUnreadable naming the first problem."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise StateUnreadable(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise StateUnreadable(f"{path}: expected a JSON object")
    if doc.get("id") != container_id:
        raise StateUnreadable(f"{path}: id {doc.get('id')!r} is not {container_id!r}")
    paths = doc.get("cgroup_paths")
    if not isinstance(paths, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in paths.items()
    ):
        raise StateUnreadable(f"{path}: cgroup_paths must map hierarchy names to paths")
    pid = doc.get("init_process_pid")
    start = doc.get("init_process_start", 0)
    if isinstance(pid, bool) or not isinstance(pid, int) or pid < 0:
        raise StateUnreadable(f"{path}: init_process_pid must be a pid, got {pid!r}")
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise StateUnreadable(f"{path}: init_process_start must be clock ticks, got {start!r}")
    cgroups_path = ""
    systemd_name = ""
    config = doc.get("config")
    cgroups = config.get("cgroups") if isinstance(config, dict) else None
    if isinstance(cgroups, dict):
        if isinstance(cgroups.get("path"), str):
            cgroups_path = cgroups["path"]
        if isinstance(cgroups.get("name"), str):
            systemd_name = cgroups["name"]
    return ContainerState(
        container_id=container_id,
        cgroup_paths={k: v for k, v in paths.items() if v},
        init_pid=pid,
        init_start=start,
        cgroups_path=cgroups_path,
        systemd_name=systemd_name,
    )


def read_state(root: str, container_id: str) -> ContainerState:
    """Read and validate runc's state for ``container_id`` under ``root``."""
    path = state_file(root, container_id)
    try:
        raw = _read_capped(path)
    except FileNotFoundError:
        raise StateUnreadable(f"no runtime state at {path}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateUnreadable(f"{path} is a symlink: not following it") from None
        raise StateUnreadable(f"cannot read {path}: {exc.strerror}") from None
    return parse_state(raw, container_id, path)
