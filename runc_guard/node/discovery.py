"""Find container-level cgroups under kubepods, in every hierarchy, plus the shim's pending records.

Read-only. A container is one unit across hierarchies: its 64-hex id appears in
one directory per hierarchy, either bare (kubelet's cgroupfs driver:
``kubepods/burstable/pod<uid>/<id>``) or inside a systemd scope name
(``kubepods.slice/.../cri-containerd-<id>.scope``, ``docker-<id>.scope``,
``crio-<id>.scope``). Only such names are ever collected: pod- and QoS-level
directories are walked through, never returned, and the walk does not enter a
container directory (its children belong to the unit). Pending records name
their own paths, so each one is checked with :func:`paths.check_path` before
it may join a unit.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from runc_guard.delete.cgroupfs import CgroupFsOps
from runc_guard.delete.paths import check_path, container_id_of, crun_leaf_scope
from runc_guard.delete.pending import RecordRule, UntrustedRecord, iter_records
from runc_guard.errors import NoCgroupHierarchy, UnsafeCgroupPath
from runc_guard.node.orphans import ORPHAN, StateFacts, judge
from runc_guard.settings import Settings

#: Where kubelet puts pods at the top of each hierarchy, per cgroup driver.
DEFAULT_KUBEPODS = ("kubepods", "kubepods.slice")
#: kubepods/<qos>/pod<uid>/<container> is 3 levels; the systemd driver has the
#: same depth. 6 leaves room for nesting (kind, nested kubelets) and bounds the walk.
MAX_DEPTH = 6

_POD = re.compile(r"pod([0-9a-fA-F_-]{8,})(?:\.slice)?$")


def pod_uid_of(pod: str) -> str | None:
    """The pod UID in a pod-level path (systemd escapes ``-`` as ``_``), else None."""
    match = _POD.search(pod.rsplit("/", 1)[-1])
    return match.group(1).replace("_", "-") if match else None


def check_kubepods_name(name: str) -> str:
    """A ``--kubepods`` value must be a plain relative path inside a hierarchy."""
    normal = os.path.normpath(name)
    if (
        not name
        or name.startswith("/")
        or "\0" in name
        or normal != name.rstrip("/")
        or normal.startswith("..")
        or "/../" in f"/{normal}/"
    ):
        raise ValueError(f"{name!r} is not a relative path below a hierarchy (like kubepods.slice)")
    return normal


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy (a v1 controller, name=systemd, or cgroup2)."""

    mount: str
    fstype: str


def hierarchies_below(cgroup_root: str, mounts: Mapping[str, str]) -> list[Hierarchy]:
    """Cgroup mounts at or below ``cgroup_root``; raise NoCgroupHierarchy when there are none."""
    root = os.path.normpath(cgroup_root)
    found = [
        Hierarchy(mount, fstype)
        for mount, fstype in sorted(mounts.items())
        if mount == root or mount.startswith(root.rstrip("/") + "/")
    ]
    if not found:
        raise NoCgroupHierarchy(f"no cgroup filesystem is mounted at or below {root}")
    return found


@dataclass
class ContainerUnit:
    """One container's cgroup directories across hierarchies, and its pending record if any."""

    container_id: str
    #: Absolute container-level directories, one per hierarchy where it exists.
    dirs: list[str] = field(default_factory=list)
    #: The parent's path inside its hierarchy (``kubepods/burstable/pod<uid>``).
    pod: str = ""
    #: The shim's pending record for this container and the runtime root it names.
    record: str | None = None
    runtime_root: str | None = None
    #: The runtime the pending record names (re-runs of its delete use it).
    runtime: str | None = None
    #: Why a pending record cannot be acted on (an unsafe path): the unit is kept.
    unsafe: str | None = None


@dataclass
class Discovery:
    """Everything found: units by container id, plus records that could not be read."""

    hierarchies: list[Hierarchy]
    units: dict[str, ContainerUnit] = field(default_factory=dict)
    #: Pending record path -> why it was not used (malformed, unsafe path).
    record_errors: dict[str, str] = field(default_factory=dict)
    #: Pending record path -> (container id, created time) for every record read.
    records: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: One look at every runtime state directory (when orphans are judged).
    states: list[StateFacts] = field(default_factory=list)
    #: Orphaned state directory -> why its cgroups cannot be acted on (an unsafe path).
    state_errors: dict[str, str] = field(default_factory=dict)


def _walk_kubepods(top: str, fs: CgroupFsOps) -> Iterable[tuple[str, str]]:
    """(container id, directory) for each container cgroup below ``top``; never enters one."""
    stack = [(top, 0)]
    while stack:
        path, depth = stack.pop()
        for child in fs.children(path):
            cid = container_id_of(os.path.basename(child))
            if cid is not None:
                yield cid, child
            elif depth < MAX_DEPTH:
                stack.append((child, depth + 1))


def discover_kubepods(
    hierarchies: Iterable[Hierarchy], kubepods: Iterable[str], fs: CgroupFsOps
) -> dict[str, ContainerUnit]:
    """Container units below each ``<hierarchy>/<kubepods name>``, grouped by container id."""
    units: dict[str, ContainerUnit] = {}
    names = [check_kubepods_name(n) for n in kubepods]
    for hierarchy in hierarchies:
        for name in names:
            top = os.path.join(hierarchy.mount, name)
            if fs.is_symlink(top) or not fs.exists(top):
                continue
            for cid, path in _walk_kubepods(top, fs):
                unit = units.get(cid)
                if unit is None:
                    pod = os.path.relpath(os.path.dirname(path), hierarchy.mount)
                    unit = units[cid] = ContainerUnit(cid, pod=pod)
                unit.dirs.append(path)
    for unit in units.values():
        unit.dirs.sort()
    return units


def _record_path_ok(container_id: str, path: str) -> bool:
    """A recorded cgroup must be named after its container (bare id or ``<prefix>-<id>.scope``)."""
    name = os.path.basename(path)
    return name == container_id or (name.endswith(f"-{container_id}.scope"))


def _pod_of(cgroup_paths: Iterable[str], mounts: Mapping[str, str]) -> str:
    """The parent of a container's first cgroup, relative to its hierarchy (its pod, under kubelet)."""
    first = next(iter(sorted(cgroup_paths)), "")
    parent = os.path.dirname(first) if first else ""
    mount = max((m for m in mounts if parent.startswith(m.rstrip("/") + "/")), key=len, default="")
    return os.path.relpath(parent, mount) if mount else parent


def add_orphans(
    discovery: Discovery,
    states: Iterable[StateFacts],
    now: float,
    min_age: float,
    fs: CgroupFsOps,
    mounts: Mapping[str, str],
) -> None:
    """Join every orphaned runtime state to its container's unit, with the cgroups it names.

    A container whose cgroups lie outside the kubepods trees (or are already
    gone) becomes a unit of its own, so the sweep re-drives its delete too. The
    paths come from the state file: each is checked like a pending record's.
    """
    for facts in states:
        discovery.states.append(facts)
        if judge(facts, now, min_age) != ORPHAN:
            continue
        cid = facts.state.container_id
        inside = [p for p in facts.cgroup_paths if any(p.startswith(m.rstrip("/") + "/") for m in mounts)]
        unsafe: str | None = None
        scopes: set[str] = set()
        for path in inside:
            # crun's systemd driver: ``<prefix>-<id>.scope/container``, the scope named after the id
            scope = crun_leaf_scope(path, cid) if facts.kind == "crun" else None
            try:
                check_path(path, fs, mounts)
                if scope is not None:
                    check_path(scope, fs, mounts)
            except UnsafeCgroupPath as exc:
                unsafe = str(exc)
                break
            if scope is not None:
                scopes.add(scope)
            elif not _record_path_ok(cid, path):
                unsafe = f"refusing cgroup path {path!r}: not named after container {cid}"
                break
        unit = discovery.units.get(cid)
        if unit is None:
            # crun's leaf sits in its scope: the pod is the scope's parent, as for runc's scope
            unit = discovery.units[cid] = ContainerUnit(cid, pod=_pod_of(sorted(scopes) or inside, mounts))
        if unit.runtime_root is None:
            unit.runtime_root = facts.state.root
        if unsafe is not None:
            discovery.state_errors[facts.state.path] = unsafe
            unit.unsafe = unsafe
            continue
        unit.dirs = sorted(set(unit.dirs) | set(inside) | scopes)


def add_pending(discovery: Discovery, pending_dir: str, rule: RecordRule) -> None:
    """Merge the shim's pending records into ``discovery.units``: each under the one trust rule
    (pending.RecordRule); one that fails it is an error, and the unit it names is kept unsafe."""
    for record_file, record in iter_records(pending_dir, rule):
        if isinstance(record, ValueError):
            discovery.record_errors[record_file] = str(record)
            cid = record.container_id if isinstance(record, UntrustedRecord) else None
            if cid is not None:
                discovery.units.setdefault(cid, ContainerUnit(cid)).unsafe = str(record)
            continue
        discovery.records[record_file] = (record.container_id, record.created)
        cid = record.container_id
        unit = discovery.units.get(cid)
        if unit is None:
            unit = discovery.units[cid] = ContainerUnit(cid, pod=_pod_of(record.cgroup_paths, rule.mounts))
        unit.record = record_file
        unit.runtime_root = record.runtime_root
        unit.runtime = record.runtime
        if unit.unsafe is None:
            unit.dirs = sorted(set(unit.dirs) | set(record.cgroup_paths))


def discover(
    cgroup_root: str,
    kubepods: Iterable[str],
    pending_dir: str | None,
    fs: CgroupFsOps,
    mounts: Mapping[str, str],
    states: tuple[Iterable[StateFacts], float, float] | None = None,
    settings: Settings | None = None,
) -> Discovery:
    """Every container unit below ``cgroup_root``'s kubepods trees, in ``pending_dir``, and orphaned.

    ``states`` is (every runtime state looked at, now, min_age) when orphaned
    runtime state is to be found; None leaves runtime state out of discovery. ``settings``:
    whose routing a record's runtime must match (pending.RecordRule; the defaults when None).
    """
    hierarchies = hierarchies_below(cgroup_root, mounts)
    discovery = Discovery(hierarchies, discover_kubepods(hierarchies, kubepods, fs))
    usable = {h.mount: h.fstype for h in hierarchies}
    if pending_dir is not None:
        add_pending(discovery, pending_dir, RecordRule.of(settings or Settings(), fs, usable))
    if states is not None:
        looked, now, min_age = states
        add_orphans(discovery, looked, now, min_age, fs, usable)
    return discovery
