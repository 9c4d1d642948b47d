"""``runc-guardctl doctor``: which runtime would run, with which settings, and is it healthy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import click

from runc_guard.cgroupfs import cgroup_mounts
from runc_guard.config import load_settings
from runc_guard.errors import RuncGuardError
from runc_guard.runtime import resolve_runtime, runtime_name_for
from runc_guard.settings_file import config_path, read_settings_file


def _self_path() -> str:
    """The installed shim next to this tool, so loop detection matches what containerd runs."""
    sibling = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "runc-guard")
    return sibling if os.path.exists(sibling) else sys.argv[0]


def diagnose(invoked_as: str) -> tuple[dict[str, Any], list[str]]:
    """Facts about this node's runc-guard and a list of problems found (empty when healthy)."""
    problems: list[str] = []
    report: dict[str, Any] = {"config_file": config_path(os.environ), "invoked_as": invoked_as}
    try:
        settings = load_settings()
        report["settings"] = settings.as_dict()
        report["settings_source"] = settings.source
    except RuncGuardError as exc:
        problems.append(str(exc))
        settings = None
    try:
        raw = read_settings_file(config_path(os.environ), None)
        name = runtime_name_for(invoked_as, raw, os.environ)
        runtime = resolve_runtime(name, _self_path(), os.environ)
        report["runtime"] = runtime
        version = subprocess.run(
            [runtime, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
        report["runtime_version"] = version.stdout.splitlines()[0] if version.stdout else ""
    except (RuncGuardError, OSError, ValueError, TypeError, subprocess.SubprocessError) as exc:
        problems.append(f"runtime: {exc}")
    mounts = cgroup_mounts()
    report["cgroup_mounts"] = mounts
    if not mounts:
        problems.append("no cgroup filesystem is mounted")
    if settings is not None:
        report["journald"] = os.path.exists(settings.journal_socket)
    report["problems"] = problems
    return report, problems


@click.command()
@click.option(
    "--as",
    "invoked_as",
    default="runc-guard",
    show_default=True,
    help="Resolve the runtime as if the shim were invoked under this name.",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def doctor(invoked_as: str, fmt: str) -> None:
    """Show the runtime runc-guard would run and its effective settings.

    Exit status 0 when healthy, 1 when a problem was found (each is listed).
    """
    report, problems = diagnose(invoked_as)
    if fmt == "json":
        click.echo(json.dumps(report, indent=2, sort_keys=True, default=str))
    else:
        click.echo(f"settings:       {report.get('settings_source', report['config_file'])}")
        click.echo(f"runtime:        {report.get('runtime', '-')}")
        click.echo(f"runtime version: {report.get('runtime_version', '-')}")
        click.echo(f"journald:       {'yes' if report.get('journald') else 'no'}")
        for key, value in sorted(report.get("settings", {}).items()):
            click.echo(f"  {key} = {value}")
        for mount, fstype in sorted(report["cgroup_mounts"].items()):
            click.echo(f"cgroup mount:   {mount} ({fstype})")
        for problem in problems:
            click.echo(f"PROBLEM: {problem}")
    if problems:
        raise SystemExit(1)
