"""``runc-guardctl sweep``: remove leaked container cgroups, gently, in batches."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import click
from click.core import ParameterSource

from runc_guard.cli.scan import F, scan_options
from runc_guard.node.host import (
    Where,
    clear_aside,
    finish_held,
    host_fs,
    require_host_pid_namespace,
    restamp_ahead,
    runtime_dirs,
    scan,
    send_spooled,
)
from runc_guard.node.orphans import DEFAULT_REDRIVE_TIMEOUT
from runc_guard.node.pacing import PACING_MODES, PacingSettings
from runc_guard.node.sweep import (
    DEFAULT_BATCH,
    DEFAULT_MAX_SLOWDOWN,
    DEFAULT_MAX_SYS_PERCENT,
    DEFAULT_PAUSE,
    Sweeper,
    SweepOptions,
    SweepReport,
    sweep_lock,
)
from runc_guard.settings import Settings, load_settings

# -- pacing options (docs/sweep-pacing.md) -------------------------------------------
#: The mode used when --pacing is not given. adaptive removes the incident's 81,470
#: directories in <= 60 s with the probe's p99 <= 2x idle on a 2-core node since the sweep
#: reads each directory once and clears v1 cpusets' sched_load_balance before their rmdir
#: (docs/sweep-pacing.md); fixed stays available (--pacing fixed).
DEFAULT_PACING = "adaptive"
_PACING_DEFAULTS = PacingSettings()


def pacing_options(func: F) -> F:
    """--pacing and the adaptive pace's limits; --batch/--pause are the fixed mode's."""
    options = [
        click.option("--pacing", type=click.Choice(PACING_MODES), default=DEFAULT_PACING,
                     show_default=True,
                     help="adaptive: batch size and pause follow what the node feels (a canary "
                          "mkdir+rmdir, the sweep's own rmdir latency, PSI, sys%), and removing takes "
                          "at most a fifth of the time; fixed: --batch dirs, then --pause seconds."),
        click.option("--max-latency-ratio", "canary_ratio", default=_PACING_DEFAULTS.canary_ratio,
                     show_default=True, type=click.FloatRange(min=1), metavar="RATIO",
                     help="adaptive: back off while a canary mkdir+rmdir takes more than RATIO "
                          "times its idle p90."),
        click.option("--max-batch", default=_PACING_DEFAULTS.max_batch, show_default=True,
                     type=click.IntRange(min=1), metavar="DIRS",
                     help="adaptive: never more directories than this per batch."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def pacing_fields(pacing: str, canary_ratio: float, max_batch: int) -> dict[str, Any]:
    """SweepOptions fields from the pacing options."""
    settings = replace(_PACING_DEFAULTS, canary_ratio=canary_ratio, max_batch=max_batch,
                       start_batch=min(_PACING_DEFAULTS.start_batch, max_batch),
                       min_batch=min(_PACING_DEFAULTS.min_batch, max_batch))
    return {"pacing": pacing, "pacing_settings": settings}


# -- end of pacing options -----------------------------------------------------------


def _print_text(report: SweepReport) -> None:
    for entry in report.containers:
        if entry["action"] == "would_remove":
            click.echo(f"would remove {entry['id']}  ({entry['dirs']} dirs, {entry['pod']})")
        elif entry["action"] == "would_redrive":
            click.echo(f"would remove {entry['id']}  ({entry['dirs']} dirs, {entry['pod']}) "
                       "after its runtime's delete --force (orphaned runtime state)")
    for rerun in report.redriven:
        status = rerun["error"] or f"exit {rerun['exit_code']}"
        left = "state kept" if rerun["state_left"] else "state gone"
        click.echo(f"re-ran {' '.join(rerun['argv'])}: {status}, {left}, {rerun['seconds']:g}s")
    verb = "would remove" if report.dry_run else "removed"
    done = report.candidates if report.dry_run else report.removed
    dirs = "" if report.dry_run else f" ({report.dirs_removed} dirs)"
    kept = ", ".join(f"{reason} {n}" for reason, n in sorted(report.kept.items())) or "none"
    click.echo(
        f"found {report.found} container cgroup(s) in {len(report.hierarchies)} hierarchies; "
        f"{verb} {done}{dirs}; kept: {kept}; gone meanwhile {report.gone}; "
        f"pending records cleared {report.records_cleared}, aside records {report.aside_cleared}"
    )
    if not report.dry_run:
        click.echo(
            f"{len(report.batches)} batch(es) ({report.pacing} pacing), slowed down "
            f"{report.slowed:g}s for {'the node' if report.pacing == 'adaptive' else 'high sys%'}, "
            f"took {report.duration:g}s"
        )
    for found in report.restamped:
        what = "re-stamped to now" if found["done"] else f"not re-stamped ({found['why']})"
        click.echo(f"{found['kind']} record {found['record']} ({found['container_id']}) was dated "
                   f"{_seconds(found['ahead_s'])} ahead of the clock (a clock step): {what}")
    for error in report.errors:
        click.echo(f"ERROR: {error}", err=True)


def _seconds(value: float | None) -> str:
    return "an unknown time" if value is None else f"{value:g} s"


def _progress(enabled: bool) -> Callable[[int, int], None] | None:
    """A one-line counter on a terminal, updated a few times a second at most."""
    if not enabled:
        return None
    last = [0.0]

    def show(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] >= 0.2:
            last[0] = now
            end = "\n" if done == total else ""
            click.echo(f"\rremoving: {done}/{total} containers", nl=False, err=True)
            if end:
                click.echo("", err=True)

    return show


@click.command(short_help="Remove leaked container cgroups in gentle batches.")
@scan_options
@click.option("--batch", default=DEFAULT_BATCH, show_default=True, type=click.IntRange(min=1),
              metavar="DIRS", help="--pacing fixed: remove about this many cgroup directories, then pause "
                                   "(whole containers only; every rmdir takes cgroup_mutex).")
@click.option("--pause", default=DEFAULT_PAUSE, show_default=True, type=click.FloatRange(min=0),
              metavar="SECONDS", help="--pacing fixed: sleep between batches so the kernel can finish "
                                      "tearing down.")
@click.option("--max-sys-percent", default=DEFAULT_MAX_SYS_PERCENT, show_default=True,
              type=click.FloatRange(min=0, max=100), metavar="PERCENT",
              help="While the node's system CPU time (from /proc/stat) is above this, wait longer "
                   "between batches.")
@click.option("--max-slowdown", default=DEFAULT_MAX_SLOWDOWN, show_default=True,
              type=click.FloatRange(min=0), metavar="SECONDS",
              help="Longest extra wait between two batches while sys% stays high.")
@click.option("--redrive-timeout", default=DEFAULT_REDRIVE_TIMEOUT, show_default=True,
              type=click.FloatRange(min=0.1), metavar="SECONDS",
              help="Longest a re-run of the runtime's delete --force for orphaned state may take "
                   "(then it is killed and the state kept for the next sweep).")
@click.option("--dry-run", is_flag=True, help="Remove nothing; list what would be removed.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="json: the full report, with per-batch timings.")
@pacing_options
def sweep(
    where: Where,
    batch: int,
    pause: float,
    max_sys_percent: float,
    max_slowdown: float,
    redrive_timeout: float,
    dry_run: bool,
    fmt: str,
    **pacing: Any,
) -> None:
    """Remove container cgroups that leaked under kubepods, in every hierarchy.

    A container has one cgroup per hierarchy, named by its 64-hex id (bare, or
    in a cri-containerd-, docker- or crio-<id>.scope). It is removed only if,
    checked again right before its removal, every directory of it and every
    child is empty in every hierarchy, runc has no state for it, containerd has
    no bundle for it, and every directory is older than --min-age. Pod- and
    QoS-level cgroups are never touched. Records the shim left in pending_dir
    are finished the same way, and log entries of deletes still in the spool
    are sent.

    Runtime state whose init is dead (pid gone or reused), that no containerd
    bundle and no live shim owns and that is older than --min-age is orphaned
    (runc >= 1.2 keeps its state when its delete fails; nobody re-runs it on
    containerd's dead-shim path): the sweep re-runs the runtime's own
    `delete --force` for it (the pending record's runtime, else settings'
    runtime; crun for crun's state), then removes what is left as above.

    Only containerd's state is re-driven: its namespaced root (--runtime-root),
    plus roots named with --orphan-root, where state showing another manager
    (podman, CRI-O) or naming no owner at all is left alone. The flat roots
    (--state-root: /run/runc, /run/crun) only keep their containers.

    Try --dry-run first. Exit status 0 when the sweep ran (kept cgroups and
    errors are reported, not fatal); non-zero only when it could not run: 66 no
    cgroup hierarchy, 73 another sweep is running, 77 run from a PID namespace
    that is not the runtime's (every init would look dead: run it on the host
    or with hostPID), 78 bad settings.
    """
    _warn_fixed_only(click.get_current_context(), pacing["pacing"])
    require_host_pid_namespace("sweep")
    settings = load_settings()
    fs = host_fs(settings)  # its reclaim honours the memcg probe's answer
    runtime = runtime_dirs(settings, where, redrive_timeout)
    discovery = scan(settings, where, fs, runtime)
    options = SweepOptions(
        where.min_age, batch, pause, max_sys_percent, max_slowdown, dry_run, **pacing_fields(**pacing)
    )
    sweeper = Sweeper(
        fs,
        runtime,
        options,
        progress=_progress(fmt == "text" and not dry_run and sys.stderr.isatty()),
    )
    if dry_run:
        report = sweeper.run(discovery)
    else:
        lock = os.path.join(os.path.dirname(settings.pending_dir), "sweep.lock")
        with sweep_lock(lock):
            report = sweeper.run(discovery)
            restamp_ahead(settings, report)
            report.aside_cleared = clear_aside(settings)
            finish_held(settings, report)
        _count(settings, report)
        _journal(settings, report)
        send_spooled(settings)
    if fmt == "json":
        click.echo(json.dumps(report.as_dict(), indent=1, sort_keys=True))
    else:
        _print_text(report)


def _warn_fixed_only(ctx: click.Context, pacing: str) -> None:
    """--batch and --pause pace only the fixed mode: say so instead of ignoring them silently."""
    given = [
        f"--{name}"
        for name in ("batch", "pause")
        if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT
    ]
    if given and pacing != "fixed":
        click.echo(
            f"warning: {' and '.join(given)} only apply to --pacing fixed; this sweep paces itself "
            f"({pacing}; --max-batch bounds its batches)",
            err=True,
        )


#: At most this many container ids in the entry (~70 bytes each): a datagram, not megabytes.
MAX_JOURNAL_IDS = 500
#: The report's scalar facts that the sweep's canonical journal entry carries as they are.
_JOURNAL_FACTS = ("found", "candidates", "removed", "dirs_removed", "gone", "records_cleared",
                  "aside_cleared", "memcg_reclaimed_kb", "memcg_left", "pacing", "records_restamped")


def journal_entry(report: SweepReport) -> dict[str, Any]:
    """The sweep's one canonical entry (``EVENT=sweep``): what it removed and why it kept the rest."""
    entry: dict[str, Any] = {name: getattr(report, name) for name in _JOURNAL_FACTS}
    entry.update(
        kept=dict(report.kept),
        redriven=len(report.redriven),
        errors=len(report.errors),
        duration_ms=round(report.duration * 1000),
        slowed_ms=round(report.slowed * 1000),
    )
    removed = [c["id"] for c in report.containers if c.get("action") == "removed"]
    # The incident's cleanup removed 8147 containers: the ids of the first ones, the count of all.
    entry["removed_ids"] = removed[:MAX_JOURNAL_IDS]
    if len(removed) > MAX_JOURNAL_IDS:
        entry["removed_ids_truncated"] = True
    if report.restamped:
        # A clock stepped back: how far (the largest step a record shows) and which records.
        steps = [r["ahead_s"] for r in report.restamped if r["ahead_s"] is not None]
        entry["clock_step_s"] = max(steps) if steps else None
        entry["restamped"] = [f"{r['kind']}:{r['record']}" for r in report.restamped[:MAX_JOURNAL_IDS]]
    if report.errors:
        entry["reason"] = report.errors[0]
    return entry


def _journal(settings: Settings, report: SweepReport) -> None:
    """One entry per sweep to journald (the fallback file without it), through structlog."""
    from runc_guard.logs import operator_logger

    log = operator_logger(settings.journal_socket, settings.log_file, settings.log_level)
    facts = journal_entry(report)
    (log.warning if report.errors or report.restamped else log.info)("sweep", **facts)


def _count(settings: Settings, report: SweepReport) -> None:
    """Add the sweep to the metrics counters; a failure here must not fail the sweep."""
    from runc_guard.node.metrics import add_sweep, state_path

    try:
        add_sweep(state_path(settings.stats_file), report.as_dict(), time.time())
    except OSError as exc:
        click.echo(f"warning: cannot update metrics state: {exc}", err=True)
