"""contrib/monitoring: the alert rules pass promtool, and every rule and panel names a metric we export."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from labkit import prereq
from runc_guard.node.audit import AuditReport, PodLeak
from runc_guard.node.cgroupstats import families as kernel_families
from runc_guard.node.cgroupstats import read_kernel
from runc_guard.node.host import node_families
from runc_guard.node.metrics import apply_delete_line, new_state, record_sweep, render
from tests.test_cgroupstats import CGROUP_STAT, PROC_CGROUPS

HERE = os.path.dirname(os.path.abspath(__file__))
MONITORING = os.path.join(HERE, "..", "contrib", "monitoring")
RULES = os.path.join(MONITORING, "runc-guard.rules.yml")
RULES_TEST = os.path.join(MONITORING, "runc-guard.rules.test.yml")
OPERATOR_RULE = os.path.join(MONITORING, "runc-guard-prometheusrule.yaml")
DASHBOARD = os.path.join(MONITORING, "runc-guard-dashboard.json")
DOC = os.path.join(HERE, "..", "docs", "monitor.md")
NOW = 1_800_000_000.0
_METRIC = re.compile(r"\brunc_guard_[a-z0-9_]+")


def promtool() -> str:
    """promtool's path; without it the test fails under CI and skips elsewhere (labkit.prereq)."""
    path = shutil.which("promtool")
    if path is None:
        prereq.missing("promtool: install Debian's prometheus package (apt-get install prometheus)")
    return path


def load_yaml(path: str) -> Any:
    with open(path) as f:
        return yaml.safe_load(f)


def rule_exprs() -> list[str]:
    return [rule["expr"] for group in load_yaml(RULES)["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    with open(DASHBOARD) as f:
        doc = json.load(f)
    exprs = [t["expr"] for panel in doc["panels"] for t in panel.get("targets", [])]
    exprs += [v["definition"] for v in doc["templating"]["list"] if "definition" in v]
    return exprs


def exported(tmp_path: Path) -> set[str]:
    """Sample names of a full exposition: counters, an audit with leaks and a runtime, kernel gauges."""
    state = new_state()
    apply_delete_line(state, b'{"outcome": "deadline", "waited_ms": 3000, "removed": 0}')
    record_sweep(
        state,
        {
            "removed": 1,
            "dirs_removed": 10,
            "errors": [],
            "records_cleared": 0,
            "slowed": 0.0,
            "kept": {},
            "duration": 1.0,
            "redriven": [{}],
        },
        NOW,
    )
    report = AuditReport(["/sys/fs/cgroup/memory"], containers=3, leaked_containers=2, leaked_dirs=20)
    report.leaked_pods = [PodLeak("kubepods/burstable/pod1234abcd", "1234abcd", 2, 20)]
    report.pending = [{"record": "/run/x.json", "container_id": "x", "age_seconds": 60.0}]
    report.runtime = {"name": "runc", "path": "/usr/sbin/runc", "version": "runc version 1.1.5"}
    (tmp_path / "proc_cgroups").write_text(PROC_CGROUPS)
    unified = tmp_path / "unified"
    (unified / "kubepods").mkdir(parents=True)
    (unified / "cgroup.stat").write_text(CGROUP_STAT)
    (unified / "kubepods" / "cgroup.stat").write_text(CGROUP_STAT)
    (tmp_path / "memory" / "kubepods" / "pod1").mkdir(parents=True)
    recorded = read_kernel(
        {str(unified): "cgroup2", str(tmp_path / "memory"): "cgroup"},
        ["kubepods"],
        str(tmp_path / "proc_cgroups"),
    )
    gauges = [*node_families(None, report, NOW, "/sys/fs/cgroup", ("kubepods",)), *kernel_families(recorded)]
    text = render(state, gauges)
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def test_rules_pass_promtool_check() -> None:
    """`promtool check rules` accepts the plain rules file and the PrometheusRule's groups."""
    tool = promtool()
    done = subprocess.run([tool, "check", "rules", RULES], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 9 rules found" in done.stdout


def test_rules_unit_tests_pass() -> None:
    """`promtool test rules` on synthetic series: every alert fires when it should and only then."""
    tool = promtool()
    done = subprocess.run(
        [tool, "test", "rules", os.path.basename(RULES_TEST)],
        cwd=MONITORING,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
    cases = [case for test in load_yaml(RULES_TEST)["tests"] for case in test["alert_rule_test"]]
    tested = {case["alertname"] for case in cases}
    alerts = {rule["alert"] for group in load_yaml(RULES)["groups"] for rule in group["rules"]}
    assert tested == alerts


def test_prometheusrule_holds_the_same_rules(tmp_path: Path) -> None:
    """The kube-prometheus manifest carries exactly the plain file's groups, selectable by kube-prometheus."""
    manifest = load_yaml(OPERATOR_RULE)
    assert (manifest["apiVersion"], manifest["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert manifest["metadata"]["labels"]["prometheus"] == "k8s"
    assert manifest["spec"] == load_yaml(RULES)
    extracted = tmp_path / "operator.rules.yml"
    extracted.write_text(yaml.safe_dump(manifest["spec"]))
    done = subprocess.run(
        [promtool(), "check", "rules", str(extracted)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout


def test_every_alert_says_what_to_run() -> None:
    """Each alert's summary names the command an operator runs next."""
    for group in load_yaml(RULES)["groups"]:
        for rule in group["rules"]:
            summary = rule["annotations"]["summary"]
            assert "`runc-guardctl audit`" in summary, rule["alert"]
            assert rule["labels"]["severity"] in ("warning", "critical")


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_expression_names_an_exported_metric(source: str, tmp_path: Path) -> None:
    """No rule or panel queries a metric name that runc-guardctl metrics does not write."""
    exprs = rule_exprs() if source == "rules" else dashboard_exprs()
    names = exported(tmp_path)
    used = {name for expr in exprs for name in _METRIC.findall(expr)}
    assert used, "no runc_guard metric found in the expressions"
    assert used - names == set()


def test_dashboard_is_grafana_json() -> None:
    """Panels have unique ids and grid positions, every target has a refId and the instance filter."""
    with open(DASHBOARD) as f:
        doc = json.load(f)
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for panel in doc["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"])
        for target in panel.get("targets", []):
            assert target["refId"] and 'instance=~"$instance"' in target["expr"]


def test_doc_names_every_alert_and_metric(tmp_path: Path) -> None:
    """docs/monitor.md explains every alert and every exported metric family."""
    with open(DOC) as f:
        doc = f.read()
    for group in load_yaml(RULES)["groups"]:
        for rule in group["rules"]:
            assert rule["alert"] in doc, rule["alert"]
    for name in exported(tmp_path):
        family = re.sub(r"_(bucket|sum|count)$", "", name) if "wait_seconds" in name else name
        assert family in doc, family
