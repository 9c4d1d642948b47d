"""Read what the runtime recorded about a container: runc's ``state.json`` or crun's ``status``.

runc keeps ``<root>/<id>/state.json`` with an absolute cgroup path per hierarchy.
crun keeps ``<root>/<id>/status`` with one ``cgroup-path`` relative to every
cgroup mount (it places a container at the same place in each hierarchy it
uses), its init ``pid`` and ``process-start-time``, and with its systemd driver
the ``scope`` unit it made (crun 1.28 ``status.c``). Both files are untrusted
input: parsed with a size cap and every field type-checked here; whether the
cgroup paths are safe to act on is decided separately (``paths``).
"""

from __future__ import annotations

import errno
import os

from runc_guard import cjson
from runc_guard.errors import StateMissing, StateUnreadable
from runc_guard.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

#: runc's state.json is ~10-40 KiB (it embeds the OCI-derived config).
MAX_STATE_BYTES = 8 << 20

#: How the container's PID namespace relates to the host (``ContainerState.pid_namespace``).
#: runc's destroy() SIGKILLs every process of the cgroup itself only for ``host`` and
#: ``joined`` (signalAllProcesses); in a ``private`` namespace the kernel kills them
#: when init dies. ``unknown``: the state does not say (crun's status file).
PID_HOST, PID_JOINED, PID_PRIVATE, PID_UNKNOWN = "host", "joined", "private", "unknown"

#: Which runtime's file a state was read from (``ContainerState.kind``).
KIND_RUNC, KIND_CRUN = "runc", "crun"

#: containerd's CRI annotations, which runc keeps as ``key=value`` labels in its config.
SANDBOX_ID_LABEL = "io.kubernetes.cri.sandbox-id"
CONTAINER_TYPE_LABEL = "io.kubernetes.cri.container-type"


class ContainerState(Value):
    """The parts of runc's state that runc-guard needs after runc has deleted it."""

    __slots__ = (
        "cgroup_paths",
        "cgroups_path",
        "container_id",
        "created",
        "init_pid",
        "init_start",
        "kind",
        "labels",
        "pid_namespace",
        "scope_prefix",
        "systemd",
        "systemd_name",
    )
    container_id: str
    cgroup_paths: dict[str, str]
    init_pid: int
    init_start: int
    #: ``config.cgroups.path`` (cgroupfs driver, absolute) or "" when not given.
    cgroups_path: str
    systemd_name: str
    #: One of PID_HOST, PID_JOINED, PID_PRIVATE, PID_UNKNOWN.
    pid_namespace: str
    #: Wall-clock ``created`` of the state (seconds since the epoch), 0 when absent.
    created: float
    #: ``config.labels`` as a dict: the bundle and the OCI annotations (CRI sandbox id ...).
    labels: Mapping[str, str]
    #: ``config.cgroups.Systemd``: runc used the systemd cgroup driver for this container.
    systemd: bool
    #: ``config.cgroups.scope_prefix`` (systemd driver), e.g. ``cri-containerd``.
    scope_prefix: str
    #: KIND_RUNC (``state.json``) or KIND_CRUN (``status``): whose layout the cgroup paths follow.
    kind: str

    def __init__(
        self,
        container_id: str,
        cgroup_paths: dict[str, str],
        init_pid: int,
        init_start: int,
        cgroups_path: str = "",
        systemd_name: str = "",
        pid_namespace: str = PID_UNKNOWN,
        created: float = 0.0,
        labels: Mapping[str, str] | None = None,
        systemd: bool = False,
        scope_prefix: str = "",
        kind: str = KIND_RUNC,
    ) -> None:
        labels = {} if labels is None else labels
        self._init(locals())

    @property
    def sandbox_id(self) -> str:
        """The CRI pod sandbox this container belongs to ("" outside CRI)."""
        return self.labels.get(SANDBOX_ID_LABEL, "")

    @property
    def is_sandbox(self) -> bool:
        return self.labels.get(CONTAINER_TYPE_LABEL) == "sandbox" and self.sandbox_id == self.container_id


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


def _json_object(raw: bytes, path: str) -> dict[str, object]:
    try:
        return cjson.loads_object(raw)
    except ValueError as exc:
        raise StateUnreadable(f"{path}: {exc}") from None


def parse_state(raw: bytes, container_id: str, path: str = "state.json") -> ContainerState:
    """Validate runc's state JSON; raise StateUnreadable naming the first problem."""
    doc = _json_object(raw, path)
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
    config = doc.get("config")
    config = config if isinstance(config, dict) else {}
    cgroups = config.get("cgroups")
    cgroups = cgroups if isinstance(cgroups, dict) else {}
    return ContainerState(
        container_id=container_id,
        cgroup_paths={k: v for k, v in paths.items() if v},
        init_pid=pid,
        init_start=start,
        cgroups_path=_str(cgroups.get("path")),
        systemd_name=_str(cgroups.get("name")),
        pid_namespace=_pid_namespace(config.get("namespaces")),
        created=_timestamp(doc.get("created")),
        labels=_labels(config.get("labels")),
        systemd=cgroups.get("Systemd") is True,
        scope_prefix=_str(cgroups.get("scope_prefix")),
    )


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _pid_namespace(namespaces: object) -> str:
    """``config.namespaces``: NEWPID absent -> host; with a path -> joined; else private."""
    if not isinstance(namespaces, list):
        return PID_UNKNOWN
    for ns in namespaces:
        if isinstance(ns, dict) and ns.get("type") == "NEWPID":
            return PID_JOINED if ns.get("path") else PID_PRIVATE
    return PID_HOST


def _labels(labels: object) -> dict[str, str]:
    """runc stores ``bundle=<dir>`` and every OCI annotation as ``key=value`` strings."""
    out: dict[str, str] = {}
    if isinstance(labels, list):
        for item in labels:
            if isinstance(item, str) and "=" in item:
                key, value = item.split("=", 1)
                out[key] = value
    return out


def _timestamp(value: object) -> float:
    """RFC 3339 with nanoseconds (Go's time.Time JSON) -> epoch seconds; 0.0 when unusable.

    By hand rather than ``datetime`` (~1 ms of every delete's start-up): the
    format is fixed, ``2026-11-30T10:00:00.123456789Z`` or with ``+hh:mm``.
    """
    if not isinstance(value, str) or len(value) < 20 or value[4::3][:5] != "--T::":
        return 0.0
    try:
        fields = [int(value[a:b]) for a, b in ((0, 4), (5, 7), (8, 10), (11, 13), (14, 16), (17, 19))]
        rest = value[19:]
        fraction = 0.0
        if rest.startswith("."):
            digits = len(rest) - len(rest[1:].lstrip("0123456789")) - 1
            fraction = float(rest[: digits + 1]) if digits else 0.0
            rest = rest[digits + 1 :]
        if rest == "Z":
            offset = 0
        elif len(rest) == 6 and rest[0] in "+-" and rest[3] == ":":
            offset = (int(rest[1:3]) * 3600 + int(rest[4:6]) * 60) * (1 if rest[0] == "+" else -1)
        else:
            return 0.0
    except ValueError:
        return 0.0
    year, month, day, hour, minute, second = fields
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        return 0.0
    days = _days_from_civil(year, month, day)
    return days * 86400 + hour * 3600 + minute * 60 + second - offset + fraction


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month - 3 if month > 2 else month + 9) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def crun_status_file(root: str, container_id: str) -> str:
    return os.path.join(root, container_id, "status")


def parse_crun_status(
    raw: bytes, container_id: str, mounts: Mapping[str, str], path: str = "status"
) -> ContainerState:
    """crun's status: the relative ``cgroup-path`` joined to every cgroup mount point.

    With the systemd driver (``systemd-cgroup``) its ``scope`` is the unit crun made,
    e.g. ``cri-containerd-<id>.scope``: kept as ``systemd_name`` without its suffix
    (and no ``scope_prefix``), so that ``unit_name.scope_unit_name`` names it as it
    names runc's. Whether that unit and the cgroup-path are the container's own is
    decided separately (``paths``).
    """
    doc = _json_object(raw, path)
    relative = doc.get("cgroup-path")
    pid = doc.get("pid")
    start = doc.get("process-start-time", 0)
    if not isinstance(relative, str) or not relative.startswith("/") or relative == "/":
        raise StateUnreadable(f"{path}: cgroup-path must be a cgroup below the root, got {relative!r}")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid < 0:
        raise StateUnreadable(f"{path}: pid must be a pid, got {pid!r}")
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise StateUnreadable(f"{path}: process-start-time must be clock ticks, got {start!r}")
    systemd = doc.get("systemd-cgroup") is True
    scope = _str(doc.get("scope")) if systemd else ""
    return ContainerState(
        container_id=container_id,
        cgroup_paths={mount: mount.rstrip("/") + relative for mount in sorted(mounts)},
        init_pid=pid,
        init_start=start,
        cgroups_path=relative,
        created=_timestamp(doc.get("created")),
        # crun writes the bundle into its status (runc into its labels): who still holds the container
        labels={"bundle": bundle} if isinstance(bundle := doc.get("bundle"), str) and bundle else None,
        systemd=systemd,
        systemd_name=scope[: -len(".scope")] if scope.endswith(".scope") else "",
        kind=KIND_CRUN,
    )


def _with_oci_config(state: ContainerState, path: str) -> ContainerState:
    """crun keeps the container's OCI config.json beside its status: the PID namespace and
    the annotations (CRI sandbox id) come from there. Unreadable: the state as it was."""
    try:
        raw = _read(path)
        doc = _json_object(raw, path) if raw is not None else {}
    except StateUnreadable:
        return state
    linux = doc.get("linux")
    namespaces = linux.get("namespaces") if isinstance(linux, dict) else None
    pid_namespace = state.pid_namespace
    if isinstance(namespaces, list):
        pid_namespace = PID_HOST
        for ns in namespaces:
            if isinstance(ns, dict) and ns.get("type") == "pid":
                pid_namespace = PID_JOINED if ns.get("path") else PID_PRIVATE
    annotations = doc.get("annotations")
    labels = dict(state.labels)
    if isinstance(annotations, dict):
        labels.update({k: v for k, v in annotations.items() if isinstance(k, str) and isinstance(v, str)})
    return state.replace(pid_namespace=pid_namespace, labels=labels)


def runtime_state_exists(root: str, container_id: str) -> bool:
    """Whether the runtime (runc or crun) still has state for the container."""
    return os.path.exists(state_file(root, container_id)) or os.path.exists(
        crun_status_file(root, container_id)
    )


def _read(path: str) -> bytes | None:
    """The file's bytes; None when it does not exist; StateUnreadable when it cannot be read."""
    try:
        return _read_capped(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateUnreadable(f"{path} is a symlink: not following it") from None
        raise StateUnreadable(f"cannot read {path}: {exc.strerror}") from None


def read_state(
    root: str, container_id: str, mounts: Callable[[], Mapping[str, str]] | None = None
) -> ContainerState:
    """Read and validate the runtime's state for ``container_id`` under ``root``.

    runc's state.json first; crun's status when ``mounts`` (the cgroup mount
    points, needed to place crun's relative path) is given.
    """
    path = state_file(root, container_id)
    raw = _read(path)
    if raw is not None:
        return parse_state(raw, container_id, path)
    if mounts is not None:
        crun_path = crun_status_file(root, container_id)
        raw = _read(crun_path)
        if raw is not None:
            state = parse_crun_status(raw, container_id, mounts(), crun_path)
            return _with_oci_config(state, os.path.join(root, container_id, "config.json"))
    raise StateMissing(f"no runtime state at {path}")
