"""Decide whether the cgroup paths runc recorded are safe to wait on, signal and remove.

runc-guard runs as root and sends SIGKILL, so a corrupt or tampered state.json
must not aim it at anything but the container's own cgroups. A path is accepted
only if it is absolute and normalised, has no symlink in it, lies on a cgroup
filesystem by statfs magic (not by name), is strictly below a cgroup mount
point, is not a pod- or QoS-level cgroup, and has the same position in every
hierarchy (runc places one container at one relative path everywhere).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from runc_guard.cgroupfs import CGROUP_MAGICS, CgroupFsOps
from runc_guard.errors import UnsafeCgroupPath
from runc_guard.state import ContainerState

#: Final components that belong to kubelet's pod and QoS levels, never to a container.
_KUBELET_LEVEL = re.compile(
    r"^(kubepods(\.slice)?|burstable|besteffort|guaranteed|"
    r"kubepods-.*\.slice|pod[0-9a-fA-F_-]{8,}(\.slice)?)$"
)


def _mount_of(path: str, mounts: Mapping[str, str]) -> str | None:
    """The longest cgroup mount point that ``path`` lies strictly below."""
    best = None
    for mount_point in mounts:
        prefix = mount_point.rstrip("/") + "/"
        if path.startswith(prefix) and (best is None or len(mount_point) > len(best)):
            best = mount_point
    return best


def check_path(path: str, fs: CgroupFsOps, mounts: Mapping[str, str]) -> str:
    """Return the path relative to its cgroup mount, or raise UnsafeCgroupPath."""
    if "\0" in path or not path.startswith("/"):
        raise UnsafeCgroupPath(path, "not an absolute path")
    if os.path.normpath(path) != path or "/./" in path + "/" or "/../" in path + "/":
        raise UnsafeCgroupPath(path, "not a normalised path (., .. or //)")
    mount_point = _mount_of(path, mounts)
    if mount_point is None:
        raise UnsafeCgroupPath(path, "not below any cgroup mount point")
    relative = path[len(mount_point.rstrip("/")) :]
    if _KUBELET_LEVEL.match(os.path.basename(path)):
        raise UnsafeCgroupPath(path, "a pod- or QoS-level cgroup, owned by kubelet")
    # No symlink anywhere: every component, from / down, is checked with lstat.
    current = ""
    deepest_existing = "/"
    for part in path.strip("/").split("/"):
        current += "/" + part
        if not fs.exists(current):
            break
        if fs.is_symlink(current):
            raise UnsafeCgroupPath(path, f"{current} is a symlink")
        deepest_existing = current
    # statfs of the path itself, or of its deepest existing ancestor if runc already
    # removed it; that ancestor must still be on the cgroup filesystem below the mount.
    probe = path if deepest_existing == path else deepest_existing
    if not probe.startswith(mount_point.rstrip("/") + "/") and probe != mount_point:
        raise UnsafeCgroupPath(path, f"{probe} is not inside cgroup mount {mount_point}")
    try:
        magic = fs.fs_magic(probe)
    except OSError as exc:
        raise UnsafeCgroupPath(path, f"statfs failed: {exc.strerror}") from None
    if magic not in CGROUP_MAGICS:
        raise UnsafeCgroupPath(path, f"not on a cgroup filesystem (statfs magic {magic:#x})")
    return relative


def check_container_paths(state: ContainerState, fs: CgroupFsOps, mounts: Mapping[str, str]) -> list[str]:
    """The container's distinct cgroup directories, all proven safe; raise on the first bad one."""
    relatives: dict[str, str] = {}
    for path in state.cgroup_paths.values():
        relatives[path] = check_path(path, fs, mounts)
    distinct = set(relatives.values())
    if len(distinct) > 1:
        shown = ", ".join(sorted(distinct))
        raise UnsafeCgroupPath(
            sorted(relatives)[0], f"hierarchies disagree on the container's cgroup ({shown})"
        )
    if state.cgroups_path.startswith("/") and distinct:
        expected = os.path.normpath(state.cgroups_path)
        (actual,) = distinct
        if actual != expected:
            raise UnsafeCgroupPath(sorted(relatives)[0], f"not the configured cgroupsPath {expected}")
    return sorted(relatives)
