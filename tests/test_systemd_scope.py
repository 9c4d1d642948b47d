"""The scope unit of a systemd-driver container: naming from runc's state, decisions, bounded calls."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from runc_guard.delete import systemd_scope as ss

ID = "0123456789abcdef" * 4
MEM = "/sys/fs/cgroup/memory"
POD = "kubepods-burstable-pod8f1c3c1e_7a4e_4a43_9a3d_1f0f0f0f0f0f.slice"

#: config.cgroups as runc 1.1.5 writes it for ``--systemd-cgroup`` and cgroupsPath
#: ``<pod slice>:cri-containerd:<id>`` (captured in integration/systemd_lab).
RUNC_115_SYSTEMD = {
    "name": ID,
    "parent": POD,
    "path": "",
    "scope_prefix": "cri-containerd",
    "cpu_shares": 1024,
    "Systemd": True,
    "Rootless": False,
}
#: The cgroupfs driver: ``path`` set, no name, ``"Systemd": false``.
RUNC_CGROUPFS = {"path": f"/kubepods/burstable/pod1/{ID}", "scope_prefix": "", "Systemd": False}


def state(cgroups: object) -> dict[str, Any]:
    return {"id": ID, "config": {"cgroups": cgroups}, "cgroup_paths": {}}


# -- naming ---------------------------------------------------------------------


def test_scope_from_runc_115_systemd_state() -> None:
    """runc's systemd state names ``<scope_prefix>-<name>.scope`` in the pod slice."""
    ref = ss.scope_from_state(state(RUNC_115_SYSTEMD))
    assert ref == ss.ScopeRef(unit=f"cri-containerd-{ID}.scope", slice=POD, systemd_driver=True)


def test_cgroupfs_state_has_no_scope() -> None:
    """A cgroupfs-driver container has no unit: nothing to ask systemd."""
    assert ss.scope_from_state(state(RUNC_CGROUPFS)) is None


@pytest.mark.parametrize(
    ("cgroups", "expected"),
    [
        ({**RUNC_115_SYSTEMD, "scope_prefix": ""}, f"{ID}.scope"),
        ({**RUNC_115_SYSTEMD, "scope_prefix": "docker"}, f"docker-{ID}.scope"),
        ({**RUNC_115_SYSTEMD, "parent": ""}, f"cri-containerd-{ID}.scope"),
        # runc makes a slice when the name is one: pod-level, never ours to stop.
        ({**RUNC_115_SYSTEMD, "name": "kubepods-pod1.slice"}, None),
        ({**RUNC_115_SYSTEMD, "Systemd": False}, None),
        ({**RUNC_115_SYSTEMD, "Systemd": "true"}, None),
        ({k: v for k, v in RUNC_115_SYSTEMD.items() if k != "Systemd"}, None),
        ({**RUNC_115_SYSTEMD, "name": ""}, None),
        ({**RUNC_115_SYSTEMD, "name": 5}, None),
        ({**RUNC_115_SYSTEMD, "name": "../../etc"}, None),
        ({**RUNC_115_SYSTEMD, "name": "a/b"}, None),
        ({**RUNC_115_SYSTEMD, "name": "x" * 300}, None),
        ({**RUNC_115_SYSTEMD, "parent": "not-a-slice"}, None),
        ({**RUNC_115_SYSTEMD, "parent": "../x.slice"}, None),
        ({**RUNC_115_SYSTEMD, "name": "a b"}, None),
    ],
)
def test_scope_naming_table(cgroups: dict[str, object], expected: str | None) -> None:
    """Only a well-formed systemd-driver state yields a scope unit; anything odd yields none."""
    ref = ss.scope_from_state(state(cgroups))
    assert (ref.unit if ref else None) == expected


@pytest.mark.parametrize("doc", [{}, {"config": None}, {"config": {"cgroups": []}}, {"config": []}])
def test_scope_from_malformed_state(doc: dict[str, Any]) -> None:
    """A state without a cgroups object names no unit (and raises nothing)."""
    assert ss.scope_from_state(doc) is None


def test_read_scope_from_state_file(tmp_path: Any) -> None:
    """read_scope reads ``<root>/<id>/state.json``; a missing or broken file is None."""
    root = str(tmp_path)
    assert ss.read_scope(root, ID) is None
    os.makedirs(os.path.join(root, ID))
    path = os.path.join(root, ID, "state.json")
    with open(path, "w") as f:
        f.write("{not json")
    assert ss.read_scope(root, ID) is None
    with open(path, "w") as f:
        json.dump(state(RUNC_115_SYSTEMD), f)
    ref = ss.read_scope(root, ID)
    assert ref is not None and ref.unit == f"cri-containerd-{ID}.scope"
    os.unlink(path)
    os.symlink("/etc/hostname", path)
    assert ss.read_scope(root, ID) is None


@pytest.mark.parametrize(
    ("path", "unit"),
    [
        (
            f"/sys/fs/cgroup/memory/kubepods.slice/{POD}/cri-containerd-{ID}.scope",
            f"cri-containerd-{ID}.scope",
        ),
        (
            f"/sys/fs/cgroup/memory/kubepods.slice/{POD}/cri-containerd-{ID}.scope/",
            f"cri-containerd-{ID}.scope",
        ),
        (f"{MEM}/kubepods.slice/{POD}", None),
        (f"{MEM}/kubepods/burstable/pod1/{ID}", None),
    ],
)
def test_unit_of_cgroup_dir(path: str, unit: str | None) -> None:
    """A cgroup directory named like a scope is that scope's unit; a slice or bare id is not."""
    assert ss.unit_of_cgroup_dir(path) == unit


def test_parse_show() -> None:
    """systemctl show's Key=value lines become a UnitStatus; a collected unit is not loaded."""
    text = (
        "LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=timeout\n"
        "ControlGroup=/kubepods.slice/x\n"
    )
    status = ss.parse_show("u.scope", text)
    assert (status.load_state, status.active_state, status.sub_state, status.result) == (
        "loaded",
        "failed",
        "failed",
        "timeout",
    )
    assert status.loaded
    gone = ss.parse_show("u.scope", "LoadState=not-found\nActiveState=inactive\nSubState=dead\n")
    assert not gone.loaded


# -- decisions ------------------------------------------------------------------


def status(load: str = "loaded", active: str = "active", sub: str = "running") -> ss.UnitStatus:
    return ss.UnitStatus("u.scope", load, active, sub, "success", "/x")


@pytest.mark.parametrize(
    ("st", "empty", "action"),
    [
        (status("not-found", "inactive", "dead"), True, ss.NOTHING),
        (status("not-found", "inactive", "dead"), False, ss.NOTHING),
        (status(active="inactive", sub="dead"), True, ss.NOTHING),
        (status(), True, ss.STOP),
        (status(), False, ss.STOP),
        (status(sub="abandoned"), False, ss.STOP),
        (status(active="activating", sub="start"), False, ss.STOP),
        (status(active="deactivating", sub="stop-sigkill"), False, ss.WAIT),
        (status(active="deactivating", sub="stop-sigterm"), True, ss.WAIT),
        (status(active="failed", sub="failed"), False, ss.WAIT),
        (status(active="failed", sub="failed"), True, ss.RESET),
    ],
)
@pytest.mark.parametrize("stop_active", [True, False])
def test_decide(st: ss.UnitStatus, empty: bool, action: str, stop_active: bool) -> None:
    """Stop what is active, wait while systemd stops, reset a failed unit only once it is empty;
    ``stop_active=False`` (the delete, issue 30 case 10) never stops, leaving an active unit alone."""
    expected = ss.NOTHING if action == ss.STOP and not stop_active else action
    assert ss.decide(st, empty, stop_active) == expected


# -- the bounded calls, against a scripted systemd ---------------------------------


class FakeSystemd:
    """A scripted systemd for ``systemctl``: one unit whose state moves as a real scope's does."""

    def __init__(self, active: str = "active", sub: str = "running", stop_to: str = "inactive") -> None:
        self.active, self.sub = active, sub
        self.loaded = True
        self.stop_to = stop_to
        self.calls: list[list[str]] = []

    def __call__(self, args: list[str], deadline: float) -> subprocess.CompletedProcess[str]:
        self.calls.append(args)
        verb = args[0]
        if verb == "show":
            if not self.loaded:
                out = "LoadState=not-found\nActiveState=inactive\nSubState=dead\nResult=success\n"
            else:
                out = (
                    f"LoadState=loaded\nActiveState={self.active}\nSubState={self.sub}\n"
                    "Result=timeout\nControlGroup=/kubepods.slice/u.scope\n"
                )
            return subprocess.CompletedProcess(args, 0, out, "")
        if verb == "stop":
            if self.stop_to == "inactive":
                self.loaded = False  # a stopped transient scope is collected at once
            else:
                self.active, self.sub = self.stop_to, self.stop_to
            return subprocess.CompletedProcess(args, 0, "", "")
        if verb == "reset-failed":
            if not self.loaded:
                return subprocess.CompletedProcess(args, 1, "", "Unit u.scope not loaded.")
            self.loaded = False
            return subprocess.CompletedProcess(args, 0, "", "")
        raise AssertionError(args)

    def verbs(self) -> list[str]:
        return [c[0] for c in self.calls if c[0] != "show"]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeSystemd:
    systemd = FakeSystemd()
    monkeypatch.setattr(ss, "_systemctl", systemd)
    monkeypatch.setattr(ss, "systemd_reachable", lambda: True)
    return systemd


def soon(seconds: float = 2.0) -> float:
    return time.monotonic() + seconds


def test_no_systemd_is_a_clear_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without systemd every call returns ``no_systemd`` and runs nothing."""
    monkeypatch.setattr(ss, "systemd_reachable", lambda: False)

    def boom(args: list[str], deadline: float) -> subprocess.CompletedProcess[str]:
        raise AssertionError("systemctl must not run")

    monkeypatch.setattr(ss, "_systemctl", boom)
    for call in (ss.query, ss.stop, ss.reset_failed):
        assert call("u.scope", soon()).outcome == ss.NO_SYSTEMD
    assert ss.settle("u.scope", lambda: True, soon()).outcome == ss.NO_SYSTEMD


def test_settle_stops_an_active_scope(fake: FakeSystemd) -> None:
    """An active scope is stopped through systemd; a collected unit is the end."""
    result = ss.settle("u.scope", lambda: True, soon())
    assert result.outcome == ss.STOPPED
    assert fake.verbs() == ["stop"]


def test_settle_resets_a_failed_scope_once_empty(fake: FakeSystemd) -> None:
    """A failed scope whose cgroups are empty is reset-failed, never stopped again."""
    fake.active = fake.sub = "failed"
    result = ss.settle("u.scope", lambda: True, soon())
    assert result.outcome == ss.RESET_FAILED
    assert fake.verbs() == ["reset-failed"]


def test_settle_waits_for_the_cgroups_before_reset(fake: FakeSystemd) -> None:
    """reset-failed waits until the last process left the scope's cgroups."""
    fake.active = fake.sub = "failed"
    empty_at = time.monotonic() + 0.3
    result = ss.settle("u.scope", lambda: time.monotonic() >= empty_at, soon(), poll_interval=0.02)
    assert result.outcome == ss.RESET_FAILED
    assert result.waited_ms >= 250
    assert fake.verbs() == ["reset-failed"]


def test_settle_gives_up_at_the_deadline(fake: FakeSystemd) -> None:
    """Past the deadline with a process still dying: ``still_busy``, the unit left for the retry."""
    fake.stop_to = "failed"
    started = time.monotonic()
    result = ss.settle("u.scope", lambda: False, started + 0.3, poll_interval=0.02)
    assert result.outcome == ss.STILL_BUSY
    assert result.status is not None and result.status.active_state == "failed"
    assert fake.verbs() == ["stop"]
    assert time.monotonic() - started < 1.0


def test_settle_of_a_gone_unit_does_nothing(fake: FakeSystemd) -> None:
    """No unit (runc already stopped it, systemd collected it): ``not_loaded``, nothing sent."""
    fake.loaded = False
    assert ss.settle("u.scope", lambda: True, soon()).outcome == ss.NOT_LOADED
    assert fake.verbs() == []


def test_reset_failed_of_a_collected_unit_is_success(fake: FakeSystemd) -> None:
    """systemctl's "not loaded" after a race with systemd's GC still reaches the goal."""
    fake.loaded = False
    assert ss.reset_failed("u.scope", soon()).outcome == ss.RESET_FAILED


def test_errors_are_results(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing or hanging systemctl is an ``error`` result, never an exception."""
    monkeypatch.setattr(ss, "systemd_reachable", lambda: True)

    def hangs(args: list[str], deadline: float) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(["systemctl"], 0.1)

    monkeypatch.setattr(ss, "_systemctl", hangs)
    for call in (ss.query, ss.stop, ss.reset_failed):
        assert call("u.scope", soon()).outcome == ss.ERROR
    assert ss.settle("u.scope", lambda: True, soon()).outcome == ss.ERROR

    def fails(args: list[str], deadline: float) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 1, "", "Access denied")

    monkeypatch.setattr(ss, "_systemctl", fails)
    result = ss.stop("u.scope", soon())
    assert result.outcome == ss.ERROR and "Access denied" in result.detail


def test_invalid_unit_is_refused_before_systemctl(fake: FakeSystemd) -> None:
    """A unit name that is not a scope/slice name never reaches systemctl."""
    assert ss.query("../x", soon()).outcome == ss.ERROR
    assert fake.calls == []


@pytest.fixture
def hanging_systemctl(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A ``systemctl`` first on PATH that never answers (PID 1 wedged, D-Bus stuck): it notes
    its pid and ``exec``s a 120 s sleep, so the process runc-guard started is the one that hangs.
    Yields the file of pids; whatever is still running afterwards is killed by those pids."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    pids = tmp_path / "systemctl.pids"
    tool = bindir / "systemctl"
    tool.write_text(f'#!/bin/sh\necho $$ >> {pids}\nexec sleep 120\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    yield str(pids)
    for pid in _pids(str(pids)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _pids(path: str) -> list[int]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [int(line) for line in f if line.strip()]


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie has been killed; its parent reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_hanging_systemctl_is_cut_off_at_the_cap(
    hanging_systemctl: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A systemctl that never answers is killed at CALL_CAP_S even with a far deadline: the call
    raises TimeoutExpired, and the hung process is gone (not left running behind the delete)."""
    monkeypatch.setattr(ss, "CALL_CAP_S", 0.5)
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        ss._systemctl(["show", "--property=ActiveState", "--", "x.scope"], time.monotonic() + 3600)
    took = time.monotonic() - started
    (pid,) = _pids(hanging_systemctl)
    assert not _running(pid), "the hung systemctl outlived its call"
    # The alternative is the sleep's 120 s: a bound far from both it and the 0.5 s cap.
    assert took < 60, took


def test_hanging_systemctl_cannot_hold_the_scope_past_the_deadline(
    hanging_systemctl: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """settle() with a systemd that never answers: every call is cut off by the deadline (well
    under the cap), the result is ``error`` naming systemctl, and no systemctl is left running."""
    booted = tmp_path / "run-systemd-system"  # sd_booted(3): pretend systemd is PID 1
    booted.mkdir()
    monkeypatch.setattr(ss, "SYSTEMD_RUNTIME_DIR", str(booted))
    monkeypatch.setattr(ss, "CALL_CAP_S", 600.0)  # only the deadline may cut the calls off
    assert ss.systemd_reachable()
    started = time.monotonic()
    result = ss.settle("cri-containerd-x.scope", lambda: False, time.monotonic() + 1.0, 0.05)
    took = time.monotonic() - started
    assert result.outcome == ss.ERROR and "systemctl" in result.detail and "timed out" in result.detail
    pids = _pids(hanging_systemctl)
    assert pids, "settle never ran systemctl"
    assert not [p for p in pids if _running(p)]
    # Without the deadline's bound the first call would wait out the sleep's 120 s.
    assert took < 60, took


# -- the sweep's pass over failed scopes ----------------------------------------------

ID_GONE = "a" * 64
ID_STATE = "b" * 64
ID_BUNDLE = "c" * 64
ID_BUSY = "d" * 64
CGROOT = "/sys/fs/cgroup"
KP = "kubepods.slice"


class FailedScopes:
    """A scripted systemd holding some failed scope units (one not a container's)."""

    def __init__(self) -> None:
        self.failed = {f"cri-containerd-{i}.scope" for i in (ID_GONE, ID_STATE, ID_BUNDLE, ID_BUSY)}
        self.failed.add("session-4.scope")
        self.calls: list[list[str]] = []

    def __call__(self, args: list[str], deadline: float) -> subprocess.CompletedProcess[str]:
        self.calls.append(args)
        if args[0] == "list-units":
            out = "".join(
                f"\u25cf {u} loaded failed failed libcontainer container\n" for u in sorted(self.failed)
            )
            return subprocess.CompletedProcess(args, 0, out, "")
        if args[0] == "show":
            unit = args[-1]
            out = f"LoadState=loaded\nActiveState=failed\nSubState=failed\nControlGroup=/{KP}/{unit}\n"
            return subprocess.CompletedProcess(args, 0, out, "")
        if args[0] == "reset-failed":
            self.failed.discard(args[-1])
            return subprocess.CompletedProcess(args, 0, "", "")
        raise AssertionError(args)


@pytest.fixture
def failed(monkeypatch: pytest.MonkeyPatch) -> FailedScopes:
    systemd = FailedScopes()
    monkeypatch.setattr(ss, "_systemctl", systemd)
    monkeypatch.setattr(ss, "systemd_reachable", lambda: True)
    return systemd


def procs_of(path: str) -> list[int]:
    """cgroup.procs as the fake node has it: only ID_BUSY's scope holds a process."""
    return [4242] if path == f"{CGROOT}/memory/kubepods.slice/cri-containerd-{ID_BUSY}.scope" else []


def test_parse_unit_list() -> None:
    """Unit names from list-units, with or without the failed-unit bullet; junk skipped."""
    text = (
        "\u25cf cri-containerd-x.scope loaded failed failed d\n  ok.scope loaded failed failed d\nnonsense\n"
    )
    assert ss.parse_unit_list(text) == ["cri-containerd-x.scope", "ok.scope"]


@pytest.mark.parametrize(
    ("cid", "state", "bundle", "populated", "verdict"),
    [
        (None, False, False, False, "not_a_container"),
        ("x", False, False, True, "populated"),
        ("x", True, False, False, "runtime_state"),
        ("x", False, True, False, "bundle"),
        ("x", False, False, False, "reset"),
    ],
)
def test_orphan_verdict(cid: str | None, state: bool, bundle: bool, populated: bool, verdict: str) -> None:
    """Only an empty container scope that runc and containerd both forgot is reset."""
    assert ss.orphan_verdict(cid, state, bundle, populated) == verdict


def test_release_failed_scopes_resets_only_orphans(failed: FailedScopes) -> None:
    """The gone container's failed scope is reset; state, bundle, a process or a non-container keep theirs."""
    entries = ss.release_failed_scopes(
        lambda cid: cid == ID_STATE,
        lambda cid: cid == ID_BUNDLE,
        [f"{CGROOT}/memory", f"{CGROOT}/unified"],
        procs_of,
    )
    actions = {e["id"]: e["action"] for e in entries}
    assert actions == {
        ID_GONE: "scope_reset_failed",
        ID_STATE: "kept:runtime_state",
        ID_BUNDLE: "kept:bundle",
        ID_BUSY: "kept:populated",
    }
    assert failed.failed == {f"cri-containerd-{i}.scope" for i in (ID_STATE, ID_BUNDLE, ID_BUSY)} | {
        "session-4.scope"
    }


def test_release_failed_scopes_dry_run_resets_nothing(failed: FailedScopes) -> None:
    """--dry-run says what would be reset and sends no reset-failed."""
    entries = ss.release_failed_scopes(lambda c: False, lambda c: False, [f"{CGROOT}/memory"], procs_of, True)
    assert {e["id"]: e["action"] for e in entries}[ID_GONE] == "would_reset_failed"
    assert not [c for c in failed.calls if c[0] == "reset-failed"]


def test_release_failed_scopes_never_for_a_foreign_cgroup_tree(failed: FailedScopes) -> None:
    """A sweep over another tree (a test's fake root) never asks this node's systemd."""
    assert ss.release_failed_scopes(lambda c: False, lambda c: False, ["/tmp/cg/memory"], procs_of) == []
    assert failed.calls == []


def test_release_failed_scopes_without_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    """No systemd: nothing listed, nothing reported."""
    monkeypatch.setattr(ss, "systemd_reachable", lambda: False)
    assert ss.release_failed_scopes(lambda c: False, lambda c: False, [f"{CGROOT}/memory"], procs_of) == []


# -- which driver (doctor) -------------------------------------------------------------

V2_SYSTEMD = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
"""
V3_SYSTEMD = """version = 3
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  SystemdCgroup = true
"""


def write_state(root: str, namespace: str, cid: str, cgroups: dict[str, object]) -> None:
    os.makedirs(os.path.join(root, namespace, cid))
    with open(os.path.join(root, namespace, cid, "state.json"), "w") as f:
        json.dump({"id": cid, "config": {"cgroups": cgroups}}, f)


def test_driver_of_state() -> None:
    """The state's ``Systemd`` flag is the driver, whatever the delete's command line says."""
    assert ss.driver_of_state(state(RUNC_115_SYSTEMD)) == ss.SYSTEMD_DRIVER
    assert ss.driver_of_state(state(RUNC_CGROUPFS)) == ss.CGROUPFS_DRIVER
    assert ss.driver_of_state({"config": {}}) is None


def test_drivers_in_use(tmp_path: Any) -> None:
    """Containers are counted per driver across namespaces; unreadable states are skipped."""
    root = str(tmp_path)
    write_state(root, "k8s.io", ID, RUNC_115_SYSTEMD)
    write_state(root, "k8s.io", "b" * 64, RUNC_CGROUPFS)
    write_state(root, "moby", "c" * 64, RUNC_115_SYSTEMD)
    os.makedirs(os.path.join(root, "moby", "broken"))
    assert ss.drivers_in_use(root) == {
        "systemd": [f"k8s.io/{ID}", f"moby/{'c' * 64}"],
        "cgroupfs": [f"k8s.io/{'b' * 64}"],
    }
    assert ss.drivers_in_use(os.path.join(root, "absent")) == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (V2_SYSTEMD, {"runc": "systemd", "nvidia": "cgroupfs"}),
        (V3_SYSTEMD, {"runc": "systemd"}),
        ("version = 2\n", {}),
        ("", {}),
    ],
)
def test_configured_drivers(text: str, expected: dict[str, str]) -> None:
    """Each CRI handler's SystemdCgroup, in config versions 2 and 3; absent means cgroupfs."""
    from runc_guard.node.doctor import configured_drivers

    assert configured_drivers(text) == expected


def test_doctor_reports_the_driver(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor names the configured and the used driver, and flags systemd without systemd."""
    from click.testing import CliRunner

    from runc_guard.cli.doctor import doctor as doctor_cmd

    config = tmp_path / "config.toml"
    config.write_text(V2_SYSTEMD)
    root = str(tmp_path / "runc")
    write_state(root, "k8s.io", ID, RUNC_115_SYSTEMD)
    monkeypatch.setattr(ss, "systemd_reachable", lambda: False)
    monkeypatch.setenv("RUNC_GUARD_CONFIG", str(tmp_path / "absent.toml"))
    result = CliRunner().invoke(
        doctor_cmd,
        ["--containerd-config", str(config), "--runtime-root", root, "--format", "json"],
    )
    report = json.loads(result.output)
    assert report["cgroup_driver"] == {
        "systemd_pid1": False,
        "containerd_handlers": {"nvidia": "cgroupfs", "runc": "systemd"},
        "containers": {"systemd": 1},
    }
    assert any("systemd cgroup driver" in p for p in report["problems"])
    text = CliRunner().invoke(doctor_cmd, ["--containerd-config", str(config), "--runtime-root", root])
    assert "containerd handlers nvidia=cgroupfs, runc=systemd; containers by driver: systemd 1" in text.output


def test_audit_judges_a_failed_scope_of_a_gone_container_a_problem() -> None:
    """A failed scope the sweep would reset makes the audit say "problem" (NPD exit 1)."""
    from runc_guard.node.audit import NPD_OK, NPD_PROBLEM, AuditReport, judge

    report = AuditReport(["/sys/fs/cgroup/memory"])
    report.failed_scopes = [{"id": ID, "action": "kept:runtime_state", "unit": "u"}]
    assert judge(report, 0, 1800.0) == NPD_OK
    report.failed_scopes.append({"id": ID_GONE, "action": "would_reset_failed", "unit": "v"})
    assert judge(report, 0, 1800.0) == NPD_PROBLEM
    assert "1 failed scope unit(s) of gone containers" in report.message


def test_settle_without_stop_leaves_an_active_scope(fake: FakeSystemd) -> None:
    """An active unit is left as it is (``left_active``): no stop job that could end in Result=timeout."""
    result = ss.settle("u.scope", lambda: False, soon(), stop_active=False)
    assert result.outcome == ss.LEFT_ACTIVE
    assert fake.verbs() == []
    fake.active = fake.sub = "failed"
    assert ss.settle("u.scope", lambda: True, soon(), stop_active=False).outcome == ss.RESET_FAILED
    assert fake.verbs() == ["reset-failed"]
