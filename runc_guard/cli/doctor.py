"""``runc-guardctl doctor``: which runtime would run, with which settings, and is it healthy.

What it finds is ``runc_guard.node.doctor``'s; this module only prints it.
"""

from __future__ import annotations

import json
import os
from typing import Any

import click

from runc_guard.node.doctor import DEFAULT_CONTAINERD_CONFIG, DEFAULT_RUNTIME_ROOT, diagnose, route_lines
from runc_guard.runtime import installed_shim


def print_kernel(features: list[dict[str, Any]]) -> None:
    """doctor's kernel section: one line per feature."""
    release = os.uname().release
    for entry in features:
        state = {True: "yes", False: "MISSING", None: "unknown"}[entry["present"]]
        line = f"kernel {release}: {entry['name']:<18} {state}"
        if entry["present"] is not True:
            line += f" -> {entry['without']}"
        click.echo(line)



@click.command()
@click.option(
    "--as",
    "invoked_as",
    default="runc-guard",
    show_default=True,
    help="Resolve the runtime as if the shim were invoked under this name.",
)
@click.option(
    "--containerd-config",
    default=DEFAULT_CONTAINERD_CONFIG,
    show_default=True,
    help="containerd's config: its runc handlers' SystemdCgroup tells the configured cgroup driver.",
)
@click.option(
    "--runtime-root",
    default=DEFAULT_RUNTIME_ROOT,
    show_default=True,
    help="runc's state root (<namespace>/<id>/state.json): the driver each container really used.",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def doctor(invoked_as: str, containerd_config: str, runtime_root: str, fmt: str) -> None:
    """Show the runtime runc-guard would run, its effective settings, and the kernel's features.

    Exit status 0 when healthy, 1 when a problem was found (each is listed).
    A kernel feature that is missing is a warning: runc-guard degrades (README,
    "Minimum kernel"), it does not stop.
    """
    report, problems = diagnose(invoked_as, containerd_config, runtime_root)
    if fmt == "json":
        click.echo(json.dumps(report, indent=2, sort_keys=True, default=str))
    else:
        click.echo(f"settings:       {report.get('settings_source', report['config_file'])}")
        click.echo(f"runtime:        {report.get('runtime', '-')}")
        click.echo(f"front door:     {report['front_door']} ({installed_shim()})")
        click.echo(f"runtime version: {report.get('runtime_version', '-')}")
        click.echo(f"journald:       {'yes' if report.get('journald') else 'no'}")
        for key, value in sorted(report.get("settings", {}).items()):
            click.echo(f"  {key} = {value}")
        driver = report["cgroup_driver"]
        handlers = ", ".join(f"{h}={d}" for h, d in driver["containerd_handlers"].items()) or "-"
        using = ", ".join(f"{d} {n}" for d, n in driver["containers"].items()) or "none"
        click.echo(f"cgroup driver:  containerd handlers {handlers}; containers by driver: {using}")
        click.echo(f"systemd PID 1:  {'yes' if driver['systemd_pid1'] else 'no'}")
        for mount, fstype in sorted(report["cgroup_mounts"].items()):
            click.echo(f"cgroup mount:   {mount} ({fstype})")
        if "containerd_routes" in report:
            for line in route_lines(report["containerd_routes"]):
                click.echo(line)
        print_kernel(report["kernel"])
        reparenting = report["memcg_reparenting"]
        state = {True: "yes", False: "no", None: "unknown"}[reparenting["reparents"]]
        click.echo(f"kernel {os.uname().release}: memcg reparenting {state} -> {reparenting['meaning']}"
                   f" ({reparenting['how']})")
        for warning in report.get("warnings", []):
            click.echo(f"WARNING: {warning}")
        for problem in problems:
            click.echo(f"PROBLEM: {problem}")
    if problems:
        raise SystemExit(1)
