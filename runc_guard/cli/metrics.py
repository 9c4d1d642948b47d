"""``runc-guardctl metrics``: Prometheus text for node_exporter's textfile collector."""

from __future__ import annotations

import click

from runc_guard.cli.audit import judge_options
from runc_guard.cli.scan import scan_options
from runc_guard.node.host import Where, audit_leniently, write_metrics


@click.command(name="metrics", short_help="Write Prometheus metrics for node_exporter's textfile collector.")
@scan_options
@judge_options
@click.option(
    "-o",
    "--output",
    default="-",
    show_default=True,
    metavar="PATH",
    help="Write here atomically (temp file + rename), e.g. "
    "/var/lib/node_exporter/textfile_collector/runc_guard.prom; - for stdout.",
)
def metrics_cmd(
    where: Where,
    max_leaked: int,
    pending_max_age: float,
    output: str,
) -> None:
    """Export delete, sweep, leak and kernel cgroup metrics in Prometheus text format.

    Folds the shim's per-delete lines (settings: stats_file) into counters kept
    next to it (exactly once, no daemon needed), adds the sweep's counters, the
    gauges of a fresh audit (leaked cgroups per pod, orphaned runtime state,
    pending records), the kernel's own counters (/proc/cgroups, cgroup.stat:
    dying cgroups) and whether the settings are valid. Run it from a timer;
    `runc-guardctl audit --metrics-file PATH` does the same as a side job.
    An invalid settings file still yields metrics (runc_guard_config_valid 0).
    """
    target = None if output == "-" else output
    # As the delete path does: valid keys apply, invalid ones keep their defaults and
    # are reported (runc_guard_config_valid 0); the audit's gauges still come out.
    settings, config_error, report, _code, now = audit_leniently(where, max_leaked, pending_max_age)
    text = write_metrics(settings, config_error, report, now, where.cgroup_root, where.kubepods, target)
    if output == "-":
        click.echo(text, nl=False)
    else:
        click.echo(f"wrote {output}", err=True)
