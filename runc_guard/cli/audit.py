"""``runc-guardctl audit``: read-only leak report with Node Problem Detector exit codes."""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from runc_guard.cli.scan import scan_options
from runc_guard.errors import RuncGuardError
from runc_guard.node.audit import (
    DEFAULT_PENDING_MAX_AGE,
    NPD_UNKNOWN,
    AuditReport,
)
from runc_guard.node.host import Where, audit_leniently, write_metrics

if TYPE_CHECKING:
    pass

F = TypeVar("F", bound=Callable[..., Any])


def judge_options(func: F) -> F:
    """What counts as a problem: shared with ``metrics`` (its runc_guard_audit_ok gauge)."""
    func = click.option(
        "--pending-max-age",
        default=DEFAULT_PENDING_MAX_AGE,
        show_default=True,
        type=click.FloatRange(min=0),
        metavar="SECONDS",
        help="A pending record older than this is a problem (the sweep could not finish it).",
    )(func)
    return click.option(
        "--max-leaked",
        default=0,
        show_default=True,
        type=click.IntRange(min=0),
        metavar="N",
        help="Report a problem only when more than N containers have leaked cgroups.",
    )(func)


def _print_text(report: AuditReport, quiet: bool) -> None:
    click.echo(report.message)
    if quiet:
        return
    for pod in report.leaked_pods:
        click.echo(f"leaked: {pod.containers} container(s), {pod.dirs} dirs in {pod.pod}")
    for reason, count in sorted(report.kept.items()):
        click.echo(f"in use: {count} container(s) ({reason})")
    for cid in report.processes_without_container:
        click.echo(f"processes in cgroups of {cid}, unknown to runc and containerd")
    for entry in report.states_without_bundle:
        click.echo(f"runc state without containerd bundle: {entry}")
    for entry in report.bundles_without_state:
        click.echo(f"containerd bundle without runc state: {entry}")
    for orphan in report.orphaned_states:
        click.echo(
            f"orphaned runtime state: {orphan['state_dir']} (init {orphan['init_pid']} dead, "
            f"{orphan['age_seconds']:g}s old)"
        )
    for left in report.states_left_alone:
        click.echo(f"left alone: runtime state {left['state_dir']} ({left['verdict']}, {left['owner']})")
    for path, why in sorted(report.state_errors.items()):
        click.echo(f"orphaned runtime state {path}: {why}")
    for record in report.pending:
        click.echo(f"pending: {record['container_id']} for {record['age_seconds']:g}s ({record['record']})")
    for path, why in sorted(report.pending_errors.items()):
        click.echo(f"unusable pending record {path}: {why}")
    for ahead in report.dated_ahead():
        step = ahead["dated_ahead_seconds"]
        click.echo(f"dated ahead: {ahead['kind']} record {ahead['record']} ({ahead.get('container_id', '')}) "
                   f"by {'an unknown time' if step is None else f'{step:g}s'} (the clock stepped back?): "
                   "its age is unknown until the next sweep re-stamps it")
    runtime = report.runtime
    if "error" in runtime:
        click.echo(f"runtime: {runtime['error']}")
    else:
        click.echo(f"runtime: {runtime.get('path', '-')} ({runtime.get('version', '')})")


@click.command(name="audit", short_help="Report leaked container cgroups, read-only (NPD exit codes).")
@scan_options
@judge_options
@click.option(
    "--metrics-file",
    type=click.Path(dir_okay=False),
    metavar="PATH",
    help="Also write Prometheus metrics here, atomically (e.g. node_exporter's "
    "textfile directory/runc_guard.prom).",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option(
    "-q", "--quiet", is_flag=True, help="Print only the one-line message (what Node Problem Detector shows)."
)
def audit_cmd(
    where: Where,
    max_leaked: int,
    pending_max_age: float,
    metrics_file: str | None,
    fmt: str,
    quiet: bool,
) -> None:
    """Report leaked container cgroups per pod without changing anything.

    Also lists runc state ids without a containerd bundle (and the reverse),
    the shim's pending records and their age, orphaned runtime state (init
    dead, no bundle, no live shim), and the runtime runc-guard fronts.
    "Leaked" means exactly what `runc-guardctl sweep` would remove.

    Exit status follows Node Problem Detector's custom plugins: 0 OK, 1 problem
    (leaked cgroups, orphaned runtime state, stale or unusable pending records, records dated
    ahead of the clock), 2 unknown (the audit
    could not run, e.g. from a PID namespace that is not the runtime's); the first output line is
    the message.
    """
    try:
        settings, config_error, report, code, now = audit_leniently(where, max_leaked, pending_max_age)
    except RuncGuardError as exc:
        click.echo(f"UNKNOWN: {exc}")
        click.echo(f"runc-guardctl audit: {exc}", err=True)
        raise SystemExit(NPD_UNKNOWN) from None
    except Exception as exc:  # noqa: BLE001 -- a bug must read "unknown" to NPD, never "problem" (exit 1)
        click.echo(traceback.format_exc(), err=True)
        click.echo(f"UNKNOWN: internal error: {type(exc).__name__}: {exc}")
        raise SystemExit(NPD_UNKNOWN) from None
    if metrics_file is not None:
        try:
            write_metrics(
                settings, config_error, report, now, where.cgroup_root, where.kubepods, metrics_file
            )
        except OSError as exc:
            click.echo(f"warning: cannot write metrics: {exc}", err=True)
    if fmt == "json":
        click.echo(json.dumps(report.as_dict(), indent=1, sort_keys=True))
    else:
        _print_text(report, quiet)
    raise SystemExit(code)
