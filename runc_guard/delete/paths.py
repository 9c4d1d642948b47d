"""Decide whether the cgroup paths a runtime recorded are the container's own to act on.

runc-guard runs as root and sends SIGKILL, so a corrupt or tampered state.json
must not aim it at anything but the container's own cgroups. Two levels:

* **Tampering** (``check_path``): a path must be absolute and normalised, have
  no symlink in it, lie on a cgroup filesystem by statfs magic (not by name) and
  strictly below a cgroup mount point. A path that fails this is refused: not
  even the runtime runs, since it would act on whatever the state names.
* **Ownership** (``ownership_problem``): runc-guard's *own* kills and rmdirs
  touch a directory only if its leaf names the container, it is not a pod, QoS
  or slice level, and it did not exist before the container's init started. A
  path that fails this is legitimate for the runtime (runc puts a container
  without cgroupsPath under its caller's cgroup, a cgroupsPath may name a
  shared cgroup): runc-guard steps aside and lets the runtime act alone.

One leaf is not named after the container and is still its own: crun's systemd
driver runs the container's processes in a ``container`` child of the scope it
made (``<prefix>-<id>.scope/container``; :func:`crun_leaf_scope`). Then both
directories, leaf first, are the container's, under every rule above.
"""

from __future__ import annotations

import os

from runc_guard.delete.cgroupfs import CGROUP_MAGICS, CgroupFsOps
from runc_guard.delete.state import KIND_CRUN, ContainerState
from runc_guard.delete.unit_name import valid_unit_name
from runc_guard.errors import UnsafeCgroupPath
from runc_guard.procinfo import start_wall_time
from runc_guard.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Sequence

#: Final components that belong to kubelet's pod and QoS levels, never to a container
#: (also ``kubepods-*.slice`` and ``pod<uid>[.slice]``, see :func:`_is_kubelet_level`).
_KUBELET_LEVELS = frozenset({"kubepods", "kubepods.slice", "burstable", "besteffort", "guaranteed"})
_HEX = frozenset("0123456789abcdef")
_UID_CHARS = frozenset("0123456789abcdefABCDEF_-")


def _is_kubelet_level(name: str) -> bool:
    """A kubelet pod or QoS level name. Plain string tests: ``re`` costs ~2 ms of every start.

    Like the regular expression it replaces (``tests/test_paths_names.py`` compares
    them), a name with one trailing newline still counts: this only ever makes the
    delete step aside.
    """
    if name.endswith("\n"):
        name = name[:-1]
    if "\n" in name:
        return False
    if name in _KUBELET_LEVELS or (name.startswith("kubepods-") and name.endswith(".slice")):
        return True
    uid = name[3:-6] if name.endswith(".slice") else name[3:]
    return name.startswith("pod") and len(uid) >= 8 and _UID_CHARS.issuperset(uid)


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
    while True:
        if not probe.startswith(mount_point.rstrip("/") + "/") and probe != mount_point:
            raise UnsafeCgroupPath(path, f"{probe} is not inside cgroup mount {mount_point}")
        try:
            magic = fs.fs_magic(probe)
            break
        except FileNotFoundError:
            # Removed since the walk saw it (a concurrent delete of the same id, the runtime):
            # its parent, already checked above, answers for it. Not tampering.
            probe = os.path.dirname(probe)
        except OSError as exc:
            raise UnsafeCgroupPath(path, f"statfs failed: {exc.strerror}") from None
    if magic not in CGROUP_MAGICS:
        raise UnsafeCgroupPath(path, f"not on a cgroup filesystem (statfs magic {magic:#x})")
    return relative


#: kubelet's container cgroups: the 64-hex id, bare (cgroupfs driver) or in a scope
#: (systemd driver: ``cri-containerd-<id>.scope``, ``docker-``, ``crio-``).
_SCOPE_PREFIXES = ("cri-containerd-", "docker-", "crio-")


def _is_id(name: str) -> bool:
    return len(name) == 64 and _HEX.issuperset(name)


#: A directory modified this long before the container's init started is taken to
#: have existed before the container (clock ticks, wall-clock steps, scheduling).
CREATED_MARGIN = 1.0


def init_started_wall(state: ContainerState) -> tuple[float | None, float | None]:
    """When the container's init started on the wall clock that stamped its cgroups, and the
    forward clock step that bounded it (None: no step seen).

    The start time is in ticks since boot; turning it into wall-clock time with
    today's boot time is wrong by every wall-clock step since (chrony's makestep,
    a resumed VM). runc stamps ``created`` after the init started and its
    cgroups were made, so an estimate later than ``created`` can only be such
    a forward step: then ``created`` bounds it. A backward step only makes the
    check more lenient.
    """
    if not state.init_start:
        return None, None
    estimate = start_wall_time(state.init_start)
    if state.created > 0 and estimate > state.created:
        step = estimate - state.created
        return state.created, (round(step, 3) if step > CREATED_MARGIN else None)
    return estimate, None


class Ownership(Value):
    """The container's cgroup directories and whether runc-guard may act on them.

    ``step_aside`` names why not (runc-guard then runs the runtime's delete
    unchanged and kills or removes nothing itself); None when every directory
    is provably the container's own.
    """

    __slots__ = ("paths", "step_aside")
    paths: list[str]
    step_aside: str | None

    def __init__(self, paths: list[str], step_aside: str | None = None) -> None:
        self._init(locals())


def container_id_of(name: str) -> str | None:
    """The container id a directory name stands for, or None if it is not a container cgroup."""
    if _is_id(name):
        return name
    if name.endswith(".scope"):
        for prefix in _SCOPE_PREFIXES:
            if name.startswith(prefix) and _is_id(name[len(prefix) : -len(".scope")]):
                return name[len(prefix) : -len(".scope")]
    return None



def names_container(name: str, container_id: str, patterns: Sequence[str] = ()) -> bool:
    """The leaf is named after the container: the id, ``<prefix>-<id>.scope``, or a pattern.

    ``patterns`` are fnmatch patterns with ``{id}`` for the container id
    (settings ``container_cgroup_patterns``), for runtimes that name cgroups otherwise.
    """
    if name == container_id:
        return True
    scope = f"-{container_id}.scope"
    if name.endswith(scope) and len(name) > len(scope):
        return True
    if not patterns:
        return False
    import fnmatch  # only with patterns configured: it loads re

    return any(fnmatch.fnmatchcase(name, p.replace("{id}", container_id)) for p in patterns)


#: The child of its scope that crun's systemd driver runs a container's processes in: the
#: default of the ``run.oci.systemd.subgroup`` annotation (crun 1.28 ``cgroup-systemd.c``
#: ``find_systemd_subgroup``, appended by ``systemd_finalize``), so that on cgroup v2 the
#: scope holds no process and can delegate controllers. Any other subgroup is not trusted.
CRUN_SUBGROUP = "container"


def crun_leaf_scope(path: str, container_id: str) -> str | None:
    """The scope directory of crun's systemd leaf ``<parent>/<prefix>-<id>.scope/container``.

    None for any other shape: another leaf name, a scope named after another id
    or after none (``<id>.scope``, ``-<id>.scope``), a name systemd would not take
    for a unit. The prefix is what ``names_container`` accepts for runc's scopes.
    """
    scope, leaf = os.path.split(path)
    if leaf != CRUN_SUBGROUP:
        return None
    name = os.path.basename(scope)
    suffix = f"-{container_id}.scope"
    if len(name) <= len(suffix) or not name.endswith(suffix) or not valid_unit_name(name):
        return None
    return scope


def ownership_problem(
    path: str,
    container_id: str,
    fs: CgroupFsOps,
    not_before: float | None,
    patterns: Sequence[str] = (),
    scopes: Collection[str] = (),
) -> str | None:
    """Why ``path`` (already proven on cgroupfs) is not the container's own cgroup, or None.

    ``scopes``: the container's own scope directories beside ``path`` (crun's systemd
    driver): crun's ``container`` leaf inside one of them is named by its scope.
    """
    name = os.path.basename(path)
    if _is_kubelet_level(name) or name.endswith(".slice"):
        return f"{path} is a pod, QoS or slice level cgroup, not a container's"
    named = names_container(name, container_id, patterns)
    if not named and (scope := crun_leaf_scope(path, container_id)) is not None:
        named = scope in scopes
    if not named:
        return f"{path} is not named after container {container_id}"
    if not_before is not None:
        mtime = fs.modified_at(path)
        if mtime is not None and mtime < not_before - CREATED_MARGIN:
            return f"{path} existed before the container was started (shared with something else)"
    return None


def crun_scope_problem(leaf: str, scope: str, state: ContainerState, fs: CgroupFsOps) -> str | None:
    """Why crun's leaf and its scope are not the container's alone, beyond the naming rules, or None.

    crun's status must name that scope as its unit (what crun's own delete stops), the
    scope may hold nothing but the leaf, and the leaf no cgroup of its own: a subtree
    crun's driver does not make here is left to crun (its delete removes subtrees itself).
    """
    unit = f"{state.systemd_name}.scope" if state.systemd_name else ""
    if unit != os.path.basename(scope):
        return f"crun's status names unit {unit or 'none'!r}, not the scope {scope} its cgroup-path is in"
    others = [c for c in fs.children(scope) if c != leaf]
    if others:
        return f"{scope} holds {others[0]} beside crun's {CRUN_SUBGROUP} leaf (not the container's alone)"
    below = fs.children(leaf)
    if below:
        return f"{leaf} has child cgroups ({below[0]}): crun's systemd leaf has none of its own"
    return None


def check_container_paths(
    state: ContainerState,
    fs: CgroupFsOps,
    mounts: Mapping[str, str],
    not_before: float | None = None,
    patterns: Sequence[str] = (),
) -> Ownership:
    """The container's distinct cgroup directories and whether they are provably its own.

    Raises UnsafeCgroupPath for a path that escapes the cgroup filesystems
    (tampering): then not even the runtime may run. Everything else that fails a
    rule (named after something else, a pod/QoS/slice level, older than the
    container's init, not the configured cgroupsPath) only makes runc-guard step
    aside. ``not_before`` is the wall-clock start of the container's init.

    A crun state with the systemd driver whose path is ``<prefix>-<id>.scope/container``
    yields the leaf and then its scope (leaf first: the order of removal), each
    held to every rule, plus :func:`crun_scope_problem`.
    """
    relatives: dict[str, str] = {}
    for path in state.cgroup_paths.values():
        relatives[path] = check_path(path, fs, mounts)
    crun_systemd = state.kind == KIND_CRUN and state.systemd
    scopes: dict[str, str] = {}  # crun's leaf -> its scope
    paths: list[str] = []
    for path in sorted(relatives):
        scope = crun_leaf_scope(path, state.container_id) if crun_systemd else None
        if scope is not None and relatives[path].count("/") < 2:
            scope = None  # the "scope" would be the mount point itself: not a container's
        if scope is not None:
            scopes[path] = scope
        paths.extend((path,) if scope is None else (path, scope))
    if state.cgroups_path.startswith("/") and not state.systemd:
        expected = os.path.normpath(state.cgroups_path)
        for path, relative in sorted(relatives.items()):
            if relative != expected:
                return Ownership(paths, f"{path} is not the configured cgroupsPath {expected}")
    for leaf, scope in scopes.items():
        problem = crun_scope_problem(leaf, scope, state, fs)
        if problem is not None:
            return Ownership(paths, problem)
    for path in paths:
        problem = ownership_problem(path, state.container_id, fs, not_before, patterns, scopes.values())
        if problem is not None:
            return Ownership(paths, problem)
    return Ownership(paths)
