"""A pure cgroup v2 node in a VM: systemd PID 1, journald, kubelet's systemd driver, crictl.

One boot serves the module (``labkit.vm``): Debian 12's kernel 6.1 under TCG,
every controller on the unified tree, containerd 1.6.20 configured by
``runc-guardctl configure containerd`` on its own default config with
``SystemdCgroup = true``; handler ``stock`` runs Debian's runc 1.1.5 and
``runc`` runs runc-guard (from its .deb) in front of the same runc, in the same
boot. TCG runs guest programs 15-25x slower than the host: the deadlines are the
shipped ones, and where that changes what a case means the test prints it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from labkit import prereq, vm

STOCK, GUARD = "stock", "runc"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[vm.VM]:
    """The booted VM with containerd configured and the images imported; always powered off."""
    prereq.require_none(vm.missing())
    with vm.booted_vm(str(tmp_path_factory.mktemp("rgvm"))) as machine:
        machine.setup = machine.guest("setup.py", timeout=600)  # type: ignore[attr-defined]
        yield machine


def figure(record: Any, line: str) -> None:
    print(line)
    record("figure", line)


def test_node_is_pure_v2_with_systemd_and_the_package(node: vm.VM, record_property: Any) -> None:
    """The guest is the node of today: cgroup2 with every controller, systemd PID 1, runc-guard's .deb."""
    out = node.run("sh", "-c", "stat -fc %T /sys/fs/cgroup; cat /sys/fs/cgroup/cgroup.controllers; "
                   "cat /proc/1/comm; systemctl is-active systemd-journald containerd; "
                   "dpkg-query -W -f '${Status}' runc-guard").stdout.split("\n")  # fmt: skip
    assert out[0] == "cgroup2fs", out
    assert {"cpu", "io", "memory", "pids"} <= set(out[1].split()), out
    assert out[2] == "systemd", out
    assert out[3:5] == ["active", "active"], out
    assert out[5] == "install ok installed", out
    handlers = node.setup["handlers"]  # type: ignore[attr-defined]
    assert handlers[GUARD] == {"binary": "/usr/bin/runc-guard", "systemd": True}, handlers
    assert handlers[STOCK] == {"binary": "/usr/sbin/runc", "systemd": True}, handlers
    figure(record_property, f"vm: booted in {node.boot_s:.0f} s (TCG, {node.smp} vCPU); disk "
           f"{'cached' if node.disk.build_s is None else f'built in {node.disk.build_s:.0f} s'}")
