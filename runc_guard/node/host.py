"""The node tools' work against this host's real kernel: scan, audit, gauges, the sweep's after-steps.

The scan is the one sweep, audit and metrics share; each step here is what the CLI
once did itself with the delete path's seams.

The CLI (``runc_guard.cli``) parses options and prints; everything it reads of the
kernel and the runtimes goes through here, so ``cli`` never imports ``delete``.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from runc_guard.delete.cgroupfs import RealCgroupFs, cgroup_mounts
from runc_guard.errors import ForeignPidNamespace, NoCgroupHierarchy
from runc_guard.node.audit import (
    AuditReport,
    audit,
    families,
    fronted_runtime,
    held_memcgs,
    judge,
    lost_entries,
    stepped_aside,
)
from runc_guard.node.discovery import Discovery, discover
from runc_guard.node.orphans import DEFAULT_REDRIVE_TIMEOUT, Orphans, live_shim_ids
from runc_guard.node.sweep import RuntimeDirs, SweepReport
from runc_guard.settings import Settings, load
from runc_guard.values import Value

if TYPE_CHECKING:
    from runc_guard.node.metrics import Family


class Where(Value):
    """Where sweep, audit and metrics look: the options they share, as one value."""

    __slots__ = (
        "bundle_root", "cgroup_root", "kubepods", "min_age", "orphan_roots", "orphans", "runtime_root",
        "state_roots",
    )
    cgroup_root: str
    kubepods: tuple[str, ...]
    runtime_root: str
    bundle_root: str
    state_roots: tuple[str, ...]
    orphans: bool
    min_age: float
    #: Roots besides containerd's whose state is judged (and re-driven by the sweep).
    orphan_roots: tuple[str, ...]

    def __init__(
        self,
        cgroup_root: str,
        kubepods: tuple[str, ...],
        runtime_root: str,
        bundle_root: str,
        state_roots: tuple[str, ...],
        orphans: bool,
        min_age: float,
        orphan_roots: tuple[str, ...] = (),
    ) -> None:
        self._init(locals())


def runtime_dirs(
    settings: Settings, where: Where, redrive_timeout: float = DEFAULT_REDRIVE_TIMEOUT
) -> RuntimeDirs:
    """Where runtime state and bundles live, and (``orphans``) how orphaned state is judged and re-driven."""
    plain = RuntimeDirs(where.runtime_root, where.bundle_root, tuple(where.state_roots))
    if not where.orphans:
        return plain
    judge = Orphans(
        roots=(where.runtime_root,),
        named_roots=tuple(where.orphan_roots),
        has_bundle=plain.has_bundle,
        configured_runtime=settings.runtime,
        mounts=cgroup_mounts,
        shims=live_shim_ids(),
        timeout=redrive_timeout,
    )
    return RuntimeDirs(where.runtime_root, where.bundle_root, tuple(where.state_roots), judge)


def require_host_pid_namespace(command: str, proc: str = "/proc") -> None:
    """Refuse (ForeignPidNamespace, exit 77) unless this process sees the runtime's PID namespace.

    Every liveness judgement and every cgroup v1 ``cgroup.procs`` read is wrong
    from another PID namespace (node/pidns.py). The refusal is logged to the
    journal too: a sweeper that never runs must not stay silent.
    """
    from runc_guard.journal import send_minimal
    from runc_guard.node.pidns import pid_namespace_view, refusal

    view = pid_namespace_view(proc)
    if view.trusted:
        return
    message = refusal(command, view)
    send_minimal(os.environ, f"{command}_refused", message, 3)  # LOG_ERR
    raise ForeignPidNamespace(message)


def scan(settings: Settings, where: Where, fs: RealCgroupFs, runtime: RuntimeDirs) -> Discovery:
    """Find every container unit below the kubepods trees, the shim's pending records and orphaned state."""
    states = None
    if runtime.orphans is not None:
        states = (runtime.orphans.scan(), time.time(), where.min_age)
    mounts = cgroup_mounts()
    return discover(where.cgroup_root, where.kubepods, settings.pending_dir, fs, mounts, states, settings)


def host_fs(settings: Settings) -> RealCgroupFs:
    """The real cgroup filesystem, its reclaim honouring the memcg probe's cached answer."""
    from runc_guard.delete.reclaim import PROBE_FILE

    return RealCgroupFs(os.path.join(settings.cache_dir, PROBE_FILE))


def run_audit(
    settings: Settings,
    where: Where,
    max_leaked: int,
    pending_max_age: float,
    config_error: str | None = None,
) -> tuple[AuditReport, int, float]:
    """Scan, classify and judge; returns the report, the NPD exit code and the time."""
    require_host_pid_namespace("audit")
    fs = RealCgroupFs()
    now = time.time()
    runtime = runtime_dirs(settings, where)
    discovery = scan(settings, where, fs, runtime)
    report = audit(discovery, fs, runtime, now, where.min_age)
    report.runtime = fronted_runtime(os.environ)
    report.aside = stepped_aside(settings.cache_dir, fs, now)
    report.lost_entries = lost_entries(settings.cache_dir)
    report.held_memcgs = held_memcgs(settings.cache_dir, now)
    code = judge(report, max_leaked, pending_max_age, config_error)
    return report, code, now


def audit_leniently(
    where: Where, max_leaked: int, pending_max_age: float
) -> tuple[Settings, str | None, AuditReport, int, float]:
    """:func:`run_audit` with the settings file read leniently, for audit and metrics.

    An invalid settings file is a problem to report, not a reason to stop auditing:
    valid keys apply, the rest keep their defaults (as in the delete path), and
    the problem (naming the key) comes back as ``config_error``.
    """
    settings = load()
    config_error = "; ".join(settings.problems) or None
    report, code, now = run_audit(settings, where, max_leaked, pending_max_age, config_error)
    return settings, config_error, report, code, now


def node_families(
    config_error: str | None,
    report: AuditReport | None,
    now: float,
    cgroup_root: str,
    kubepods: tuple[str, ...],
) -> list[Family]:
    """Every fresh gauge: settings validity, the audit's view (when it ran) and the kernel's counters."""
    from runc_guard.node.cgroupstats import families as kernel_families
    from runc_guard.node.cgroupstats import read_kernel
    from runc_guard.node.discovery import hierarchies_below
    from runc_guard.node.metrics import Family

    out = [
        Family.one(
            "runc_guard_config_valid",
            "1 when runc-guard's settings file (and RUNC_GUARD_* variables) are valid.",
            0 if config_error else 1,
        )
    ]
    if report is not None:
        out.extend(families(report, now))
    try:
        mounts = {h.mount: h.fstype for h in hierarchies_below(cgroup_root, cgroup_mounts())}
    except (NoCgroupHierarchy, OSError):
        mounts = {}
    out.extend(kernel_families(read_kernel(mounts, kubepods)))
    return out


def write_metrics(
    settings: Settings,
    config_error: str | None,
    report: AuditReport | None,
    now: float,
    cgroup_root: str,
    kubepods: tuple[str, ...],
    output: str | None,
) -> str:
    """Fold the shim's stats, add every fresh gauge, write ``output`` atomically; return the text."""
    from runc_guard.node.metrics import export

    gauges = node_families(config_error, report, now, cgroup_root, kubepods)
    return export(settings.stats_file, gauges, now, output)


def clear_aside(settings: Settings) -> int:
    """Drop the records of stepped-aside deletes once nothing they name is left (/run stays small)."""
    from runc_guard.delete.aside import prune_aside

    return prune_aside(settings.cache_dir)


def restamp_ahead(settings: Settings, report: SweepReport) -> None:
    """Records dated ahead of the clock (a clock stepped back, or wrong when they were written): dated
    now, so that they age from here (node.record_clock). Before :func:`finish_held`, which waits on
    a held record's age."""
    from runc_guard.delete.pending import RecordRule
    from runc_guard.node.record_clock import restamp_records

    rule = RecordRule.of(settings, RealCgroupFs(), cgroup_mounts())
    for found in restamp_records(settings.pending_dir, settings.cache_dir, rule, time.time):
        report.restamped.append(found.as_dict())
        report.records_restamped += int(found.done)
        if found.why.startswith("cannot"):
            report.errors.append(f"{found.record}: dated {found.ahead_s} s ahead of the clock, {found.why}")


def finish_held(settings: Settings, report: SweepReport) -> None:
    """Memory cgroups a delete held aside that no finisher finished (it was killed, or never ran):
    reclaimed as far as they can be now, then removed (node.late_reclaim, ``final``). Only once a
    finisher would have given up on them, so the two never work on one at the same time."""
    from runc_guard.delete.memcg_hold import iter_held
    from runc_guard.delete.reclaim import PROBE_FILE, kernel_reparents
    from runc_guard.node.finisher import HELD_GIVE_UP
    from runc_guard.node.late_reclaim import step

    reparents = kernel_reparents(os.path.join(settings.cache_dir, PROBE_FILE)) is True
    for path, doc in iter_held(settings.cache_dir):
        if doc is None or time.time() - float(doc["created"]) < HELD_GIVE_UP:
            continue
        result = step(path, doc, final=True, reparents=reparents)
        report.memcg_reclaimed_kb += result.reclaimed >> 10
        if result.done:
            report.held_cleared += 1
            report.memcg_left += bool(result.left)
        else:
            report.errors.append(f"held memory cgroup {doc['held']}: {result.why}")


def send_spooled(settings: Settings) -> None:
    """Send delete entries a reporter never got to (it was killed, or fork failed), the launcher's
    step-asides among them (delete.stepaside)."""
    from runc_guard.delete.stepaside import take
    from runc_guard.reporter import drain_spool
    from runc_guard.spool import spool_dir

    drain_spool(spool_dir(settings.cache_dir), linger=0, take=take)
