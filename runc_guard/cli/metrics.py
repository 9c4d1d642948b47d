"""``runc-guardctl metrics``: Prometheus text for node_exporter's textfile collector."""

from __future__ import annotations

import click

from runc_guard.audit import gauges
from runc_guard.cli.audit import judge_options, run_audit
from runc_guard.cli.sweep import scan_options
from runc_guard.config import load_settings
from runc_guard.metrics import export


@click.command(name="metrics", short_help="Write Prometheus metrics for node_exporter's textfile collector.")
@scan_options
@judge_options
@click.option("-o", "--output", default="-", show_default=True, metavar="PATH",
              help="Write here atomically (temp file + rename), e.g. "
                   "/var/lib/node_exporter/textfile_collector/runc_guard.prom; - for stdout.")
def metrics_cmd(
    cgroup_root: str,
    kubepods: tuple[str, ...],
    runtime_root: str,
    bundle_root: str,
    state_roots: tuple[str, ...],
    orphans: bool,
    min_age: float,
    max_leaked: int,
    pending_max_age: float,
    output: str,
) -> None:
    """Export delete, sweep and leak metrics in Prometheus text format.

    Folds the shim's per-delete lines (settings: stats_file) into counters kept
    next to it (exactly once, no daemon needed), adds the sweep's counters and
    the gauges of a fresh audit (leaked cgroups, pending records). Run it from a
    timer; `runc-guardctl audit --metrics-file PATH` does the same as a side job.
    """
    settings = load_settings()
    report, _code, now = run_audit(
        settings, cgroup_root, kubepods, runtime_root, bundle_root, state_roots, orphans,
        min_age, max_leaked, pending_max_age,
    )
    text = export(settings.stats_file, gauges(report, now), now, None if output == "-" else output)
    if output == "-":
        click.echo(text, nl=False)
    else:
        click.echo(f"wrote {output}", err=True)
