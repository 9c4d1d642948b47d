"""The read-only audit: what leaked, per pod; runtime records; the NPD verdict and exit codes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from runc_guard.cli import cli
from runc_guard.node.audit import (
    NPD_OK,
    NPD_PROBLEM,
    AuditReport,
    PodLeak,
    audit,
    families,
    judge,
    runtime_entries,
)
from runc_guard.node.discovery import ContainerUnit, Discovery
from runc_guard.node.sweep import RuntimeDirs
from tests.hermetic import own_env, own_roots
from tests.test_sweep import HIERARCHIES, NOW, POD, AgedFs, add_unit, cid


@pytest.fixture
def fs(clock) -> AgedFs:  # type: ignore[no-untyped-def]
    return AgedFs(clock)


@pytest.fixture
def runtime(tmp_path: Path) -> RuntimeDirs:
    return RuntimeDirs(str(tmp_path / "runc"), str(tmp_path / "bundles"))


def aged_dir(path: Path, age: float, now: float = NOW) -> None:
    path.mkdir(parents=True)
    os.utime(path, (now - age, now - age))


def test_leaks_grouped_per_pod_and_nothing_touched(fs: AgedFs, runtime: RuntimeDirs) -> None:
    """Leaked units are counted per pod (worst first); in-use ones by reason; no rmdir happens."""
    other_pod = "kubepods/besteffort/pod22222222"
    leaked = [add_unit(fs, n) for n in range(1, 4)]
    other = ContainerUnit(cid(9), dirs=[f"/cg/memory/{other_pod}/{cid(9)}"], pod=other_pod)
    fs.add(other.dirs[0])
    live = add_unit(fs, 20)
    fs.dirs[live.dirs[0]] = [321]
    fs.alive.add(321)
    before = dict(fs.dirs)
    units = {u.container_id: u for u in [*leaked, other, live]}
    report = audit(Discovery(HIERARCHIES, units), fs, runtime, NOW, 60)
    assert fs.dirs == before and fs.rmdirs == []
    assert (report.containers, report.leaked_containers, report.leaked_dirs) == (5, 4, 10)
    assert [(p.pod, p.containers, p.dirs) for p in report.leaked_pods] == [
        (POD, 3, 9), (other_pod, 1, 1)
    ]
    assert report.leaked_pods[0].pod_uid == "11111111"
    assert report.kept == {"populated": 1}
    assert report.processes_without_container == [cid(20)]


def test_populated_with_state_is_not_an_orphan_process(
    fs: AgedFs, runtime: RuntimeDirs, tmp_path: Path
) -> None:
    """A running container (processes and runc state) is in use, not 'processes without container'."""
    live = add_unit(fs, 20)
    fs.dirs[live.dirs[0]] = [321]
    fs.alive.add(321)
    (tmp_path / "runc" / "k8s.io" / cid(20)).mkdir(parents=True)
    report = audit(Discovery(HIERARCHIES, {live.container_id: live}), fs, runtime, NOW, 60)
    assert report.processes_without_container == []
    assert report.kept == {"populated": 1}


def test_state_and_bundle_mismatches_respect_min_age(fs: AgedFs, tmp_path: Path) -> None:
    """Ids with state but no bundle (and the reverse) are listed once older than min_age."""
    now = time.time()
    aged_dir(tmp_path / "runc" / "k8s.io" / "both", 120, now)
    aged_dir(tmp_path / "bundles" / "k8s.io" / "both", 120, now)
    aged_dir(tmp_path / "runc" / "k8s.io" / "stateonly", 120, now)
    aged_dir(tmp_path / "runc" / "k8s.io" / "creating", 5, now)
    aged_dir(tmp_path / "bundles" / "moby" / "bundleonly", 120, now)
    runtime = RuntimeDirs(str(tmp_path / "runc"), str(tmp_path / "bundles"))
    report = audit(Discovery(HIERARCHIES), fs, runtime, now, 60)
    assert report.states_without_bundle == ["k8s.io/stateonly"]
    assert report.bundles_without_state == ["moby/bundleonly"]
    assert runtime_entries(str(tmp_path / "absent"), now, 0) == set()


def test_pending_records_with_age(fs: AgedFs) -> None:
    """Every pending record is listed with its age; unusable ones are carried over."""
    discovery = Discovery(HIERARCHIES)
    discovery.records["/p/a.json"] = (cid(1), NOW - 100)
    discovery.record_errors["/p/b.json"] = "malformed"
    report = audit(discovery, fs, RuntimeDirs("/nonexistent", "/nonexistent"), NOW, 60)
    assert report.pending == [{"record": "/p/a.json", "container_id": cid(1), "age_seconds": 100.0}]
    assert report.pending_errors == {"/p/b.json": "malformed"}


def leaky_report(leaked: int = 0, pending_ages: tuple[float, ...] = (), errors: int = 0) -> AuditReport:
    report = AuditReport(["/cg/memory"], containers=leaked + 2, leaked_containers=leaked)
    report.leaked_dirs = leaked * 10
    if leaked:
        report.leaked_pods = [PodLeak(POD, "11111111", leaked, leaked * 10)]
    report.pending = [{"record": f"/p/{i}", "container_id": "x", "age_seconds": a}
                      for i, a in enumerate(pending_ages)]
    report.pending_errors = {f"/p/e{i}": "bad" for i in range(errors)}
    return report


def test_judge_ok() -> None:
    """No leak, fresh records: exit 0 and an OK line."""
    report = leaky_report(pending_ages=(10.0,))
    assert judge(report, 0, 1800) == NPD_OK
    assert report.status == "ok"
    assert report.message.startswith("OK: 0 leaked of 2 container cgroups, 1 pending")


def test_judge_leak_names_worst_pod() -> None:
    """Leaks over the threshold: exit 1, CgroupLeak message naming counts and the worst pod."""
    report = leaky_report(leaked=8147)
    assert judge(report, 0, 1800) == NPD_PROBLEM
    assert report.message == (
        "CgroupLeak: 8147 leaked container cgroups (81470 dirs) in 1 pod(s), most in 11111111 (8147)"
    )
    assert "\n" not in report.message


def test_judge_threshold() -> None:
    """--max-leaked N tolerates up to N leaked containers."""
    assert judge(leaky_report(leaked=3), 3, 1800) == NPD_OK
    assert judge(leaky_report(leaked=4), 3, 1800) == NPD_PROBLEM


def test_judge_stale_and_unusable_records() -> None:
    """Records older than the limit, or unusable, are a problem even without leaked cgroups."""
    stale = leaky_report(pending_ages=(10.0, 4000.0))
    assert judge(stale, 0, 1800) == NPD_PROBLEM
    assert stale.message == "CgroupLeak: 1 pending record(s) older than 1800s"
    bad = leaky_report(errors=2)
    assert judge(bad, 0, 1800) == NPD_PROBLEM
    assert "2 unusable pending record(s)" in bad.message


def test_families() -> None:
    """Audit figures become gauges: totals, per pod, orphans, pending age, the runtime's name and version."""
    report = leaky_report(leaked=5, pending_ages=(30.0, 90.0))
    report.runtime = {"name": "runc", "path": "/usr/sbin/runc", "version": "runc version 1.1.5"}
    report.orphaned_states = [{"container_id": cid(1)}]
    report.state_verdicts = {"alive": 3, "orphan": 1}
    judge(report, 0, 1800)
    by_name = {f.name: dict(f.samples) for f in families(report, NOW)}
    assert by_name["runc_guard_leaked_containers"][()] == 5
    assert by_name["runc_guard_leaked_cgroup_dirs"][()] == 50
    assert by_name["runc_guard_pending_oldest_age_seconds"][()] == 90.0
    assert by_name["runc_guard_audit_ok"][()] == 0
    assert by_name["runc_guard_orphaned_runtime_states"][()] == 1
    assert by_name["runc_guard_runtime_states"][(("verdict", "alive"),)] == 3
    assert by_name["runc_guard_runtime_states"][(("verdict", "shim"),)] == 0
    assert by_name["runc_guard_pod_leaked_containers"] == {
        (("pod", POD), ("pod_uid", "11111111")): 5
    }
    assert by_name["runc_guard_runtime_info"] == {
        (("name", "runc"), ("path", "/usr/sbin/runc"), ("version", "1.1.5")): 1
    }
    assert by_name["runc_guard_runtime_found"][()] == 1


def test_cli_unknown_when_it_cannot_run(tmp_path: Path) -> None:
    """No cgroup hierarchy below --cgroup-root: exit 2 (NPD unknown) with one UNKNOWN line."""
    result = CliRunner().invoke(cli, ["audit", "--cgroup-root", str(tmp_path)], env=own_env(tmp_path))
    assert result.exit_code == 2
    assert result.output.startswith("UNKNOWN: no cgroup filesystem is mounted")


def test_cli_bad_settings_are_a_problem(tmp_path: Path) -> None:
    """A broken settings file is an NPD problem naming the key (issue 11), and the audit still runs."""
    config = tmp_path / "config.toml"
    config.write_text("no_such_key = 1\n")
    args = ["audit", "--kubepods", "rgsweep-absent-tree", *own_roots(tmp_path)]
    result = CliRunner().invoke(cli, args, env=own_env(tmp_path, RUNC_GUARD_CONFIG=str(config)))
    assert result.exit_code == 1, result.output
    assert "invalid settings" in result.output and "no_such_key" in result.output


def test_cli_ok_on_this_node_json(tmp_path: Path) -> None:
    """On the real cgroup mounts with an empty kubepods name: exit 0 and a JSON report."""
    args = ["audit", "--kubepods", "rgsweep-absent-tree", *own_roots(tmp_path), "--format", "json"]
    result = CliRunner().invoke(cli, args, env=own_env(tmp_path))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["status"] == "ok" and doc["leaked_containers"] == 0
    assert doc["hierarchies"]
    assert "path" in doc["runtime"] or "error" in doc["runtime"]
