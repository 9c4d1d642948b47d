"""``runc-guardctl configure containerd`` on containerd 2.1's own default config (version 3).

containerd 2.x moved the CRI runtimes to ``plugins.'io.containerd.cri.v1.runtime'``;
what counts is what containerd 2.1 (Debian sid's, fetched by labkit.runtimes) itself
makes of the file, so the check is its own ``config dump``.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import tomlkit
from click.testing import CliRunner

from labkit import runtimes
from runc_guard.cli import cli

CRI3 = "io.containerd.cri.v1.runtime"


def _containerd(binary: str, *args: str) -> str:
    return subprocess.run([binary, *args], capture_output=True, text=True, check=True, timeout=60).stdout


def _runc_options(text: str) -> dict[str, Any]:
    doc = tomlkit.parse(text).unwrap()
    options: dict[str, Any] = doc["plugins"][CRI3]["containerd"]["runtimes"]["runc"]["options"]
    return options


def test_configure_round_trip_on_containerd_2_1(tmp_path: Any, shim_binary: str) -> None:
    """On 2.1's `config default`: one BinaryName changes (seen by 2.1's `config dump`),
    SystemdCgroup stays as it was, a second run writes nothing, revert restores the bytes."""
    containerd = runtimes.require(runtimes.CONTAINERD_21)
    config = os.path.join(str(tmp_path), "config.toml")
    default = _containerd(containerd, "config", "default")
    with open(config, "w") as f:
        f.write(default)
    settings = os.path.join(str(tmp_path), "runc-guard.toml")
    argv = ["configure", "containerd", "--config", config, "--binary", shim_binary,
            "--settings", settings, "--restart-command", "false"]
    first = CliRunner().invoke(cli, argv)
    assert first.exit_code == 0, first.output
    dumped = _runc_options(_containerd(containerd, "--config", config, "config", "dump"))
    assert dumped["BinaryName"] == shim_binary
    assert dumped["SystemdCgroup"] == _runc_options(default)["SystemdCgroup"]
    with open(config) as f:
        changed = [line for line in f.read().splitlines() if line not in default.splitlines()]
    assert len(changed) == 1 and "BinaryName" in changed[0], changed
    with open(config, "rb") as f:
        configured = f.read()
    again = CliRunner().invoke(cli, argv)
    assert again.exit_code == 0, again.output
    with open(config, "rb") as f:
        assert f.read() == configured
    revert = CliRunner().invoke(cli, [*argv, "--revert"])
    assert revert.exit_code == 0, revert.output
    with open(config) as f:
        assert f.read() == default
