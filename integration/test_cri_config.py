"""The CRI lab's containerd config: runc-guardctl configure containerd on that containerd's own
``config default`` (v2 for 1.6.20, v3 for 2.2.2), as containerd itself reads it back."""

from __future__ import annotations

import difflib
import os
import subprocess

import pytest
import tomlkit

from labkit import containerd as cl
from labkit import cri as cr
from labkit import prereq, runtimes

PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}


def _dump(build: cl.Build, config: str) -> dict[str, object]:
    """``containerd config dump``: the config as containerd merges and reads it."""
    out = subprocess.run(
        [build.containerd, "--config", config, "config", "dump"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return tomlkit.parse(out).unwrap()


@pytest.mark.parametrize("version", cr.VERSIONS)
def test_configure_adds_one_handler_and_reverts_byte_for_byte(version: str, tmp_path: object) -> None:
    """configure adds exactly the runc-guard handler (nothing else changes), containerd reads
    both handlers back with their BinaryName, a re-run is a no-op, --revert restores the bytes."""
    build = cl.require_build(version)
    prereq.require(os.path.exists(cr.guardctl_binary()), f"{cr.guardctl_binary()} (make venv)")
    workdir = str(tmp_path)
    config = cr.cri_config(workdir, build, build.runc)
    with open(config, "rb") as f:
        before = f.read()
    settings = os.path.join(workdir, "runc-guard.toml")
    cr.configure(config, settings, build.config_version)
    with open(config, "rb") as f:
        after = f.read()
    diff = [
        line
        for line in difflib.unified_diff(
            before.decode().splitlines(), after.decode().splitlines(), lineterm="", n=0
        )
        if not line.startswith(("---", "+++", "@@"))
    ]
    assert diff and all(line.startswith("+") for line in diff), diff
    assert any(f'BinaryName = "{cl.guard_binary()}"' in line for line in diff), diff

    dumped = _dump(build, config)
    handlers = dumped["plugins"][PLUGIN[build.config_version]]["containerd"]["runtimes"]  # type: ignore[index]
    assert handlers[cr.GUARD_HANDLER]["runtime_type"] == "io.containerd.runc.v2"
    assert handlers[cr.GUARD_HANDLER]["options"]["BinaryName"] == cl.guard_binary()
    assert handlers[cr.STOCK_HANDLER]["options"]["BinaryName"] == build.runc
    assert handlers["runc"]["options"]["BinaryName"] == ""

    again = cr.configure(config, settings, build.config_version)
    assert "already configured" in again
    subprocess.run(
        [cr.guardctl_binary(), "configure", "containerd", "--config", config, "--revert"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    with open(config, "rb") as f:
        assert f.read() == before


def test_crictl_is_found_through_the_setting() -> None:
    """crictl comes from the runtimes directory (RUNC_GUARD_TEST_RUNTIMES), never from PATH."""
    crictl = runtimes.require(runtimes.CRICTL)
    out = subprocess.run([crictl, "--version"], capture_output=True, text=True, check=True).stdout
    assert "v1.34" in out, out
