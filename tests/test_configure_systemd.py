"""``runc-guardctl configure containerd`` keeps every handler's cgroup driver (``SystemdCgroup``) as it was.

Fronting runc with runc-guard must not switch a node between the systemd and
the cgroupfs driver: kubelet's ``cgroupDriver`` has to match containerd's, and
a node whose containers change driver across a restart ends up with pods in
both trees. Checked on the file (tomlkit) and, where containerd is installed,
with containerd's own parser (``containerd config dump``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import pytest
import tomlkit

from labkit import prereq
from tests.test_configure_cli import Node

CRI2 = "io.containerd.grpc.v1.cri"
CRI3 = "io.containerd.cri.v1.runtime"
CONTAINERD = shutil.which("containerd")

#: Four handlers: systemd (with a comment to keep), explicit cgroupfs, nvidia on
#: systemd, and one that never says (containerd's default: cgroupfs).
V2 = f"""version = 2
[plugins."{CRI2}".containerd]
  default_runtime_name = "runc"
  [plugins."{CRI2}".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."{CRI2}".containerd.runtimes.runc.options]
      SystemdCgroup = true  # kubelet cgroupDriver: systemd
  [plugins."{CRI2}".containerd.runtimes.legacy]
    runtime_type = "io.containerd.runc.v2"
    [plugins."{CRI2}".containerd.runtimes.legacy.options]
      SystemdCgroup = false
  [plugins."{CRI2}".containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
    [plugins."{CRI2}".containerd.runtimes.nvidia.options]
      BinaryName = "/usr/bin/nvidia-container-runtime"
      SystemdCgroup = true
  [plugins."{CRI2}".containerd.runtimes.plain]
    runtime_type = "io.containerd.runc.v2"
"""

V3 = f"""version = 3
[plugins."{CRI3}".containerd]
  default_runtime_name = "runc"
  [plugins."{CRI3}".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."{CRI3}".containerd.runtimes.runc.options]
      SystemdCgroup = true
  [plugins."{CRI3}".containerd.runtimes.legacy]
    runtime_type = "io.containerd.runc.v2"
    [plugins."{CRI3}".containerd.runtimes.legacy.options]
      SystemdCgroup = false
"""

ABSENT = object()


def options(text: bytes, plugin: str) -> dict[str, dict[str, Any]]:
    doc = tomlkit.parse(text.decode()).unwrap()
    runtimes = doc["plugins"][plugin]["containerd"]["runtimes"]
    return {name: body.get("options", {}) for name, body in runtimes.items()}


def drivers(text: bytes, plugin: str) -> dict[str, object]:
    """SystemdCgroup per handler, ABSENT where the file does not say."""
    return {name: opts.get("SystemdCgroup", ABSENT) for name, opts in options(text, plugin).items()}


@pytest.fixture
def node(tmp_path: Any, shim_binary: str) -> Node:
    return Node(str(tmp_path), shim_binary)


def every_handler(text: bytes, plugin: str) -> list[str]:
    return [f"--runtime={name}" for name in options(text, plugin)]


@pytest.mark.parametrize(("text", "plugin"), [(V2, CRI2), (V3, CRI3)])
def test_configure_keeps_systemd_cgroup_of_every_handler(node: Node, text: str, plugin: str) -> None:
    """true stays true, false stays false, absent stays absent, on every handler configure fronts."""
    original = node.write_config(text)
    node.run(*every_handler(original, plugin))
    after = node.read()
    assert drivers(after, plugin) == drivers(original, plugin)
    fronted = options(after, plugin)
    assert all(os.path.basename(o.get("BinaryName", "")).startswith("runc-guard") for o in fronted.values())


def test_configure_keeps_the_comment_on_systemd_cgroup(node: Node) -> None:
    """The operator's comment next to SystemdCgroup survives (tomlkit edits in place)."""
    node.write_config(V2)
    node.run("--runtime=runc")
    assert b"SystemdCgroup = true  # kubelet cgroupDriver: systemd" in node.read()


def test_revert_restores_the_driver_byte_for_byte(node: Node) -> None:
    """--revert gives back the exact file, SystemdCgroup lines included."""
    original = node.write_config(V2)
    node.run(*every_handler(original, CRI2))
    node.run("--revert")
    assert node.read() == original


def test_a_handler_configure_creates_gets_no_driver(node: Node) -> None:
    """Where configure creates the runc handler it adds no SystemdCgroup: containerd's default stays."""
    node.write_config("version = 2\n")
    node.run()
    created = options(node.read(), CRI2)
    assert created, "configure created no handler"
    assert all("SystemdCgroup" not in o for o in created.values())


@prereq.needs(CONTAINERD, "containerd (make deps installs it)")
def test_containerd_reads_the_same_driver_after_configure(node: Node) -> None:
    """containerd's own parser sees SystemdCgroup true on runc, false on legacy, all fronted."""
    assert CONTAINERD is not None
    original = node.write_config(V2)
    node.run(*every_handler(original, CRI2))
    dump = subprocess.run(
        [CONTAINERD, "--config", node.config, "config", "dump"], capture_output=True, text=True, check=True
    ).stdout
    runtimes = tomlkit.parse(dump).unwrap()["plugins"][CRI2]["containerd"]["runtimes"]
    assert runtimes["runc"]["options"]["SystemdCgroup"] is True
    assert runtimes["nvidia"]["options"]["SystemdCgroup"] is True
    assert runtimes["legacy"]["options"]["SystemdCgroup"] is False
    assert os.path.basename(runtimes["runc"]["options"]["BinaryName"]).startswith("runc-guard")
