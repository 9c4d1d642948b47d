"""The VM lab's teardown cells for any layout / containerd / runc, stock vs runc-guard, in one boot.

The module ``integration/test_vm_node.py`` runs the unified cells that fit the CI
budget; this runs any cell of the matrix on demand, the hybrid layout of the
incident (``systemd.unified_cgroup_hierarchy=0``) included: boot ``labkit.vm``
in ``--layout``, configure containerd 1.6.20 (``setup.py``), upgrade it in place
to Debian sid's containerd 2.1 if asked (``--containerd 2.1``: ``setup.py
containerd2``), run the teardown cell (``scenarios.py teardown``) for the
handler pair of ``--runc`` (``stock`` / ``runc`` in front of Debian 12's runc
1.1.5, ``stock-13`` / ``runc-13`` in front of sid's runc 1.3) and then
``runc-guardctl audit`` / ``sweep`` / ``metrics`` (``scenarios.py node-tools``),
then ``systemctl restart containerd`` (1.6 re-runs its dead-shim cleanup of the
bundles it kept) and the tools again. Prints a
docs/vm.md row per container (and the pod's sandbox) of each handler: cgroup
dirs (every hierarchy), scope unit, runc state, bundle, pending records, after
kubelet's removal, after the sweep and after the restart + sweep, and
runc-guard's journal outcomes.
Figures are TCG's (docs/vm.md).

``--node sid``: the modern node (``labkit.vm.SID``: kernel 7.x, systemd 26x,
containerd 2.1 with its own default config, runc 1.3 and crun 1.28 as Debian
installs them, unified only): ``--runc 1.3`` is its own runc behind ``stock`` /
``runc``, ``--runc crun`` its crun behind ``stock-crun`` / ``runc-crun``, ``--runc
crun-fs`` the same crun with the cgroupfs driver. ``integration/test_vm_modern_node.py``
runs sid's Path A / Path B cells in ``make test``; this runs the others (``b+sibling``).

Run: ``python -m bench.vm_cells --layout hybrid [--containerd 1.6] [--runc 1.1] [--path b]``, or
``python -m bench.vm_cells --node sid --layout unified --runc crun``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any

from bench.common import print_table, vm_bench_args
from labkit import vm

#: ``--runc`` per node: bookworm's runc 1.1.5, or sid's runc 1.3 (labkit.vm.GUEST_RUNC) beside it;
#: sid's own runc 1.3, or its crun 1.28.
PAIRS = {
    vm.BOOKWORM: {"1.1": ("stock", "runc"), "1.3": ("stock-13", "runc-13")},
    vm.SID: {"1.3": ("stock", "runc"), "crun": ("stock-crun", "runc-crun"),
             "crun-fs": ("stock-crun-fs", "runc-crun-fs")},
}
#: ``--containerd``: Debian 12's 1.6.20, or sid's 2.1 (labkit.vm.GUEST_CONTAINERD) upgraded to in place
#: (the sid node runs its own 2.1 either way).
CONTAINERDS = ("1.6", "2.1")


def pair(args: argparse.Namespace) -> tuple[str, str]:
    """The stock / runc-guard handlers of ``--runc`` on ``--node`` (labkit/vm_guest/setup.py)."""
    pairs = PAIRS[args.node]
    if args.runc not in pairs:
        raise SystemExit(f"--runc {args.runc} is not on the {args.node} node: {', '.join(pairs)}")
    return pairs[args.runc]


def summary(left: dict[str, Any]) -> str:
    state = "yes" if left["state"] else "no"
    bundle = "yes" if left["bundle"] else "no"
    return f"{left['dirs']} / {left['unit']} / {state} / {bundle} / {left['records']}"


def outcomes(entries: list[dict[str, Any]]) -> str:
    said = [f"{d.get('outcome', d.get('event'))}/{d.get('exit_status', '-')}" for d in entries]
    return ", ".join(said) or "-"


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Boot, configure, run the cell, the tools, a containerd restart and the tools again; power off."""
    handlers = pair(args)
    with (
        tempfile.TemporaryDirectory(prefix="rgvm-bench-") as tmp,
        vm.booted_vm(tmp, args.layout, node=args.node) as node,
    ):
        print(f"booted {args.node} {args.layout} in {node.boot_s:.0f} s (TCG, {node.smp} vCPU)", flush=True)
        t = time.monotonic()
        setup: dict[str, Any] = node.guest("setup.py", timeout=600)
        if args.containerd != "1.6" and args.node == vm.BOOKWORM:
            setup = node.guest("setup.py", "containerd2", timeout=900)
        version = setup.get("containerd_version", "containerd 1.6.20 (Debian 12)")
        cri = setup.get("cri_version")
        print(f"{version} configured in {time.monotonic() - t:.0f} s; CRI {cri}", flush=True)
        t = time.monotonic()
        cell: dict[str, Any] = node.guest(
            "scenarios.py", "teardown", ",".join(handlers), args.path, args.pid, timeout=1800
        )
        cell_s = time.monotonic() - t
        for handler in handlers:
            if "error" in cell[handler]:
                raise SystemExit(f"{handler}: {cell[handler]['error']}")
        ids = [c for h in handlers for c in cell[h]["ids"].values()]
        ids += [cell[h]["sandbox"]["id"] for h in handlers]
        tools: dict[str, Any] = node.guest("scenarios.py", "node-tools", "-", *ids, timeout=1800)
        # containerd 1.6 keeps the bundle of a dead shim whose delete failed, and the sweep
        # keeps any container that still has one; a restart re-runs containerd's own
        # dead-shim cleanup of every bundle it kept. Then the tools once more.
        node.run("systemctl", "restart", "containerd", timeout=300)
        tasks = "/run/containerd/io.containerd.runtime.v2.task/k8s.io"
        wait = f'for i in $(seq 60); do [ -z "$(ls {tasks})" ] && break; sleep 1; done'
        node.run("sh", "-c", wait, timeout=120)
        restarted: dict[str, Any] = node.guest("scenarios.py", "node-tools", "-", *ids, timeout=1800)
        journal: dict[str, Any] = node.guest("scenarios.py", "journal", "-", *ids, timeout=600)
    return {
        "cell": cell, "cell_s": cell_s, "tools": tools, "restarted": restarted, "journal": journal,
        "containerd": setup.get("containerd_version", "1.6.20 (Debian 12)"),
    }  # fmt: skip


def report(args: argparse.Namespace, results: dict[str, Any]) -> None:
    cell, tools, restarted = results["cell"], results["tools"], results["restarted"]
    rows = []
    for handler in pair(args):
        r = cell[handler]
        for label, cid in [*r["ids"].items(), ("sandbox", r["sandbox"]["id"])]:
            after = r["sandbox"]["after_removal"] if label == "sandbox" else r["after_removal"][label]
            entries = r["sandbox"]["deletes"] if label == "sandbox" else r["deletes"][label]
            rows.append([
                handler, label, r["layout"], r["held_s"], summary(after), summary(tools["left"][cid]),
                summary(restarted["left"][cid]), outcomes(entries), outcomes(results["journal"][cid]),
            ])  # fmt: skip
    print_table(
        f"{args.node} {args.layout}, systemd driver, {results['containerd']}, runtime {args.runc}, "
        f"Path {args.path.upper()}, pid={args.pid} (TCG; cell {results['cell_s']:.0f} s)",
        ["handler", "container", "layout", "held s", "left: dirs / unit / state / bundle / records",
         "after sweep", "after a containerd restart + sweep", "runc-guard journal", "journal after all"],
        rows,
    )  # fmt: skip
    for handler in pair(args):
        said = cell[handler]["containerd"]["work"][-2:]
        print(f"{handler}: io limit {cell[handler]['io_max']!r}; containerd: {said}")
    print(f"audit: rc {tools['audit_rc']} {tools['audit'][:2]}")
    print(f"sweep: rc {tools['sweep_rc']} {tools['sweep'][-2:]}")
    print(f"metrics: {tools['metrics']}")
    print(f"after the restart: audit rc {restarted['audit_rc']} {restarted['audit'][:1]}; "
          f"sweep {restarted['sweep'][:1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=(vm.UNIFIED, vm.HYBRID), default=vm.HYBRID)
    parser.add_argument("--node", choices=vm.NODES, default=vm.BOOKWORM)
    parser.add_argument("--containerd", choices=CONTAINERDS, default="1.6")
    parser.add_argument("--runc", choices=("1.1", "1.3", "crun", "crun-fs"), default="1.1")
    parser.add_argument("--path", choices=("a", "b", "b+sibling"), default="b")
    args = vm_bench_args(parser)
    started = time.monotonic()
    results = run(args)
    report(args, results)
    print(f"{time.monotonic() - started:.0f} s in all")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
