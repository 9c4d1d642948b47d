"""Read-only health of a node's container cgroups, for people, NPD and Prometheus.

Uses the sweep's own eyes (:func:`sweep.read_facts`, :func:`sweep.decide`), so
"leaked" here means exactly "the sweep would remove it". Also compares runc's
state ids with containerd's bundle ids (each without the other, once older
than ``min_age`` so a container being created or deleted is not reported),
lists the shim's pending records, and names the runtime runc-guard fronts.
The verdict follows Node Problem Detector's custom-plugin protocol: exit 0 OK,
1 problem, 2 unknown, and one line of message on stdout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from runc_guard.cgroupfs import CgroupFsOps
from runc_guard.discovery import Discovery, pod_uid_of
from runc_guard.metrics import Gauge
from runc_guard.sweep import RuntimeDirs, decide, read_facts
from runc_guard.systemd_scope import release_failed_scopes

NPD_OK = 0
NPD_PROBLEM = 1
NPD_UNKNOWN = 2
#: Two sweep periods (15 min each): a record older than that is one the sweep cannot finish.
DEFAULT_PENDING_MAX_AGE = 1800.0


@dataclass
class PodLeak:
    pod: str
    pod_uid: str | None
    containers: int = 0
    dirs: int = 0
    ids: list[str] = field(default_factory=list)


@dataclass
class AuditReport:
    """Everything the audit found; ``as_dict`` is the JSON output."""

    hierarchies: list[str]
    containers: int = 0
    leaked_containers: int = 0
    leaked_dirs: int = 0
    leaked_pods: list[PodLeak] = field(default_factory=list)
    #: Container cgroups that are not leaked, by the sweep's reason for keeping them.
    kept: dict[str, int] = field(default_factory=dict)
    #: Populated container cgroups that neither runc nor containerd knows about.
    processes_without_container: list[str] = field(default_factory=list)
    states_without_bundle: list[str] = field(default_factory=list)
    bundles_without_state: list[str] = field(default_factory=list)
    pending: list[dict[str, Any]] = field(default_factory=list)
    pending_errors: dict[str, str] = field(default_factory=dict)
    runtime: dict[str, str] = field(default_factory=dict)
    #: systemd driver: failed container scope units (sweep entries: would_reset_failed / kept:<reason>).
    failed_scopes: list[dict[str, Any]] = field(default_factory=list)
    status: str = "ok"
    message: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def runtime_entries(root: str, now: float, min_age: float) -> set[str]:
    """``<ns>/<id>`` for every directory two levels below ``root`` older than ``min_age``."""
    found: set[str] = set()
    try:
        namespaces = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return found
    for ns in namespaces:
        try:
            with os.scandir(os.path.join(root, ns)) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False) and (
                        now - entry.stat(follow_symlinks=False).st_mtime >= min_age
                    ):
                        found.add(f"{ns}/{entry.name}")
        except (FileNotFoundError, NotADirectoryError):
            continue
    return found


def fronted_runtime(environ: Mapping[str, str]) -> dict[str, str]:
    """The runtime the shim would exec (as doctor resolves it) and its ``--version`` line."""
    from runc_guard.errors import RuncGuardError
    from runc_guard.runtime import resolve_runtime, runtime_name_for
    from runc_guard.settings_file import config_path, read_settings_file

    info: dict[str, str] = {}
    try:
        raw = read_settings_file(config_path(dict(environ)), None)
        info["name"] = runtime_name_for("runc-guard", raw, environ)
        self_path = shutil.which("runc-guard") or sys.argv[0]
        info["path"] = resolve_runtime(info["name"], self_path, environ)
        done = subprocess.run(
            [info["path"], "--version"], capture_output=True, text=True, timeout=10, check=False
        )
        info["version"] = done.stdout.splitlines()[0] if done.stdout else ""
    except (RuncGuardError, OSError, ValueError, TypeError, subprocess.SubprocessError) as exc:
        info["error"] = str(exc)
    return info


def audit(
    discovery: Discovery,
    fs: CgroupFsOps,
    runtime: RuntimeDirs,
    now: float,
    min_age: float,
) -> AuditReport:
    """Look, never touch: classify every container unit and compare runtime records."""
    report = AuditReport([h.mount for h in discovery.hierarchies])
    pods: dict[str, PodLeak] = {}
    for unit in sorted(discovery.units.values(), key=lambda u: (u.pod, u.container_id)):
        facts = read_facts(unit, fs, runtime)
        verdict = decide(facts, now, min_age)
        if verdict.action == "forget":
            continue
        report.containers += 1
        if verdict.action == "remove":
            leak = pods.setdefault(unit.pod, PodLeak(unit.pod, pod_uid_of(unit.pod)))
            leak.containers += 1
            leak.dirs += len(facts.present)
            leak.ids.append(unit.container_id)
            report.leaked_containers += 1
            report.leaked_dirs += len(facts.present)
            continue
        report.kept[verdict.reason] = report.kept.get(verdict.reason, 0) + 1
        if facts.populated and not facts.has_state and not facts.has_bundle:
            report.processes_without_container.append(unit.container_id)
    report.leaked_pods = sorted(pods.values(), key=lambda p: (-p.containers, p.pod))
    states = runtime_entries(runtime.runtime_root, now, min_age)
    bundles = runtime_entries(runtime.bundle_root, now, min_age)
    report.states_without_bundle = sorted(states - bundles)
    report.bundles_without_state = sorted(bundles - states)
    for record, (cid, created) in sorted(discovery.records.items()):
        report.pending.append(
            {"record": record, "container_id": cid, "age_seconds": round(now - created, 1)}
        )
    report.pending_errors = dict(discovery.record_errors)
    report.failed_scopes = release_failed_scopes(
        runtime.has_state, runtime.has_bundle, report.hierarchies, fs.read_procs, dry_run=True
    )
    return report


def judge(report: AuditReport, max_leaked: int, pending_max_age: float) -> int:
    """Set ``status``/``message`` (one short line for NPD) and return the NPD exit code."""
    problems: list[str] = []
    if report.leaked_containers > max_leaked:
        top = report.leaked_pods[0]
        problems.append(
            f"{report.leaked_containers} leaked container cgroups ({report.leaked_dirs} dirs) "
            f"in {len(report.leaked_pods)} pod(s), most in {top.pod_uid or top.pod} ({top.containers})"
        )
    stale = [p for p in report.pending if p["age_seconds"] > pending_max_age]
    if stale:
        problems.append(f"{len(stale)} pending record(s) older than {pending_max_age:g}s")
    if report.pending_errors:
        problems.append(f"{len(report.pending_errors)} unusable pending record(s)")
    orphan_scopes = [s for s in report.failed_scopes if s["action"] == "would_reset_failed"]
    if orphan_scopes:
        problems.append(f"{len(orphan_scopes)} failed scope unit(s) of gone containers")
    if problems:
        report.status = "problem"
        report.message = "CgroupLeak: " + "; ".join(problems)
        return NPD_PROBLEM
    report.status = "ok"
    report.message = (
        f"OK: {report.leaked_containers} leaked of {report.containers} container cgroups, "
        f"{len(report.pending)} pending record(s)"
    )
    return NPD_OK


def gauges(report: AuditReport, now: float) -> list[Gauge]:
    """The audit's figures as Prometheus gauges (fresh every run, so never stored)."""
    oldest = max((p["age_seconds"] for p in report.pending), default=0.0)
    out = [
        Gauge("runc_guard_leaked_containers", "Leaked container cgroups (what a sweep would remove).",
              report.leaked_containers),
        Gauge("runc_guard_leaked_cgroup_dirs", "Directories of leaked container cgroups, all hierarchies.",
              report.leaked_dirs),
        Gauge("runc_guard_leaked_pods", "Pods with at least one leaked container cgroup.",
              len(report.leaked_pods)),
        Gauge("runc_guard_leaked_containers_max_per_pod", "Leaked containers in the worst pod.",
              report.leaked_pods[0].containers if report.leaked_pods else 0),
        Gauge("runc_guard_container_cgroups", "Container cgroups found under kubepods.",
              report.containers),
        Gauge("runc_guard_pending_records", "Pending records the shim left for the sweep.",
              len(report.pending)),
        Gauge("runc_guard_pending_oldest_age_seconds", "Age of the oldest pending record.", oldest),
        Gauge("runc_guard_pending_record_errors", "Pending records that cannot be used.",
              len(report.pending_errors)),
        Gauge("runc_guard_runtime_states_without_bundle", "runc state ids with no containerd bundle.",
              len(report.states_without_bundle)),
        Gauge("runc_guard_bundles_without_runtime_state", "containerd bundles with no runc state.",
              len(report.bundles_without_state)),
        Gauge("runc_guard_audit_ok", "1 when the last audit found no problem.",
              1 if report.status == "ok" else 0),
        Gauge("runc_guard_audit_timestamp_seconds", "When the last audit ran.", round(now, 3)),
    ]
    if report.runtime.get("path"):
        out.append(Gauge("runc_guard_runtime_info", "The runtime runc-guard fronts.", 1,
                         {"path": report.runtime["path"],
                          "version": report.runtime.get("version", "")}))
    return out
