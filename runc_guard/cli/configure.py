"""``runc-guardctl configure containerd``: front containerd's runc handlers with runc-guard.

The change is computed in ``runc_guard.node.containerd_config``; it is written, backed up,
recorded and reverted by ``runc_guard.node.configure``. This module is the command.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import click

from runc_guard.errors import ContainerdConfigError
from runc_guard.node import k3s
from runc_guard.node.configure import (
    DEFAULT_CONTAINERD_CONFIG,
    DEFAULT_RESTART,
    Host,
    apply_change,
    compute_change,
    decode_text,
    describe_plan,
    detect_config_version,
    detect_generated,
    load_state,
    revert,
    unified_diff,
)
from runc_guard.runtime import installed_shim
from runc_guard.settings import config_path


def _restart(command: str) -> None:
    click.echo(f"restarting containerd: {command}")
    result = subprocess.run(shlex.split(command), check=False)
    if result.returncode != 0:
        raise ContainerdConfigError(f"{command!r} exited {result.returncode}")


@click.group()
def configure() -> None:
    """Put runc-guard in front of a container manager's runtime."""


@configure.command("containerd")
@click.option("--config", "config", default=DEFAULT_CONTAINERD_CONFIG, show_default=True,
              help="containerd's config file (its imports are followed).")
@click.option("--dry-run", is_flag=True, help="Print the change as a diff; touch nothing.")
@click.option("--revert", "do_revert", is_flag=True,
              help="Restore every file exactly as it was before the first configure.")
@click.option("--force", is_flag=True,
              help="With --revert: restore even files edited since configure.")
@click.option("--runtime", "runtimes", multiple=True, metavar="NAME",
              help="Handler to front (repeatable). Default: runc plus every handler that "
                   "runs a runc-compatible binary (runc shim v1/v2, legacy v1 runtime), "
                   "whatever its BinaryName; other handlers are listed and left alone.")
@click.option("--binary", default=None, metavar="PATH",
              help="runc-guard as the host sees it. Default: the one next to this tool.")
@click.option("--settings", "settings_path", default=None, metavar="PATH",
              help="runc-guard's settings file for [runtimes]. Default: "
                   "$RUNC_GUARD_CONFIG or /etc/runc-guard/config.toml.")
@click.option("--config-version", type=click.Choice(["auto", "2", "3"]), default="auto",
              show_default=True,
              help="Layout for a missing or empty config (auto: from `containerd --version`).")
@click.option("--host-root", default="/", show_default=True, metavar="DIR",
              help="Where the host's / is mounted (DaemonSet installer).")
@click.option("--restart", is_flag=True, help="Restart containerd if the config changed.")
@click.option("--restart-command", default=None, metavar="CMD",
              help=f"Default: {DEFAULT_RESTART!r}; on k3s/RKE2 their own unit "
                   "(k3s, k3s-agent, rke2-server or rke2-agent).")
@click.option("--restart-via", default=None, metavar="PREFIX",
              help="Run the restart command through this command (the DaemonSet installer: "
                   "nsenter into the host's namespaces), keeping the k3s/RKE2 unit choice.")
def containerd(
    *, config: str, dry_run: bool, do_revert: bool, force: bool, runtimes: tuple[str, ...],
    binary: str | None, settings_path: str | None, config_version: str, host_root: str,
    restart: bool, restart_command: str | None, restart_via: str | None,
) -> None:
    """Set options.BinaryName of containerd's runc handlers to runc-guard.

    Handles config version 1-3 (containerd 1.6/1.7 and 2.x), a missing or empty
    file, imports, legacy default_runtime tables, and k3s/RKE2's generated config
    (the change goes to their drop-in directory or template, never the generated
    file). A handler that already ran another runtime (e.g.
    nvidia-container-runtime) gets a per-handler link runc-guard-<handler> and a
    [runtimes] entry, so runc-guard runs that runtime for it. Idempotent; keeps a
    timestamped backup; never restarts containerd unless --restart is given.
    """
    host = Host(os.path.abspath(host_root))
    config = os.path.abspath(config)
    if do_revert:
        if dry_run:
            state = load_state(host, config)
            click.echo(json.dumps(state, indent=2) if state else "nothing to revert")
            return
        had_record = load_state(host, config) is not None
        generated = detect_generated(host, config, decode_text(host.read(config), config))
        for line in revert(host, config, force):
            click.echo(line)
        command = _via(restart_via, restart_command or restart_for(host, generated, restart))
        _report_restart(restart, command, changed=had_record)
        return
    binary = binary or installed_shim()
    settings_path = settings_path or config_path(os.environ)
    version = detect_config_version() if config_version == "auto" else int(config_version)
    change = compute_change(
        host=host, main=config, binary=binary, runtimes=runtimes,
        settings_path=settings_path, default_version=version,
    )
    for line in describe_plan(change.plan):
        click.echo(line)
    if dry_run:
        for path, (before, after) in change.plan.edits.items():
            click.echo(unified_diff(path, before, after), nl=False)
        if change.settings_changed:
            click.echo(unified_diff(settings_path, change.settings_before, change.settings_after),
                       nl=False)
        for link, target in change.links.items():
            click.echo(f"would link {link} -> {target}")
        click.echo("dry run: nothing written" if change.anything else "nothing to change")
        return
    if change.anything and not os.access(host.path(binary), os.X_OK):
        raise ContainerdConfigError(f"--binary {binary} is not an executable file on the host")
    if not change.anything:
        click.echo("containerd is already configured: nothing written, no restart needed")
        return
    command = _via(restart_via, restart_command or restart_for(host, change.generated, restart))
    for line in apply_change(host, config, change):
        click.echo(line)
    _report_restart(restart, command, changed=change.plan.changed)


def _via(prefix: str | None, command: str) -> str:
    """``command`` run through ``prefix`` (e.g. ``nsenter -t 1 ... --``), when one is given."""
    return f"{prefix} {command}" if prefix else command


def restart_for(host: Host, generated: k3s.Generated | None, restart: bool) -> str:
    """containerd's restart command: k3s and RKE2 run it inside their own unit."""
    if generated is None:
        return DEFAULT_RESTART
    units = k3s.unit_files(lambda p: os.path.exists(host.path(p)), generated.program)
    if len(units) == 1:
        return f"systemctl restart {units[0]}"
    if restart:
        raise ContainerdConfigError(
            f"{generated.program} embeds containerd: restart its unit, but found "
            f"{'both ' + ' and '.join(units) if units else 'none of ' + ', '.join(generated.units)}"
            ": name it with --restart-command"
        )
    return " or ".join(f"systemctl restart {u}" for u in (units or generated.units))


def _report_restart(restart: bool, command: str, changed: bool) -> None:
    if not changed:
        click.echo("containerd config unchanged: no restart needed")
    elif restart:
        _restart(command)
    else:
        click.echo(
            "containerd must be restarted to pick this up (it reads its config only at start; "
            f"running containers keep the runtime they started with): {command}, "
            "or re-run with --restart"
        )

