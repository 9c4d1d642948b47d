"""The modern node (issue 41 items 3-4): Debian sid in the VM lab, its runtimes as Debian installs them.

One boot serves the module (``labkit.vm`` with ``node=SID``): kernel 7.x, systemd
26x PID 1, pure cgroup v2 with every controller, containerd 2.1.9 from its own
``containerd config default`` with ``SystemdCgroup = true``, configured by
``runc-guardctl configure containerd``; runc 1.3.6 and crun 1.28 are sid's
packages. Stock runs beside runc-guard in the same boot: ``stock`` / ``runc``
(runc 1.3.6, systemd driver), ``stock-crun`` / ``runc-crun`` (crun 1.28, systemd
driver) and ``stock-crun-fs`` / ``runc-crun-fs`` (crun 1.28, cgroupfs driver).

The cells (``labkit/vm_guest/scenarios.py teardown``, figures in docs/vm.md): a
writer held ~8 s in throttled writeback (``io.max`` on the pod's cgroup), then
Path B (init and shim SIGKILLed: containerd's dead-shim cleanup) for each pair;
then ``runc-guardctl audit`` / ``sweep`` / ``metrics`` over every container.

What stock shows here, honestly. Path B: containerd 2.1.9 runs a runtime
``delete`` only for the dead shim's own id, the pod's sandbox: the pod's containers
share its shim and are loaded with no cleanup of their own (``ShimManager.Start``
with a ``SandboxID``), and its CRI's task delete of the container fails with
``ttrpc: closed``. So stock runc and stock crun keep the container's state, and with
crun's cgroupfs driver its cgroup too (no systemd to remove it). runc-guard, in the
sandbox's delete, records the pod's dead containers and deletes each after the
reply (its deadline: exit 75, then the finisher): it leaves nothing behind runc and
behind crun with either driver. crun's systemd driver runs a container in
``<prefix>-<id>.scope/container``, which runc-guard takes as the container's own with
its scope (``delete.paths.crun_leaf_scope``: crun's status naming that scope), for the
sandbox's delete and the container's alike; the sweep then re-drives stock crun's
orphaned state as it does runc's (docs/vm.md).

In the Path B cells the container is the sandbox's dying sibling, so the sandbox
with a dying sibling is covered there. Benches, not here (``bench.vm_cells --node
sid``, ``bench.vm_crashloop --node sid``; each another 1-4 minutes of TCG, and this
module is handed out last in ``make test``, so its length adds to the run's): Path A
(``--path a --pid pod``: stock runc 1.3.6 leaves nothing there, ``cgroup.kill`` and
systemd removing the empty scope, so it has no failure to show; runc-guard's Path A
runs on Debian 12 in test_vm_node.py), the pod with a second, live sibling
(``b+sibling``), the CRI crash loop, the crash storm and the memcg figures.
Prerequisites are checked before the boot (``labkit.prereq``: skip, or fail under
``CI=true``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from integration.test_vm_node import cell, check_path_b, figure, overloaded, row
from labkit import prereq, runtimes, vm

RUNC = ("stock", "runc")
CRUN = ("stock-crun", "runc-crun")
CRUN_FS = ("stock-crun-fs", "runc-crun-fs")
#: containerd 2.1.9's CRI when the container's task delete hit the dead shim's closed connection.
TTRPC_CLOSED = "ttrpc: closed"
#: What containerd's log says about a dead shim and a failed delete.
SAID = ("level=error", "level=warning", "shim disconnected", TTRPC_CLOSED)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[vm.VM]:
    """The booted sid VM with containerd configured and the images imported; always powered off."""
    prereq.require_none(vm.missing())
    runtimes.require(runtimes.CRI_API_PROTO)
    with vm.booted_vm(str(tmp_path_factory.mktemp("rgvm-sid")), vm.UNIFIED, node=vm.SID) as machine:
        machine.setup = machine.guest("setup.py", timeout=600)  # type: ignore[attr-defined]
        yield machine


def containerd_log(node: vm.VM, *ids: str) -> list[str]:
    """containerd's journal lines naming any of ``ids`` (12-char prefixes): what it did per container."""
    pattern = "|".join(i[:12] for i in ids)
    out = node.run("journalctl", "-u", "containerd", "--grep", pattern, "-o", "cat", "--no-pager",
                   check=False, timeout=120).stdout  # fmt: skip
    return [line[:240] for line in out.splitlines()]


@pytest.fixture(scope="module")
def cells(node: vm.VM) -> dict[str, Any]:
    """Every teardown cell once, runc's Path B first; node tools last (the sweep sees every leftover)."""
    found: dict[str, Any] = {}
    for name, pair, path, pid in (
        ("path-b runc", RUNC, "b", "container"),
        ("path-b crun", CRUN, "b", "container"),
        ("path-b crun-fs", CRUN_FS, "b", "container"),
    ):
        try:
            result = cell(node, "teardown", ",".join(pair), path, pid)
        except AssertionError as exc:  # that cell's test fails with it; the others still run
            found[name] = {"error": str(exc)[-3000:]}
            continue
        for handler in pair:
            r = result[handler]
            r["log"] = containerd_log(node, r["ids"]["work"], r["sandbox"]["id"])
            r["sandbox"]["reasons"] = guard_reasons(node, r["sandbox"]["id"])
        found[name] = result
    ids = [c for name, pair in _CELLS if "error" not in found[name] for h in pair
           for c in (*found[name][h]["ids"].values(), found[name][h]["sandbox"]["id"])]  # fmt: skip
    found["tools"] = node.guest("scenarios.py", "node-tools", "-", *ids, timeout=900)
    return found


def guard_reasons(node: vm.VM, cid: str) -> list[str]:
    """runc-guard's journal for ``cid``: each entry's event or outcome, and why (e.g. it stepped aside)."""
    out = node.run("journalctl", "-t", "runc-guard", f"CONTAINER_ID={cid}", "-o", "json", "--no-pager",
                   check=False, timeout=120).stdout  # fmt: skip
    entries = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [f"{e.get('OUTCOME', e.get('EVENT'))}: {e.get('REASON', '-')}"[:300] for e in entries]


def cell_of(cells: dict[str, Any], name: str) -> dict[str, Any]:
    """One cell's result; its test fails with the guest's error when the cell did not run."""
    result: dict[str, Any] = cells[name]
    if "error" in result:
        pytest.fail(f"{name}: {result['error']}")
    return result


_CELLS = (("path-b runc", RUNC), ("path-b crun", CRUN), ("path-b crun-fs", CRUN_FS))


def test_node_is_sid_with_its_own_runtimes(node: vm.VM, record_property: Any) -> None:
    """The guest is the modern node: kernel 7.x, cgroup2, every controller, systemd PID 1, containerd 2.x."""
    probe = ("uname -r; stat -fc %T /sys/fs/cgroup; cat /sys/fs/cgroup/cgroup.controllers; cat /proc/1/comm; "
             "systemctl --version | head -1; containerd --version; runc --version | head -1; "
             "crun --version | head -1; dpkg-query -W -f '${Status}' runc-guard")  # fmt: skip
    out = node.run("sh", "-c", probe).stdout.split("\n")
    figure(record_property, f"vm sid: booted in {node.boot_s:.0f} s (TCG, {node.smp} vCPU): {out[:8]}")
    assert int(out[0].split(".")[0]) >= 7, out
    assert out[1] == "cgroup2fs", out
    assert {"cpu", "io", "memory", "pids", "cpuset", "hugetlb"} <= set(out[2].split()), out
    assert out[3] == "systemd", out
    assert "2." in out[5] and "runc version 1.3" in out[6] and "crun version" in out[7], out
    assert out[8] == "install ok installed", out
    handlers = node.setup["handlers"]  # type: ignore[attr-defined]
    for stock, guard in (RUNC, CRUN, CRUN_FS):
        assert handlers[guard]["binary"].startswith("/usr/bin/runc-guard"), handlers
        systemd = not stock.endswith("-fs")
        assert handlers[stock]["systemd"] is handlers[guard]["systemd"] is systemd, handlers


def test_path_b_runc_13(cells: dict[str, Any], record_property: Any) -> None:
    """Path B, runc 1.3.6, systemd driver: stock keeps runc's state, runc-guard leaves nothing or says 75."""
    check_path_b(cell_of(cells, "path-b runc"), RUNC, "sid path-b runc-1.3.6", record_property)


def check_crun(result: dict[str, Any], pair: tuple[str, str], name: str, record: Any) -> str:
    """Path B behind crun: what each handler left; returns how containerd handled the container.

    ``no-delete``: containerd ran no runtime delete for the container (its task delete
    hit the dead shim's closed ttrpc connection), so runc-guard was never called; both
    handlers must then leave the same thing. Otherwise runc-guard's delete ran and must
    leave no cgroup, or exit 75 with its record.
    """
    stock_h, guard_h = pair
    figure(record, row(name, result, pair))
    for handler in pair:
        said = [line for line in result[handler]["log"] if any(k in line for k in SAID)][-3:]
        figure(record, f"vm {name} {handler}: containerd: {said}")
        sandbox = result[handler]["sandbox"]
        said = sandbox["reasons"]
        figure(record, f"vm {name} {handler} sandbox: {sandbox['after_removal']}, journal {said}")
    stock = result[stock_h]["after_removal"]["work"]
    guard = result[guard_h]["after_removal"]["work"]
    entries = result[guard_h]["deletes"]["work"]
    assert guard["records"] <= 1, result[guard_h]
    if not entries:
        assert any(TTRPC_CLOSED in line for line in result[guard_h]["log"]), result[guard_h]["log"]
        assert guard == stock, (stock, guard)
        return "no-delete"
    if overloaded(result, guard_h):
        figure(record, f"vm {name}: TCG: runc-guard stepped aside at start-up (startup_overloaded)")
        return "stepped-aside"
    for e in entries:
        if e.get("outcome") == "deadline":
            assert e.get("exit_status") == "75", entries
    if not any(e.get("outcome") == "deadline" for e in entries):
        assert (guard["dirs"], guard["state"]) == (0, False), result[guard_h]
    return "delete"


def test_path_b_crun_systemd(cells: dict[str, Any], record_property: Any) -> None:
    """Path B, crun 1.28, systemd driver: stock keeps crun's state; runc-guard leaves nothing, or says 75."""
    result = cell_of(cells, "path-b crun")
    for handler in CRUN:
        figure(record_property, f"vm sid path-b crun systemd {handler}: crun's status "
               f"{result[handler]['crun_status']}")  # fmt: skip
    how = check_crun(result, CRUN, "sid path-b crun-1.28 systemd", record_property)
    stock = result["stock-crun"]["after_removal"]["work"]
    guard = result["runc-crun"]["after_removal"]["work"]
    # The control: containerd 2.1.9 runs no delete for the sandbox's container; systemd removes the scope.
    assert (stock["dirs"], stock["unit"], stock["state"]) == (0, "gone", True), result["stock-crun"]
    figure(record_property, f"vm sid path-b crun systemd: containerd's handling of the container: {how}")
    sandbox = result["runc-crun"]["sandbox"]
    if any(e.get("event") == "startup_overloaded" for e in sandbox["deletes"]):
        # TCG: the sandbox's delete started too late and ran crun alone: nothing recorded its siblings.
        figure(record_property, "vm sid path-b crun systemd: TCG: the sandbox's delete stepped aside at "
               "start-up (startup_overloaded): this run measures the emulator")  # fmt: skip
        assert guard == stock, (stock, guard)
        return
    # runc-guard took crun's <scope>/container as the sandbox's own, recorded its dead sibling, and the
    # container's own delete (the finisher's) left nothing: no dirs, no scope unit, no state, no record.
    assert not any("not named after" in r for r in sandbox["reasons"]), sandbox["reasons"]
    assert how == "delete", result["runc-crun"]
    # Its journal: the container's own delete (check_crun: a deadline is exit 75), and the finisher's
    # `finished_late` unless its reporter had not delivered it yet when the cell read the journal.
    outcomes = [e.get("outcome") for e in result["runc-crun"]["deletes"]["work"] if e.get("outcome")]
    assert outcomes and set(outcomes) <= {"removed", "already_gone", "deadline", "finished_late"}, outcomes
    if outcomes[-1] == "deadline" and guard["records"] == 1:
        # Exit 75 with its record, the finisher not done yet when the cell looked (seen on a loaded
        # host, the guest's one emulated vCPU starved): the contract of every Path B cell
        # (check_path_b); test_node_tools_on_sid proves the sweep then leaves nothing.
        assert (guard["dirs"], guard["unit"]) == (0, "gone"), result["runc-crun"]
        figure(record_property, "vm sid path-b crun systemd: exit 75 with its record; the finisher had not "
               "finished when the cell looked")  # fmt: skip
        return
    nothing = {"dirs": 0, "unit": "gone", "state": False, "bundle": False, "records": 0}
    assert guard == nothing, result["runc-crun"]
    if outcomes[-1] == "deadline":
        figure(record_property, "vm sid path-b crun systemd: the finisher's finished_late was not in the "
               "journal yet when the cell read it (nothing was left: it had finished)")  # fmt: skip


def test_path_b_crun_cgroupfs(cells: dict[str, Any], record_property: Any) -> None:
    """Path B, crun 1.28, cgroupfs driver: no systemd to remove the cgroup; what each handler leaves."""
    result = cell_of(cells, "path-b crun-fs")
    how = check_crun(result, CRUN_FS, "sid path-b crun-1.28 cgroupfs", record_property)
    # The control: containerd ran no delete of the container, and no systemd removes its cgroup.
    stock = result["stock-crun-fs"]["after_removal"]["work"]
    assert stock["dirs"] >= 1 and stock["state"] is True, result["stock-crun-fs"]
    figure(record_property, f"vm sid path-b crun cgroupfs: containerd's handling of the container: {how}")


def test_node_tools_on_sid(cells: dict[str, Any], record_property: Any) -> None:
    """audit and sweep after every cell: runc-guard's runc containers end with no dirs and no records."""
    tools = cells["tools"]
    figure(record_property, f"vm sid audit: rc {tools['audit_rc']}: {tools['audit'][:3]}")
    redriven = [line for line in tools["sweep"] if line.startswith("re-ran")]
    figure(record_property, f"vm sid sweep: rc {tools['sweep_rc']}: {redriven + tools['sweep'][-2:]}")
    figure(record_property, f"vm sid audit after: rc {tools['audit_after_rc']}: {tools['audit_after'][:2]}; "
           f"metrics {tools['metrics']}")  # fmt: skip
    for name, pair in _CELLS:
        for handler in pair if "error" not in cells[name] else ():
            cid = cells[name][handler]["ids"]["work"]
            figure(record_property, f"vm sid after sweep {name} {handler}: {tools['left'][cid]}")
    assert tools["sweep_rc"] == 0, tools
    assert tools["metrics_rc"] == 0, tools
    for name, (_stock, guard) in _CELLS:
        left = tools["left"][cell_of(cells, name)[guard]["ids"]["work"]]
        assert (left["dirs"], left["state"], left["records"]) == (0, False, 0), (name, left)
    # crun's systemd driver: the sweep trusts its `<scope>/container` as the delete does, so stock crun's
    # orphaned state is re-driven (`crun delete --force`) like any other, and no state is kept unsafe.
    left = tools["left"][cell_of(cells, "path-b crun")["stock-crun"]["ids"]["work"]]
    assert (left["dirs"], left["state"], left["records"]) == (0, False, 0), left
    assert "unsafe_path" not in " ".join(tools["audit_after"]), tools["audit_after"]
