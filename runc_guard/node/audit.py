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
import re
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from runc_guard.delete.cgroupfs import CgroupFsOps
from runc_guard.delete.systemd_scope import release_failed_scopes
from runc_guard.node.discovery import Discovery, pod_uid_of
from runc_guard.node.metrics import Family
from runc_guard.node.orphans import LEFT_ALONE, ORPHAN, VERDICTS
from runc_guard.node.orphans import judge as judge_state
from runc_guard.node.record_clock import ASIDE, HELD, PENDING, aged
from runc_guard.node.sweep import RuntimeDirs, decide, read_facts

NPD_OK = 0
NPD_PROBLEM = 1
NPD_UNKNOWN = 2
#: Two sweep periods (15 min each): a record older than that is one the sweep cannot finish.
DEFAULT_PENDING_MAX_AGE = 1800.0


#: A held memcg still recorded this long after its hold outlived both the finisher (late_reclaim.LATE_MAX
#: + finisher.HOLD_MAX) and the sweep's timer after it: a problem.
HELD_STALE = 600.0

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
    #: Runtime state whose init is dead and that no bundle or shim owns (the sweep re-drives it).
    orphaned_states: list[dict[str, Any]] = field(default_factory=list)
    #: Orphaned state whose cgroup paths are unsafe to act on.
    state_errors: dict[str, str] = field(default_factory=dict)
    #: State never touched on purpose: another manager's, an owner or an init that cannot be told.
    states_left_alone: list[dict[str, Any]] = field(default_factory=list)
    #: Every runtime state directory looked at, by verdict (alive, bundle, shim, too_young, orphan ...).
    state_verdicts: dict[str, int] = field(default_factory=dict)
    runtime: dict[str, str] = field(default_factory=dict)
    #: systemd driver: failed container scope units (sweep entries: would_reset_failed / kept:<reason>).
    failed_scopes: list[dict[str, Any]] = field(default_factory=list)
    #: Deletes that stepped aside (the runtime acted alone) and whose cgroups are still there.
    aside: list[dict[str, Any]] = field(default_factory=list)
    #: Log entries a delete could neither spool nor write to the fallback file (since boot).
    lost_entries: int = 0
    #: Memory cgroups deletes held aside for a late reclaim (delete.memcg_hold) and not finished yet.
    held_memcgs: list[dict[str, Any]] = field(default_factory=list)
    status: str = "ok"
    message: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def dated_ahead(self) -> list[dict[str, Any]]:
        """Pending, aside and held records dated ahead of the clock (node.record_clock): their age is
        unknown until the next sweep re-stamps them, and nothing that waits on an age sees them."""
        return [
            {"kind": kind, **entry}
            for kind, entries in ((PENDING, self.pending), (ASIDE, self.aside), (HELD, self.held_memcgs))
            for entry in entries
            if "dated_ahead_seconds" in entry
        ]


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
    from runc_guard.runtime import installed_shim, resolve_runtime
    from runc_guard.settings import load

    info: dict[str, str] = {}
    try:
        info["name"] = load(environ).runtime_for("runc-guard")
        info["path"] = resolve_runtime(info["name"], installed_shim(), environ)
        done = subprocess.run(
            [info["path"], "--version"], capture_output=True, text=True, timeout=10, check=False
        )
        info["version"] = done.stdout.splitlines()[0] if done.stdout else ""
    except (RuncGuardError, OSError, ValueError, TypeError, subprocess.SubprocessError) as exc:
        info["error"] = str(exc)
    return info


def stepped_aside(cache_dir: str, fs: CgroupFsOps, now: float) -> list[dict[str, Any]]:
    """Aside records whose cgroups remain, or that name none (start-up overload) while its state stays.

    Look, never touch: what a stepped-aside delete left is judged by the sweep's own
    rules like any other cgroup; these only keep the case visible.
    """
    from runc_guard.delete.aside import iter_aside

    found: list[dict[str, Any]] = []
    for path, doc in iter_aside(cache_dir):
        if doc is None:
            found.append({"record": path, "error": "unusable aside record"})
            continue
        listed = doc["cgroup_paths"]
        paths = [p for p in listed if isinstance(p, str)] if isinstance(listed, list) else []
        left = [p for p in paths if fs.exists(p)]
        root, cid = str(doc.get("runtime_root", "")), str(doc["container_id"])
        if paths and not left:
            continue
        if not paths and not os.path.exists(os.path.join(root, cid)):
            continue
        found.append(
            {"record": path, "container_id": cid, "reason": doc.get("reason", ""), "cgroup_dirs": len(left),
             "age_seconds": None, **aged(doc.get("created"), now)}
        )
    return found


def held_memcgs(cache_dir: str, now: float) -> list[dict[str, Any]]:
    """Held memory cgroups not finished yet: the record, its directory, age. Look, never touch."""
    from runc_guard.delete.memcg_hold import iter_held

    found: list[dict[str, Any]] = []
    for path, doc in iter_held(cache_dir):
        if doc is None:
            found.append({"record": path, "error": "unusable held-memcg record"})
            continue
        found.append({"record": path, "container_id": doc["container_id"], "held": doc["held"],
                      "exists": os.path.lexists(str(doc["held"])), "reason": doc["reason"],
                      **aged(doc["created"], now)})
    return found


def lost_entries(cache_dir: str) -> int:
    """How many log entries deletes have lost (report.LOST_ENTRIES: one byte each)."""
    from runc_guard.delete.report import LOST_ENTRIES

    try:
        return os.stat(os.path.join(cache_dir, LOST_ENTRIES)).st_size
    except OSError:
        return 0


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
        report.pending.append({"record": record, "container_id": cid, **aged(created, now)})
    report.pending_errors = dict(discovery.record_errors)
    for state in discovery.states:
        state_verdict = judge_state(state, now, min_age)
        report.state_verdicts[state_verdict] = report.state_verdicts.get(state_verdict, 0) + 1
        if state_verdict in LEFT_ALONE:
            report.states_left_alone.append(
                {
                    "container_id": state.state.container_id,
                    "state_dir": state.state.path,
                    "verdict": state_verdict,
                    "owner": state.owner,
                    "init_pid": state.init_pid,
                }
            )
        if state_verdict == ORPHAN:
            report.orphaned_states.append(
                {
                    "container_id": state.state.container_id,
                    "state_dir": state.state.path,
                    "namespace": state.state.namespace,
                    "kind": state.kind,
                    "init_pid": state.init_pid,
                    "age_seconds": round(now - state.modified, 1),
                }
            )
    report.state_errors = dict(discovery.state_errors)
    report.failed_scopes = release_failed_scopes(
        runtime.has_state, runtime.has_bundle, report.hierarchies, fs.read_procs, dry_run=True
    )
    return report


def judge(
    report: AuditReport, max_leaked: int, pending_max_age: float, config_error: str | None = None
) -> int:
    """Set ``status``/``message`` (one short line for NPD) and return the NPD exit code.

    An invalid settings file is a problem too (it names the key): fleet-wide, and
    the delete path only reports it once per version of the file.
    """
    problems: list[str] = []
    if config_error:
        problems.append(f"invalid settings: {config_error}")
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
    if report.orphaned_states:
        problems.append(
            f"{len(report.orphaned_states)} orphaned runtime state(s) (init dead, no bundle, no shim)"
        )
    if report.state_errors:
        problems.append(f"{len(report.state_errors)} orphaned state(s) naming unsafe cgroups")
    orphan_scopes = [s for s in report.failed_scopes if s["action"] == "would_reset_failed"]
    if orphan_scopes:
        problems.append(f"{len(orphan_scopes)} failed scope unit(s) of gone containers")
    if report.aside:
        problems.append(f"{len(report.aside)} stepped-aside delete(s) left cgroups or state behind")
    if report.lost_entries:
        problems.append(f"{report.lost_entries} delete log entr(ies) lost (no spool, no fallback file)")
    stale = [h for h in report.held_memcgs if h.get("age_seconds", 0) > HELD_STALE or "error" in h]
    if stale:
        problems.append(f"{len(stale)} held memory cgroup(s) no finisher or sweep finished")
    ahead = report.dated_ahead()
    if ahead:
        problems.append(f"{len(ahead)} record(s) dated ahead of the clock (stepped back?), age unknown "
                        "until the next sweep re-stamps them")
    if problems:
        report.status = "problem"
        report.message = "CgroupLeak: " + "; ".join(problems)
        return NPD_PROBLEM
    report.status = "ok"
    report.message = (
        f"OK: {report.leaked_containers} leaked of {report.containers} container cgroups, "
        f"{len(report.pending)} pending record(s), 0 orphaned runtime states"
    )
    return NPD_OK


def _version_of(line: str) -> str:
    """``runc version 1.1.5`` -> ``1.1.5``; ``crun version 1.8.1`` -> ``1.8.1``; else the line."""
    match = re.search(r"\bversion\s+v?([0-9][0-9A-Za-z.+~-]*)", line)
    return match.group(1) if match else line


def families(report: AuditReport, now: float) -> list[Family]:
    """The audit's figures as Prometheus gauge families (fresh every run, so never stored)."""
    oldest = max((p["age_seconds"] for p in report.pending), default=0.0)
    ahead = report.dated_ahead()
    out = [
        Family.one(
            "runc_guard_leaked_containers",
            "Leaked container cgroups (what a sweep would remove).",
            report.leaked_containers,
        ),
        Family.one(
            "runc_guard_leaked_cgroup_dirs",
            "Directories of leaked container cgroups, all hierarchies.",
            report.leaked_dirs,
        ),
        Family.one(
            "runc_guard_leaked_pods",
            "Pods with at least one leaked container cgroup.",
            len(report.leaked_pods),
        ),
        Family.one(
            "runc_guard_leaked_containers_max_per_pod",
            "Leaked containers in the worst pod.",
            report.leaked_pods[0].containers if report.leaked_pods else 0,
        ),
        Family.one(
            "runc_guard_container_cgroups", "Container cgroups found under kubepods.", report.containers
        ),
        Family.one(
            "runc_guard_pending_records", "Pending records the shim left for the sweep.", len(report.pending)
        ),
        Family.one(
            "runc_guard_pending_oldest_age_seconds", "Age of the oldest pending record (0: none).", oldest
        ),
        Family.one(
            "runc_guard_pending_record_errors",
            "Pending records that cannot be used.",
            len(report.pending_errors),
        ),
        Family.one(
            "runc_guard_orphaned_runtime_states",
            "Runtime states with a dead init, no bundle and no live shim (the sweep re-drives them).",
            len(report.orphaned_states),
        ),
        Family.one(
            "runc_guard_orphaned_state_errors",
            "Orphaned runtime states naming unsafe cgroup paths.",
            len(report.state_errors),
        ),
        Family.one(
            "runc_guard_runtime_states_without_bundle",
            "runc state ids with no containerd bundle.",
            len(report.states_without_bundle),
        ),
        Family.one(
            "runc_guard_bundles_without_runtime_state",
            "containerd bundles with no runc state.",
            len(report.bundles_without_state),
        ),
        Family.one(
            "runc_guard_stepped_aside_leftovers",
            "Deletes that stepped aside (the runtime acted alone) whose cgroups or state remain.",
            len(report.aside),
        ),
        Family.one(
            "runc_guard_memcgs_held",
            "Memory cgroups held aside for a reclaim after the delete's reply, not finished yet.",
            len(report.held_memcgs),
        ),
        Family(
            "runc_guard_records_dated_ahead",
            "Pending, aside and held-memcg records dated ahead of the clock (a clock stepped back): "
            "their age is unknown until the sweep re-stamps them.",
            tuple(((("kind", k),), float(sum(r["kind"] == k for r in ahead)))
                  for k in (PENDING, ASIDE, HELD)),
        ),
        Family.one(
            "runc_guard_lost_log_entries",
            "Delete log entries that could be neither spooled nor written to the fallback file.",
            report.lost_entries,
        ),
        Family.one(
            "runc_guard_audit_ok",
            "1 when the last audit found no problem.",
            1 if report.status == "ok" else 0,
        ),
        Family.one("runc_guard_audit_timestamp_seconds", "When the last audit ran.", round(now, 3)),
    ]
    pods = tuple(
        ((("pod", p.pod), ("pod_uid", p.pod_uid or "")), float(p.containers)) for p in report.leaked_pods
    )
    pod_dirs = tuple(
        ((("pod", p.pod), ("pod_uid", p.pod_uid or "")), float(p.dirs)) for p in report.leaked_pods
    )
    out.append(Family("runc_guard_pod_leaked_containers", "Leaked container cgroups per pod.", pods))
    out.append(Family("runc_guard_pod_leaked_cgroup_dirs", "Leaked cgroup directories per pod.", pod_dirs))
    verdicts = tuple(
        ((("verdict", verdict),), float(report.state_verdicts.get(verdict, 0))) for verdict in VERDICTS
    )
    out.append(
        Family("runc_guard_runtime_states", "Runtime state directories by what the audit judged.", verdicts)
    )
    runtime = report.runtime
    if runtime.get("name") or runtime.get("path"):
        out.append(
            Family.one(
                "runc_guard_runtime_info",
                "The runtime runc-guard fronts (value 1).",
                1,
                name=runtime.get("name", ""),
                path=runtime.get("path", ""),
                version=_version_of(runtime.get("version", "")),
            )
        )
    out.append(
        Family.one(
            "runc_guard_runtime_found",
            "1 when the fronted runtime was found and ran.",
            0 if "error" in runtime or not runtime.get("path") else 1,
        )
    )
    return out
