"""A container's systemd scope unit: find it in runc's state, ask systemd about it, stop it, reset it.

With the systemd cgroup driver (``runc --systemd-cgroup``, containerd's
``SystemdCgroup = true``) the container's cgroups belong to a transient scope
unit that runc asked systemd to create (``<scope_prefix>-<name>.scope``, e.g.
``cri-containerd-<id>.scope`` in ``kubepods-burstable-pod<uid>.slice``).
systemd owns the unit: when its processes outlive the stop timeout the unit
turns ``failed`` and stays loaded, holding its cgroups, until someone runs
``reset-failed``. Removing those directories behind systemd's back would leave
a unit that names cgroups that are gone; so runc-guard goes *through* systemd:
stop the unit (systemd kills what is left in it), wait until its cgroups are
empty, ``reset-failed`` it (systemd then garbage-collects the unit and removes
the cgroups it manages), and only then remove what systemd leaves behind in
the cgroup v1 controllers it does not manage (freezer, cpuset, ... created by
runc itself).

Facts relied on (read in runc's state.json, measured in integration/systemd_lab):

- runc 1.1.5 and 1.3.4 write ``config.cgroups`` with ``name``, ``parent``,
  ``scope_prefix`` and ``"Systemd": true`` (Go field without a JSON tag): the
  state itself says the systemd driver made the cgroups. That matters because
  containerd's dead-shim cleanup runs ``runc delete --force <id>`` *without*
  ``--systemd-cgroup``: the flag on the command line cannot be trusted.
- runc names the unit ``<scope_prefix>-<name>.scope``, or ``<name>.scope``
  without a prefix; a ``name`` ending in ``.slice`` means runc made a slice, which
  runc-guard never stops (it is a pod-level object).

Split as the house style asks: the pure parts (:func:`scope_from_state`,
:func:`parse_show`, :func:`decide`) are tested exhaustively; the calls to
``systemctl`` are thin, each bounded by a deadline, and each a no-op with the
outcome ``no_systemd`` where no systemd is reachable (a cgroupfs node, a
container without PID 1 systemd).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from runc_guard.delete.unit_name import scope_unit_name, valid_unit_name

#: sd_booted(3): the directory systemd creates at boot; absent means no systemd is PID 1.
SYSTEMD_RUNTIME_DIR = "/run/systemd/system"
#: Where systemd's cgroups are mounted; ControlGroup paths are relative to each hierarchy here.
SYSTEM_CGROUP_ROOT = "/sys/fs/cgroup"
#: One systemctl call never gets more than this, whatever the caller's deadline.
CALL_CAP_S = 5.0
#: State.json is small; a file past this is not runc's.
MAX_STATE_BYTES = 8 << 20
SHOW_PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "ControlGroup")

# Outcomes: fixed strings for the canonical log line and the journal.
NO_SYSTEMD = "no_systemd"
NOT_LOADED = "not_loaded"
STOPPED = "stopped"
RESET_FAILED = "reset_failed"
#: An active unit settle was told not to stop (``stop_active=False``): left as it is.
LEFT_ACTIVE = "left_active"
STILL_BUSY = "still_busy"
ERROR = "error"


@dataclass(frozen=True)
class ScopeRef:
    """The scope unit of one container, as runc's state names it."""

    unit: str
    #: The parent slice runc put the scope in ("" means runc's default, system.slice).
    slice: str
    #: Whether the state says runc used the systemd driver (``config.cgroups.Systemd``).
    systemd_driver: bool


@dataclass(frozen=True)
class UnitStatus:
    """What ``systemctl show`` says about a unit (properties as systemd spells them)."""

    unit: str
    load_state: str
    active_state: str
    sub_state: str
    result: str
    control_group: str

    @property
    def loaded(self) -> bool:
        # A transient scope that systemd garbage-collected is "not-found".
        return self.load_state not in ("", "not-found")


@dataclass(frozen=True)
class ScopeResult:
    """The outcome of one operation on a scope unit, for the canonical log line."""

    unit: str
    outcome: str
    detail: str = ""
    #: The unit's state after the operation (None when systemd was not asked).
    status: UnitStatus | None = None
    waited_ms: int = 0

    def as_dict(self) -> dict[str, object]:
        entry: dict[str, object] = {"unit": self.unit, "outcome": self.outcome, "waited_ms": self.waited_ms}
        if self.detail:
            entry["detail"] = self.detail
        if self.status is not None:
            entry["active_state"] = self.status.active_state
            entry["sub_state"] = self.status.sub_state
            entry["result"] = self.status.result
        return entry


# -- pure: naming -------------------------------------------------------------------


def scope_from_state(doc: Mapping[str, object]) -> ScopeRef | None:
    """The scope unit recorded in a parsed runc state.json, or None (cgroupfs driver, slice, junk)."""
    config = doc.get("config")
    cgroups = config.get("cgroups") if isinstance(config, Mapping) else None
    if not isinstance(cgroups, Mapping):
        return None
    name = cgroups.get("name")
    prefix = cgroups.get("scope_prefix", "")
    parent = cgroups.get("parent", "")
    systemd = cgroups.get("Systemd", False)
    if not isinstance(name, str) or not isinstance(prefix, str) or not isinstance(parent, str):
        return None
    # The cgroupfs driver fills ``path`` and leaves ``name`` empty; a systemd
    # state has ``name`` and (runc >= 1.0) ``"Systemd": true``.
    if systemd is not True:
        return None
    unit = scope_unit_name(name, prefix)
    if unit is None or (parent and not (parent.endswith(".slice") and valid_unit_name(parent))):
        return None
    return ScopeRef(unit=unit, slice=parent, systemd_driver=True)


def read_scope(root: str, container_id: str) -> ScopeRef | None:
    """The scope named by ``<root>/<id>/state.json``; None when absent, unreadable or not systemd."""
    path = os.path.join(root, container_id, "state.json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, MAX_STATE_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > MAX_STATE_BYTES:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return scope_from_state(doc) if isinstance(doc, dict) else None


def unit_of_cgroup_dir(path: str) -> str | None:
    """``cri-containerd-<id>.scope`` for a cgroup directory named like a scope, else None."""
    name = os.path.basename(path.rstrip("/"))
    return name if name.endswith(".scope") and valid_unit_name(name) else None


def parse_show(unit: str, text: str) -> UnitStatus:
    """``systemctl show --property=...`` output (``Key=value`` lines) as a UnitStatus."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    return UnitStatus(
        unit=unit,
        load_state=props.get("LoadState", ""),
        active_state=props.get("ActiveState", ""),
        sub_state=props.get("SubState", ""),
        result=props.get("Result", ""),
        control_group=props.get("ControlGroup", ""),
    )


# -- pure: what to do ---------------------------------------------------------------

#: Actions :func:`decide` can return.
NOTHING, STOP, WAIT, RESET = "nothing", "stop", "wait", "reset_failed"


def decide(status: UnitStatus, cgroups_empty: bool, stop_active: bool = True) -> str:
    """The next step for a scope after its container is gone.

    - not loaded / inactive: systemd is done with it; nothing to do;
    - active (``running``, ``abandoned``, ``start-*``): ask systemd to stop it,
      which kills what is left in the scope (scopes default to KillMode=control-group);
      without ``stop_active``, leave it: a stop job is systemd's promise to end in
      ``failed`` (Result=timeout) when a process outlives TimeoutStopSec, and an
      active unit after the runtime's own delete is not ours to stop;
    - deactivating (a stop job runs, SIGTERM/SIGKILL sent): wait;
    - failed: ``reset-failed`` once the cgroups are empty (systemd then
      collects the unit and removes the cgroups it manages); while a process is
      still dying in them, wait, or the reset only turns into a new failure.
    """
    if not status.loaded or status.active_state == "inactive":
        return NOTHING
    if status.active_state == "failed":
        return RESET if cgroups_empty else WAIT
    if status.active_state == "deactivating":
        return WAIT
    return STOP if stop_active else NOTHING


# -- systemd, over systemctl (D-Bus to PID 1's private socket as root) ----------------


def systemd_reachable() -> bool:
    """sd_booted(3) and a systemctl to talk to it."""
    return os.path.isdir(SYSTEMD_RUNTIME_DIR) and shutil.which("systemctl") is not None


def _remaining(deadline: float) -> float:
    return deadline - time.monotonic()


def _systemctl(args: list[str], deadline: float) -> subprocess.CompletedProcess[str]:
    """One bounded systemctl call; TimeoutExpired when the deadline passes first."""
    timeout = min(CALL_CAP_S, max(0.05, _remaining(deadline)))
    return subprocess.run(
        ["systemctl", "--no-pager", "--no-ask-password", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
        env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "LC_ALL": "C"},
    )


def query(unit: str, deadline: float) -> ScopeResult:
    """Ask systemd for the unit's state; outcome ``not_loaded`` when it has no such unit."""
    if not systemd_reachable():
        return ScopeResult(unit, NO_SYSTEMD, "no systemd is PID 1 here")
    if not valid_unit_name(unit):
        return ScopeResult(unit, ERROR, "not a valid scope unit name")
    props = ",".join(SHOW_PROPERTIES)
    try:
        proc = _systemctl(["show", f"--property={props}", "--", unit], deadline)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ScopeResult(unit, ERROR, f"systemctl show: {exc}")
    if proc.returncode != 0:
        return ScopeResult(unit, ERROR, f"systemctl show: {proc.stderr.strip()[:300]}")
    status = parse_show(unit, proc.stdout)
    return ScopeResult(unit, status.active_state if status.loaded else NOT_LOADED, status=status)


def stop(unit: str, deadline: float) -> ScopeResult:
    """Queue a stop job for the unit and return at once (``--no-block``): systemd kills its processes."""
    if not systemd_reachable():
        return ScopeResult(unit, NO_SYSTEMD, "no systemd is PID 1 here")
    try:
        proc = _systemctl(["stop", "--no-block", "--", unit], deadline)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ScopeResult(unit, ERROR, f"systemctl stop: {exc}")
    if proc.returncode != 0:
        return ScopeResult(unit, ERROR, f"systemctl stop: {proc.stderr.strip()[:300]}")
    return ScopeResult(unit, STOPPED)


def reset_failed(unit: str, deadline: float) -> ScopeResult:
    """``systemctl reset-failed``: systemd forgets the failure and garbage-collects the unit."""
    if not systemd_reachable():
        return ScopeResult(unit, NO_SYSTEMD, "no systemd is PID 1 here")
    try:
        proc = _systemctl(["reset-failed", "--", unit], deadline)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ScopeResult(unit, ERROR, f"systemctl reset-failed: {exc}")
    # A unit collected meanwhile is "not loaded": the goal is reached either way.
    if proc.returncode != 0 and "not loaded" not in proc.stderr:
        return ScopeResult(unit, ERROR, f"systemctl reset-failed: {proc.stderr.strip()[:300]}")
    return ScopeResult(unit, RESET_FAILED)


def settle(
    unit: str,
    cgroups_empty: Callable[[], bool],
    deadline: float,
    poll_interval: float = 0.05,
    *,
    stop_active: bool = True,
) -> ScopeResult:
    """Bring the scope to "gone" through systemd before the deadline: stop, wait, reset-failed.

    Returns ``no_systemd`` (nothing was asked), ``not_loaded`` (nothing to do),
    ``stopped``/``reset_failed`` (the unit is gone now), ``left_active`` (active,
    and ``stop_active`` is off: see :func:`decide`) or ``still_busy`` (the
    deadline passed while a process was still dying in the scope: keep the
    pending record; the retry or the sweep finishes it).
    """
    started = time.monotonic()
    stop_sent = False
    acted = ""
    while True:
        if _remaining(deadline) <= 0:
            status_now = query(unit, time.monotonic() + poll_interval).status
            waited = int((time.monotonic() - started) * 1000)
            return ScopeResult(unit, STILL_BUSY, "deadline passed", status_now, waited)
        current = query(unit, deadline)
        waited = int((time.monotonic() - started) * 1000)
        if current.outcome in (NO_SYSTEMD, ERROR):
            return ScopeResult(unit, current.outcome, current.detail, current.status, waited)
        status = current.status
        assert status is not None
        action = decide(status, cgroups_empty(), stop_active)
        if action == NOTHING:
            left = LEFT_ACTIVE if status.loaded and status.active_state not in ("inactive", "failed") else ""
            return ScopeResult(unit, acted or left or NOT_LOADED, status=status, waited_ms=waited)
        if action == STOP and not stop_sent:
            result = stop(unit, deadline)
            if result.outcome != STOPPED:
                return ScopeResult(unit, result.outcome, result.detail, status, waited)
            stop_sent, acted = True, STOPPED
            continue
        if action == RESET:
            result = reset_failed(unit, deadline)
            if result.outcome != RESET_FAILED:
                return ScopeResult(unit, result.outcome, result.detail, status, waited)
            acted = RESET_FAILED
            continue
        if _remaining(deadline) <= poll_interval:
            return ScopeResult(unit, STILL_BUSY, f"unit is {status.active_state}", status, waited)
        time.sleep(poll_interval)


# -- the sweep: failed scope units whose container is gone ------------------------------


def parse_unit_list(text: str) -> list[str]:
    """Unit names from ``systemctl list-units --plain --no-legend`` (first column; a "●" may lead)."""
    units = []
    for line in text.splitlines():
        fields = line.replace("\u25cf", " ").replace("*", " ").split()
        if fields and valid_unit_name(fields[0]):
            units.append(fields[0])
    return units


def failed_scopes(deadline: float) -> ScopeListing:
    """Every loaded scope unit systemd holds as ``failed``."""
    if not systemd_reachable():
        return ScopeListing(NO_SYSTEMD, [])
    try:
        proc = _systemctl(
            ["list-units", "--type=scope", "--state=failed", "--all", "--plain", "--no-legend", "--full"],
            deadline,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ScopeListing(ERROR, [], f"systemctl list-units: {exc}")
    if proc.returncode != 0:
        return ScopeListing(ERROR, [], f"systemctl list-units: {proc.stderr.strip()[:300]}")
    return ScopeListing("listed", parse_unit_list(proc.stdout))


@dataclass(frozen=True)
class ScopeListing:
    outcome: str
    units: list[str]
    detail: str = ""


def container_id_of_unit(unit: str) -> str | None:
    """The container id a ``cri-containerd-``/``docker-``/``crio-<64 hex>.scope`` unit names."""
    from runc_guard.delete.paths import container_id_of

    return container_id_of(unit)


def orphan_verdict(container_id: str | None, has_state: bool, has_bundle: bool, populated: bool) -> str:
    """Whether a failed scope may be reset: only a container's, gone from runc and containerd, empty.

    Returns ``reset`` or the reason to keep it (the sweep's own vocabulary).
    """
    if container_id is None:
        return "not_a_container"
    if populated:
        return "populated"
    if has_state:
        return "runtime_state"
    if has_bundle:
        return "bundle"
    return "reset"


def release_failed_scopes(
    has_state: Callable[[str], bool],
    has_bundle: Callable[[str], bool],
    mounts: list[str],
    read_procs: Callable[[str], list[int]],
    dry_run: bool = False,
    budget: float = 10.0,
) -> list[dict[str, object]]:
    """``reset-failed`` every failed container scope whose cgroups are empty and whose container is gone.

    A failed scope stays loaded forever (and holds its name, so a container
    with the same id could not start): nothing else on the node resets it.
    Returns one sweep-report entry per failed container scope (action
    ``scope_reset_failed``, ``would_reset_failed`` or ``kept:<reason>``), plus one
    ``error`` entry when systemd could not be asked; [] without systemd.
    """
    # systemd's units name cgroups of the real hierarchies: a sweep pointed at
    # another tree (a test's, a chroot's) must never reset this node's units.
    if not any(m == SYSTEM_CGROUP_ROOT or m.startswith(SYSTEM_CGROUP_ROOT + "/") for m in mounts):
        return []
    deadline = time.monotonic() + budget
    listing = failed_scopes(deadline)
    if listing.outcome == NO_SYSTEMD:
        return []
    if listing.outcome == ERROR:
        return [{"id": "", "pod": "", "dirs": 0, "action": "error", "unit": "", "detail": listing.detail}]
    entries: list[dict[str, object]] = []
    for unit in listing.units:
        cid = container_id_of_unit(unit)
        if cid is None:
            continue  # not a container's scope: none of our business
        status = query(unit, deadline).status
        group = status.control_group if status is not None else ""
        populated = bool(group) and any(
            read_procs(os.path.join(mount, group.lstrip("/"))) for mount in mounts
        )
        verdict = orphan_verdict(cid, has_state(cid), has_bundle(cid), populated)
        entry: dict[str, object] = {"id": cid, "pod": "", "dirs": 0, "unit": unit}
        if verdict != "reset":
            entry["action"] = f"kept:{verdict}"
        elif dry_run:
            entry["action"] = "would_reset_failed"
        else:
            result = reset_failed(unit, deadline)
            entry["action"] = "scope_reset_failed" if result.outcome == RESET_FAILED else "error"
            if result.detail:
                entry["detail"] = result.detail
        entries.append(entry)
    return entries


# -- which driver --------------------------------------------------------------------

SYSTEMD_DRIVER, CGROUPFS_DRIVER = "systemd", "cgroupfs"


def driver_of_state(doc: Mapping[str, object]) -> str | None:
    """``systemd`` or ``cgroupfs``: the cgroup driver a runc state.json says made the cgroups."""
    config = doc.get("config")
    cgroups = config.get("cgroups") if isinstance(config, Mapping) else None
    if not isinstance(cgroups, Mapping):
        return None
    return SYSTEMD_DRIVER if cgroups.get("Systemd") is True else CGROUPFS_DRIVER


def drivers_in_use(runtime_root: str) -> dict[str, list[str]]:
    """Container ids per cgroup driver, from every ``<root>/<namespace>/<id>/state.json``."""
    found: dict[str, list[str]] = {}
    try:
        namespaces = sorted(os.listdir(runtime_root))
    except OSError:
        return found
    for namespace in namespaces:
        try:
            ids = sorted(os.listdir(os.path.join(runtime_root, namespace)))
        except OSError:
            continue
        for cid in ids:
            path = os.path.join(runtime_root, namespace, cid, "state.json")
            try:
                with open(path, "rb") as f:
                    doc = json.loads(f.read(MAX_STATE_BYTES + 1))
            except (OSError, ValueError, RecursionError):
                continue
            driver = driver_of_state(doc) if isinstance(doc, dict) else None
            if driver is not None:
                found.setdefault(driver, []).append(f"{namespace}/{cid}")
    return found
