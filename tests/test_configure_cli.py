"""``runc-guardctl configure containerd`` on real files: backups, atomic writes, revert, links."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from typing import Any

import pytest
import tomlkit
from click.testing import CliRunner, Result

from labkit import prereq
from runc_guard.cli import cli
from runc_guard.errors import EXIT_CONFIG, RuncGuardError
from runc_guard.settings import load

CRI2 = "io.containerd.grpc.v1.cri"
CONTAINERD = shutil.which("containerd")
NVIDIA = f'''version = 2
# a node with GPUs
[plugins."{CRI2}".containerd]
  default_runtime_name = "nvidia"
  [plugins."{CRI2}".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."{CRI2}".containerd.runtimes.runc.options]
      SystemdCgroup = true
  [plugins."{CRI2}".containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
    [plugins."{CRI2}".containerd.runtimes.nvidia.options]
      BinaryName = "{{nvidia}}"
      SystemdCgroup = true
'''


class Node:
    """A temp directory laid out like a node: a containerd config, runc-guard, its settings."""

    def __init__(self, root: str, shim: str) -> None:
        self.root = root
        self.config = os.path.join(root, "etc/containerd/config.toml")
        self.settings = os.path.join(root, "etc/runc-guard/config.toml")
        self.bindir = os.path.join(root, "bin")
        self.binary = os.path.join(self.bindir, "runc-guard")
        os.makedirs(os.path.dirname(self.config))
        os.makedirs(self.bindir)
        shutil.copy2(shim, self.binary)

    def settings_dir_file(self) -> str:
        """The settings path, its directory created (as the package does)."""
        os.makedirs(os.path.dirname(self.settings), exist_ok=True)
        return self.settings

    def write_config(self, text: str, mode: int = 0o644) -> bytes:
        with open(self.config, "w") as f:
            f.write(text)
        os.chmod(self.config, mode)
        with open(self.config, "rb") as f:
            return f.read()

    def read(self, path: str | None = None) -> bytes:
        with open(path or self.config, "rb") as f:
            return f.read()

    def run(self, *args: str, code: int = 0) -> Result:
        result = CliRunner().invoke(
            cli,
            ["configure", "containerd", "--config", self.config, "--binary", self.binary,
             "--settings", self.settings, "--restart-command", "false", *args],
        )
        exit_code = result.exit_code
        if isinstance(result.exception, RuncGuardError):  # what runc_guard.cli.main reports
            exit_code = result.exception.exit_code
        if exit_code != code:
            raise AssertionError(f"exit {exit_code} != {code}\n{result.output}\n"
                                 f"{result.exception!r}")
        return result

    def listing(self) -> dict[str, tuple[int, int]]:
        """Every file below the node with (size, mtime_ns): proves what was touched."""
        out = {}
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                st = os.lstat(os.path.join(dirpath, name))
                out[os.path.join(dirpath, name)] = (st.st_size, st.st_mtime_ns)
        return out


@pytest.fixture
def node(tmp_path: Any, shim_binary: str) -> Node:
    return Node(str(tmp_path), shim_binary)


@pytest.fixture
def default_config() -> str:
    prereq.require(CONTAINERD, "containerd (make deps installs it)")
    assert CONTAINERD is not None
    return subprocess.run(
        [CONTAINERD, "config", "default"], capture_output=True, text=True, check=True
    ).stdout


def binary_names(text: bytes) -> dict[str, str]:
    runtimes = tomlkit.parse(text.decode()).unwrap()["plugins"][CRI2]["containerd"]["runtimes"]
    return {name: body.get("options", {}).get("BinaryName", "") for name, body in runtimes.items()}


def test_configure_then_revert_restores_byte_for_byte(node: Node, default_config: str) -> None:
    """Configure writes BinaryName with a timestamped backup; --revert restores the exact bytes."""
    original = node.write_config(default_config)
    out = node.run().output
    assert binary_names(node.read())["runc"] == node.binary
    assert "containerd must be restarted" in out
    backups = [n for n in os.listdir(os.path.dirname(node.config)) if n.endswith(".bak")]
    assert len(backups) == 1
    assert node.read(os.path.join(os.path.dirname(node.config), backups[0])) == original
    assert node.read(node.config + ".runc-guard-orig") == original
    out = node.run("--revert").output
    assert "byte for byte" in out
    assert node.read() == original
    assert not os.path.exists(node.config + ".runc-guard-orig")
    assert not os.path.exists(node.config + ".runc-guard.json")


def test_dry_run_touches_nothing(node: Node, default_config: str) -> None:
    """--dry-run prints the diff and leaves every file (and the directory) as it was."""
    node.write_config(default_config)
    before = node.listing()
    out = node.run("--dry-run").output
    assert f'+            BinaryName = "{node.binary}"' in out
    assert "dry run: nothing written" in out
    assert node.listing() == before


def test_second_configure_writes_nothing(node: Node, default_config: str) -> None:
    """Idempotent: a second run reports nothing to do and makes no new backup."""
    node.write_config(default_config)
    node.run()
    before = node.listing()
    out = node.run().output
    assert "already configured" in out
    assert node.listing() == before


def test_mode_and_owner_survive_the_write(node: Node, default_config: str) -> None:
    """A 0600 config stays 0600 after configure and after revert."""
    node.write_config(default_config, mode=0o600)
    node.run()
    assert stat.S_IMODE(os.stat(node.config).st_mode) == 0o600
    node.run("--revert")
    assert stat.S_IMODE(os.stat(node.config).st_mode) == 0o600


def test_nvidia_chain_runs_the_old_runtime(node: Node) -> None:
    """The nvidia handler's link plus [runtimes] entry make runc-guard exec the old runtime."""
    fake = os.path.join(node.root, "nvidia-container-runtime")
    record = os.path.join(node.root, "argv")
    with open(fake, "w") as f:
        f.write(f'#!/bin/sh\necho "$0 $*" > {record}\n')
    os.chmod(fake, 0o755)
    original = node.write_config(NVIDIA.format(nvidia=fake))
    node.run()
    names = binary_names(node.read())
    link = os.path.join(node.bindir, "runc-guard-nvidia")
    assert names == {"runc": node.binary, "nvidia": link}
    assert os.readlink(link) == "runc-guard"
    env = {"PATH": os.environ["PATH"], "RUNC_GUARD_CONFIG": node.settings,
           "RUNC_GUARD_CACHE_DIR": os.path.join(node.root, "cache")}
    settings = load(env)
    assert (settings.runtime_for("runc-guard-nvidia"), settings.runtime_for("runc-guard")) == (fake, "runc")
    subprocess.run([link, "--root", "/x", "state", "c1"], env=env, check=True, timeout=30)
    assert node.read(record).decode().split() == [fake, "--root", "/x", "state", "c1"]
    node.run("--revert")
    assert node.read() == original
    assert not os.path.lexists(link)
    assert not os.path.exists(node.settings)


def test_revert_keeps_operator_settings_edits(node: Node) -> None:
    """Settings edited after configure lose only configure's [runtimes] entries on revert."""
    node.write_config(NVIDIA.format(nvidia="/usr/bin/nvidia-container-runtime"))
    node.run()
    text = node.read(node.settings)
    with open(node.settings, "wb") as f:
        f.write(b"delete_timeout = 2.5\n" + text)
    node.run("--revert")
    settings = tomlkit.parse(node.read(node.settings).decode()).unwrap()
    assert settings == {"delete_timeout": 2.5}


def test_revert_refuses_a_config_edited_since(node: Node, default_config: str) -> None:
    """An edited containerd config is not silently discarded: refused unless --force."""
    original = node.write_config(default_config)
    node.run()
    with open(node.config, "a") as f:
        f.write("# edited by hand\n")
    result = node.run("--revert", code=EXIT_CONFIG)
    assert "changed since" in str(result.exception)
    assert node.read().endswith(b"# edited by hand\n")
    node.run("--revert", "--force")
    assert node.read() == original


def test_missing_config_is_created_and_revert_removes_it(node: Node) -> None:
    """No config at all: configure creates one; revert removes it again."""
    node.run("--config-version", "2")
    assert binary_names(node.read()) == {"runc": node.binary}
    node.run("--revert")
    assert not os.path.exists(node.config)


def test_restart_runs_only_when_the_config_changed(node: Node, default_config: str) -> None:
    """--restart runs the restart command after a change, and not on a no-op run."""
    node.write_config(default_config)
    marker = os.path.join(node.root, "restarted")
    args = ("--restart", "--restart-command", f"touch {marker}")
    node.run(*args)
    assert os.path.exists(marker)
    os.unlink(marker)
    node.run(*args)
    assert not os.path.exists(marker)


def test_failed_restart_is_an_error(node: Node, default_config: str) -> None:
    """A restart command that fails makes configure fail (exit 78), the file stays configured."""
    node.write_config(default_config)
    result = node.run("--restart", "--restart-command", "false", code=EXIT_CONFIG)
    assert "exited 1" in str(result.exception)
    assert binary_names(node.read())["runc"] == node.binary


def test_missing_binary_is_refused_before_writing(node: Node, default_config: str) -> None:
    """A --binary that does not exist would break every pod start: nothing is written."""
    original = node.write_config(default_config)
    os.unlink(node.binary)
    node.run(code=EXIT_CONFIG)
    assert node.read() == original
    assert not os.path.exists(node.config + ".runc-guard.json")


def test_host_root_edits_the_mounted_host(tmp_path: Any, shim_binary: str) -> None:
    """--host-root writes below the mount but records host paths (the DaemonSet case)."""
    host = str(tmp_path)
    os.makedirs(f"{host}/etc/containerd/conf.d")
    os.makedirs(f"{host}/usr/local/bin")
    shutil.copy2(shim_binary, f"{host}/usr/local/bin/runc-guard")
    with open(f"{host}/etc/containerd/config.toml", "w") as f:
        f.write('version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n')
    with open(f"{host}/etc/containerd/conf.d/gpu.toml", "w") as f:
        f.write(NVIDIA.format(nvidia="/usr/bin/nvidia-container-runtime"))
    result = CliRunner().invoke(cli, [
        "configure", "containerd", "--host-root", host, "--binary", "/usr/local/bin/runc-guard",
    ], env={"RUNC_GUARD_CONFIG": ""})
    assert result.exit_code == 0, result.output
    with open(f"{host}/etc/containerd/conf.d/gpu.toml", "rb") as f:
        assert binary_names(f.read()) == {
            "runc": "/usr/local/bin/runc-guard", "nvidia": "/usr/local/bin/runc-guard-nvidia",
        }
    assert os.path.islink(f"{host}/usr/local/bin/runc-guard-nvidia")
    with open(f"{host}/etc/containerd/config.toml.runc-guard.json") as f:
        state = json.load(f)
    assert sorted(state["files"]) == ["/etc/containerd/conf.d/gpu.toml",
                                      "/etc/runc-guard/config.toml"]
    result = CliRunner().invoke(cli, ["configure", "containerd", "--host-root", host, "--revert"])
    assert result.exit_code == 0, result.output
    assert not os.path.exists(f"{host}/etc/runc-guard/config.toml")


def test_installed_tool_round_trip(node: Node, default_config: str) -> None:
    """The installed runc-guardctl does the same round trip as a separate process."""
    original = node.write_config(default_config)
    tool = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")
    base = [tool, "configure", "containerd", "--config", node.config, "--binary", node.binary,
            "--settings", node.settings]
    subprocess.run(base, check=True, capture_output=True, timeout=60)
    assert binary_names(node.read())["runc"] == node.binary
    subprocess.run([*base, "--revert"], check=True, capture_output=True, timeout=60)
    assert node.read() == original


def test_revert_leaves_no_backup_of_config_or_settings(node: Node) -> None:
    """Backups configure made of the config and of an existing settings file go with --revert."""
    with open(node.settings_dir_file(), "w") as f:
        f.write("delete_timeout = 3.0\n")
    original = node.write_config(NVIDIA.format(nvidia="/usr/bin/nvidia-container-runtime"))
    node.run()
    backups = [p for p in node.listing() if p.endswith(".bak")]
    assert len(backups) == 2, backups
    node.run("--revert")
    assert [p for p in node.listing() if p.endswith(".bak")] == []
    assert node.read() == original
    assert node.read(node.settings) == b"delete_timeout = 3.0\n"
