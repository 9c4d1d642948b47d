"""The shipped DaemonSet, NPD plugin config and systemd units are valid and call real options."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import yaml

from labkit import prereq
from runc_guard.cli import cli
from tests.hermetic import own_env, own_roots

ROOT = Path(__file__).resolve().parent.parent
DAEMONSET = ROOT / "contrib" / "kubernetes" / "runc-guard-sweeper.yaml"
NPD = ROOT / "contrib" / "node-problem-detector" / "runc-guard-monitor.json"
UNITS = ROOT / "packaging" / "systemd"
INSTALLED_CTL = "/usr/bin/runc-guardctl"


def parse_ctl(argv: list[str]) -> click.Context:
    """Parse ``runc-guardctl <argv>`` with the real click command; UsageError if an option is wrong."""
    assert isinstance(cli, click.Group)
    command = cli.commands[argv[0]]
    return command.make_context(argv[0], list(argv[1:]))


def ctl_lines(script: str) -> list[list[str]]:
    """The runc-guardctl calls of the sweeper's loop (``host nice -n 10 "$ctl" ARGS``): ARGS."""
    calls = [shlex.split(line.strip()) for line in script.splitlines() if 'host nice -n 10 "$ctl" ' in line]
    return [argv[argv.index("$ctl") + 1:] for argv in calls]


@pytest.fixture(scope="module")
def daemonset() -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d]
    assert len(docs) == 1
    return docs[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("version", ["1.25.0", kubernetes_validate.latest_version()])
def test_daemonset_validates_against_kubernetes_schema(daemonset: dict[str, Any], version: str) -> None:
    """The DaemonSet passes kubernetes-validate's strict offline schema (no unknown fields)."""
    kubernetes_validate.validate(daemonset, version, strict=True)


def test_daemonset_has_what_the_sweep_needs(daemonset: dict[str, Any]) -> None:
    """Privileged with host PIDs (nsenter into PID 1's namespaces), with limits; no host mounts:
    the node's own runc-guardctl runs in the node's mount namespace."""
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["hostPID"] is True
    assert container["securityContext"]["privileged"] is True
    limits = container["resources"]["limits"]
    assert {"cpu", "memory"} <= set(limits)
    assert "volumes" not in pod and "volumeMounts" not in container
    script = container["args"][0]
    assert 'host() { nsenter -t 1 -m -u -i -n -p -- "$@"; }' in script
    env = {e["name"]: e["value"] for e in container["env"]}
    # the installer's runc-guardctl, then the .deb's
    assert env["HOST_CTL"].split() == ["/opt/runc-guard/bin/runc-guardctl", INSTALLED_CTL]


def test_daemonset_commands_parse_with_the_real_cli(daemonset: dict[str, Any]) -> None:
    """Every runc-guardctl call in the loop uses options that exist; metrics go where the timers' do."""
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    calls = ctl_lines(container["args"][0])
    assert [c[0] for c in calls] == ["audit", "sweep"]
    env = {e["name"]: e["value"] for e in container["env"]}
    for argv in calls:
        parse_ctl([w for a in argv for w in (env[a[1:]].split() if a.startswith("$") else [a])])
    audit = parse_ctl(_exec_start("runc-guard-audit.service"))
    assert calls[0][calls[0].index("--metrics-file") + 1] == "$METRICS_FILE"
    assert calls[1] == ["sweep", "$SWEEP_ARGS"] and env["SWEEP_ARGS"] == ""
    assert env["METRICS_FILE"] == audit.params["metrics_file"]


def test_npd_config_raises_cgroup_leak_from_audit() -> None:
    """The NPD custom plugin has a CgroupLeak condition set by a permanent rule running audit."""
    config = json.loads(NPD.read_text())
    assert config["plugin"] == "custom"
    conditions = {c["type"]: c for c in config["conditions"]}
    assert "CgroupLeak" in conditions
    (rule,) = config["rules"]
    assert (rule["type"], rule["condition"]) == ("permanent", "CgroupLeak")
    assert rule["path"] == INSTALLED_CTL
    ctx = parse_ctl(rule["args"])
    assert ctx.command.name == "audit" and ctx.params["quiet"] is True
    assert re.fullmatch(r"\d+s", config["pluginConfig"]["timeout"])


def test_npd_rule_output_fits_on_this_node(tmp_path: Path) -> None:
    """Running the rule's exact arguments gives exit 0/1/2 and one line within max_output_length."""
    config = json.loads(NPD.read_text())
    (rule,) = config["rules"]
    ctl = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")
    # The rule's arguments, pointed away from the host's runtime state (tests never read it).
    args = [*rule["args"], "--kubepods", "rgsweep-absent-tree", *own_roots(tmp_path)]
    done = subprocess.run([ctl, *args], capture_output=True, text=True, env=own_env(tmp_path), timeout=60,
                          check=False)
    assert done.returncode in (0, 1, 2), done.stderr
    assert done.stdout.count("\n") == 1
    assert len(done.stdout.strip()) <= config["pluginConfig"]["max_output_length"]


def test_systemd_units_verify(tmp_path: Path) -> None:
    """systemd-analyze verify accepts the units without a single warning."""
    analyze = shutil.which("systemd-analyze")
    prereq.require(analyze, "systemd-analyze (apt package systemd)")
    assert analyze is not None
    ctl = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")
    names = sorted(p.name for p in UNITS.iterdir())
    assert names == ["runc-guard-audit.service", "runc-guard-audit.timer",
                     "runc-guard-sweep.service", "runc-guard-sweep.timer"]
    for name in names:
        # verify checks that ExecStart is executable: point it at the installed tool.
        text = (UNITS / name).read_text().replace(INSTALLED_CTL, ctl)
        (tmp_path / name).write_text(text)
    done = subprocess.run([analyze, "verify", *(str(tmp_path / n) for n in names)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False)
    assert (done.returncode, done.stderr, done.stdout) == (0, "", "")


def _exec_start(unit: str) -> list[str]:
    (line,) = [ln for ln in (UNITS / unit).read_text().splitlines() if ln.startswith("ExecStart=")]
    argv = shlex.split(line.removeprefix("ExecStart="))
    assert argv[0] == INSTALLED_CTL
    return argv[1:]


def test_units_run_the_right_commands_on_schedule() -> None:
    """Sweep every 15 min, audit with metrics every minute; audit's 'problem found' is no failure."""
    assert parse_ctl(_exec_start("runc-guard-sweep.service")).command.name == "sweep"
    audit = parse_ctl(_exec_start("runc-guard-audit.service"))
    assert audit.command.name == "audit" and audit.params["metrics_file"]
    assert "OnUnitActiveSec=15min" in (UNITS / "runc-guard-sweep.timer").read_text()
    assert "OnUnitActiveSec=1min" in (UNITS / "runc-guard-audit.timer").read_text()
    assert "SuccessExitStatus=1" in (UNITS / "runc-guard-audit.service").read_text()
