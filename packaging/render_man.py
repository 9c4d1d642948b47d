"""Render runc-guardctl(8) from the click commands' own help (so the page never drifts)."""

from __future__ import annotations

import sys

import click

from runc_guard.cli import cli


def _escape(text: str) -> str:
    return "\n".join(
        ("\\&" + line if line.startswith((".", "'")) else line).replace("\\", "\\\\")
        for line in text.splitlines()
    )


def _walk(command: click.Command, path: list[str]) -> list[tuple[str, str]]:
    with click.Context(
        command, info_name=" ".join(path), help_option_names=["-h", "--help"]
    ) as ctx:
        pages = [(" ".join(path), command.get_help(ctx))]
    if isinstance(command, click.Group):
        for name in sorted(command.list_commands(ctx)):
            sub = command.get_command(ctx, name)
            if sub is not None:
                pages += _walk(sub, [*path, name])
    return pages


def main() -> None:
    version = sys.argv[1] if len(sys.argv) > 1 else ""
    out = [
        f'.TH RUNC-GUARDCTL 8 "" "runc-guard {version}" "System Administration"',
        ".SH NAME",
        "runc-guardctl \\- inspect, configure and operate runc-guard on this node",
        ".SH DESCRIPTION",
        "Each command's --help, as printed by the installed tool.",
    ]
    for name, text in _walk(cli, ["runc-guardctl"]):
        out += [f".SH {name.upper()}", ".nf", _escape(text), ".fi"]
    out += [".SH SEE ALSO", ".BR runc-guard (8)"]
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
