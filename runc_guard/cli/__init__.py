"""``runc-guardctl``: the operator's tool (doctor, sweep, audit, metrics, configure).

Separate from the shim on purpose: click and friends load here, never on the
runtime's hot path. Each subcommand lives in its own module and is registered
below; every known error maps to its documented exit code in one place.
"""

from __future__ import annotations

import sys

import click

from runc_guard import __version__
from runc_guard.cli.audit import audit_cmd
from runc_guard.cli.configure import configure
from runc_guard.cli.doctor import doctor
from runc_guard.cli.metrics import metrics_cmd
from runc_guard.cli.sweep import sweep
from runc_guard.errors import RuncGuardError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="runc-guardctl")
def cli() -> None:
    """Inspect and operate runc-guard on this node.

    runc-guard itself is the binary containerd runs as its runtime (BinaryName);
    this tool shows its effective settings, cleans cgroups that leaked before it
    was installed, and exports metrics. Shell completion:
    eval "$(_RUNC_GUARDCTL_COMPLETE=bash_source runc-guardctl)".
    """


cli.add_command(doctor)
cli.add_command(configure)
cli.add_command(sweep)
cli.add_command(audit_cmd)
cli.add_command(metrics_cmd)


def main() -> None:
    """Console entry point: known errors become one stderr line and their exit code."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(130)
    except RuncGuardError as exc:
        click.echo(f"runc-guardctl: {exc}", err=True)
        sys.exit(exc.exit_code)
