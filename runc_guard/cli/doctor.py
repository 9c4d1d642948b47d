"""``runc-guardctl doctor``: which runtime would run, with which settings, and is it healthy.

Per containerd handler (``handler_routes``): what a pod without a RuntimeClass and a
pod of each handler will run, so one command shows whether runc-guard is in front.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import click

from runc_guard.delete.cgroupfs import cgroup_mounts
from runc_guard.errors import RuncGuardError
from runc_guard.settings import config_path, load, load_settings, unmapped_problem
from runc_guard.shim.runtime import installed_shim, resolve_runtime

DEFAULT_CONTAINERD_CONFIG = "/etc/containerd/config.toml"
DEFAULT_RUNTIME_ROOT = "/run/containerd/runc"
#: The CRI plugin's name per containerd config version (2: containerd 1.x, 3: 2.x).
_CRI_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}


def configured_drivers(text: str) -> dict[str, str]:
    """CRI runtime handler -> ``systemd``/``cgroupfs``, from its ``SystemdCgroup`` option.

    Only the main file is read (not ``imports``); containerd's default is
    ``SystemdCgroup = false``, i.e. the cgroupfs driver.
    """
    import tomlkit

    doc = tomlkit.parse(text).unwrap()
    version = doc.get("version", 1)
    plugin = _CRI_PLUGIN.get(version if isinstance(version, int) else 1, _CRI_PLUGIN[2])
    runtimes: Any = doc.get("plugins", {}).get(plugin, {}).get("containerd", {}).get("runtimes", {})
    drivers = {}
    if isinstance(runtimes, dict):
        for name, body in sorted(runtimes.items()):
            options = body.get("options", {}) if isinstance(body, dict) else {}
            systemd = isinstance(options, dict) and options.get("SystemdCgroup") is True
            drivers[str(name)] = "systemd" if systemd else "cgroupfs"
    return drivers


def cgroup_driver_report(containerd_config: str, runtime_root: str) -> tuple[dict[str, Any], list[str]]:
    """Which cgroup driver containers use: containerd's settings and what runc's states say."""
    from runc_guard.delete import systemd_scope

    problems: list[str] = []
    report: dict[str, Any] = {"systemd_pid1": systemd_scope.systemd_reachable()}
    try:
        with open(containerd_config) as f:
            report["containerd_handlers"] = configured_drivers(f.read())
    except FileNotFoundError:
        report["containerd_handlers"] = {}
    except (OSError, ValueError) as exc:
        problems.append(f"cannot read {containerd_config}: {exc}")
    in_use = systemd_scope.drivers_in_use(runtime_root)
    report["containers"] = {driver: len(ids) for driver, ids in sorted(in_use.items())}
    wants_systemd = in_use.get("systemd") or "systemd" in report.get("containerd_handlers", {}).values()
    if wants_systemd and not report["systemd_pid1"]:
        problems.append(
            "the systemd cgroup driver is configured or in use but systemd is not PID 1 here: "
            "scope units cannot be stopped or reset"
        )
    return report, problems


def handler_routes(containerd_config: str, invoked_shim: str) -> tuple[dict[str, Any], list[str]]:
    """Per CRI handler of the effective config (imports merged): what containerd will run.

    For a pod without a RuntimeClass (the default handler, a legacy
    ``default_runtime`` included) and for each handler: the shim type, the binary
    the shim starts and, when that is runc-guard, the runtime runc-guard runs
    behind it. The second value lists handlers that run a runc-compatible binary
    without runc-guard in front (warnings, not problems: fronting is opt-in).
    """
    from runc_guard.cli.configure import Host, config_set
    from runc_guard.node import containerd_config as cc

    files = config_set(Host("/"), containerd_config)
    handlers, default = cc.effective_handlers(files)
    settings = load(os.environ)
    routes: dict[str, Any] = {}
    unguarded = []
    for name, h in sorted(handlers.items()):
        route: dict[str, Any] = {"runtime_type": h.runtime_type, "file": h.file or "(built in)"}
        if h.legacy:
            route["legacy_table"] = h.legacy
        if h.frontable:
            route["shim_runs"] = h.runs
            if cc.is_runc_guard(h.runs, invoked_shim):
                invoked = os.path.basename(h.runs)
                unmapped = unmapped_problem(settings, invoked)
                if unmapped is not None:  # the shim fails such calls with 78: pods there cannot start
                    route["runc_guard_runs"] = "(none: unmapped, calls fail with exit 78)"
                    route["unmapped"] = unmapped
                    routes[name] = route
                    continue
                try:
                    route["runc_guard_runs"] = resolve_runtime(
                        settings.runtime_for(invoked), invoked_shim, os.environ)
                except (RuncGuardError, OSError, ValueError) as exc:
                    route["runc_guard_runs"] = f"(cannot resolve: {exc})"
            else:
                unguarded.append(name)
        else:
            route["shim_runs"] = None
        routes[name] = route
    report = {"config": containerd_config, "default_handler": default, "handlers": routes}
    warnings = [f"handler {name} runs {handlers[name].runs} without runc-guard in front "
                "(runc-guardctl configure containerd)" for name in unguarded]
    if default not in handlers:
        warnings.append(f"the default handler {default!r} is not defined: pods without a "
                        "RuntimeClass fail to start")
    return report, warnings


def route_lines(report: dict[str, Any]) -> list[str]:
    """The handler section of doctor's text output."""
    lines = [f"containerd:     {report['config']}; pods without a RuntimeClass run handler "
             f"{report['default_handler']}"]
    for name, route in report["handlers"].items():
        legacy = f" (legacy {route['legacy_table']})" if "legacy_table" in route else ""
        if route["shim_runs"] is None:
            chain = "not a runc shim: left to its own runtime"
        elif "runc_guard_runs" in route:
            chain = f"{route['shim_runs']} -> {route['runc_guard_runs']}"
        else:
            chain = f"{route['shim_runs']} (no runc-guard)"
        lines.append(f"  handler {name}{legacy}: {route['runtime_type'] or '-'}: {chain}")
    return lines


def diagnose(
    invoked_as: str,
    containerd_config: str = DEFAULT_CONTAINERD_CONFIG,
    runtime_root: str = DEFAULT_RUNTIME_ROOT,
) -> tuple[dict[str, Any], list[str]]:
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
    unmapped = unmapped_problem(load(os.environ), invoked_as)
    if unmapped is not None:
        problems.append(f"routing: {unmapped} (such calls fail with exit 78)")
    try:
        name = load(os.environ).runtime_for(invoked_as)
        runtime = resolve_runtime(name, installed_shim(), os.environ)
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
    try:
        routes, warnings = handler_routes(containerd_config, installed_shim())
        report["containerd_routes"] = routes
        report["warnings"] = warnings
        problems.extend(
            f"handler {name}: {route['unmapped']}"
            for name, route in routes["handlers"].items()
            if "unmapped" in route
        )
    except (RuncGuardError, OSError, ValueError) as exc:
        problems.append(f"cannot read containerd's config {containerd_config}: {exc}")
    driver, driver_problems = cgroup_driver_report(containerd_config, runtime_root)
    report["cgroup_driver"] = driver
    problems.extend(driver_problems)
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
    """Show the runtime runc-guard would run and its effective settings.

    Exit status 0 when healthy, 1 when a problem was found (each is listed).
    """
    report, problems = diagnose(invoked_as, containerd_config, runtime_root)
    if fmt == "json":
        click.echo(json.dumps(report, indent=2, sort_keys=True, default=str))
    else:
        click.echo(f"settings:       {report.get('settings_source', report['config_file'])}")
        click.echo(f"runtime:        {report.get('runtime', '-')}")
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
        for warning in report.get("warnings", []):
            click.echo(f"WARNING: {warning}")
        for problem in problems:
            click.echo(f"PROBLEM: {problem}")
    if problems:
        raise SystemExit(1)
