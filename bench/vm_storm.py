"""A crash storm on the modern node (Debian sid under TCG), stock runc beside runc-guard.

Boots the VM lab's sid node (``labkit.vm``, ``--node sid``: kernel 7.x, systemd PID 1,
containerd 2.1.9 with ``SystemdCgroup = true``, runc 1.3.6; one vCPU) and runs
``scenarios.py storm``: per handler (``stock``: runc alone, then ``runc``: runc-guard in
front of it), ``--pods`` pods, each a sandbox and one container (two sleepers and a
``busybox dd oflag=direct`` held in throttled I/O on the data disk), every container's
init and every shim SIGKILLed within a moment, each hold lifted after its own 0.3-3 s
(seeded). containerd 2.x's dead-shim cleanup then runs one shim delete per pod, all at
once (the sandbox's: docs/vm.md, Path B), each under its 5 s budget. Then kubelet's
removal through labkit.cri_client, ``--settle`` s with no sweep, and per handler:
sandboxes whose dead-shim cleanup containerd says failed, pods and containers the CRI
still lists, container cgroup dirs, scope units, runtime states, bundles and pending
records left (containers and sandboxes), runc-guard's path per sandbox delete (its full
path, stepped aside at start-up, no entry) and its journal's outcomes.

One handler after the other, not both at once: each storm is then the only one on the
node (runc-guard's finisher waits for every dead-shim cleanup of containerd to end, stock's
included, and one vCPU shared by two storms would measure each against the other's load),
as bench.storm runs stock first, then runc-guard, on one containerd. Both get the same
seeded hold delays, and both first run and remove one pod (a node's earlier life: what
runc-guard's path costs here is measured by then, as on any node that ran pods).

Run: ``python -m bench.vm_storm [--pods 8] [--seed S] [--settle 60] [--node sid]``.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from typing import Any

from bench.common import print_table, vm_bench_args
from labkit import vm

#: stock runc 1.3.6 alone, then runc-guard in front of it (labkit/vm_guest/setup.py).
HANDLERS = ("stock", "runc")


def left_summary(left: dict[str, dict[str, Any]], ids: list[str]) -> str:
    """dirs / scope units / states / bundles / pending records / aside records over ``ids``."""
    rows = [left[c] for c in ids]
    return " / ".join(str(n) for n in (
        sum(r["dirs"] for r in rows), sum(bool(r["unit"]) for r in rows), sum(bool(r["state"]) for r in rows),
        sum(bool(r["bundle"]) for r in rows), sum(r["records"] for r in rows), sum(r["aside"] for r in rows),
    ))  # fmt: skip


def paths_taken(r: dict[str, Any]) -> str:
    """Each sandbox delete's path by runc-guard's own entries: full / stepped aside / no entry.

    A ``delete`` entry other than the finisher's ``finished_late`` is the delete itself.
    """
    full = aside = 0
    for sandbox in r["sandboxes"]:
        entries = r["journal"].get(sandbox, [])
        if any(e.get("event") == "delete" and e.get("outcome") != "finished_late" for e in entries):
            full += 1
        elif any(e.get("event") == "startup_overloaded" for e in entries):
            aside += 1
    return f"{full} / {aside} / {len(r['sandboxes']) - full - aside}"


def outcomes(r: dict[str, Any], ids: list[str]) -> str:
    counts: dict[str, int] = {}
    for c in ids:
        for e in r["journal"].get(c, []):
            if "outcome" in e:
                key = f"{e['outcome']}/{e.get('exit_status', '-')}"
            elif e.get("event") == "startup_overloaded":
                key = "startup_overloaded"
            else:
                continue
            counts[key] = counts.get(key, 0) + 1
    return " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "-"


def report(args: argparse.Namespace, storms: dict[str, Any], boot_s: float) -> None:
    rows = []
    for handler in HANDLERS:
        r = storms[handler]
        held = [h for h in r["held_s"] if h is not None]
        rows.append([
            handler, r["pods"], f"{min(held):.1f}-{max(held):.1f}" if held else "-",
            " / ".join(str(len(x)) for x in (r["cleanup_failed"], *r["cri_listed"].values())),
            left_summary(r["left"], r["ids"]), left_summary(r["left"], r["sandboxes"]),
            paths_taken(r) if handler != "stock" else "-",
            outcomes(r, r["sandboxes"]), outcomes(r, r["ids"]),
            r["cpu_5s"].get("busy", "-"),
        ])  # fmt: skip
    print_table(
        f"Crash storm on the {args.node} node: {args.pods} pods per handler, one handler after the other, "
        f"holds 0.3-3 s (seed {args.seed}), {args.settle:g} s settle, no sweep, "
        f"{'runc-guard' if args.runc_guard_first else 'stock'} first "
        f"(TCG, 1 vCPU; boot {boot_s:.0f} s)",
        ["handler", "pods", "writers gone after the kills, s",
         "sandbox cleanups failed (containerd) / pods / containers the CRI still lists",
         f"containers {args.settle:g} s later: dirs / scope units / states / bundles / records / aside",
         "sandboxes: the same", "runc-guard sandbox deletes: full / aside / no entry",
         "journal: sandboxes", "journal: containers", "node CPU busy s, first 5 s"],
        rows,
    )  # fmt: skip
    for handler in HANDLERS:
        r = storms[handler]
        kept = sum(bool(r["at_cleanup"][s]["bundle"]) for s in r["sandboxes"])
        cleanup = f"{kept} sandbox bundles still there" if kept else "no sandbox bundle left"
        cost = r.get("path_cost_ms")
        print(f"{handler}: a pod run and removed before (warm-up {r.get('warmup_s')} s; runc-guard's "
              f"measured path cost then {'none' if cost is None else f'{cost} ms of CPU'})")
        print(f"{handler}: setup {r['setup_s']} s, kills within {r['kill_spread_s']} s, {cleanup} "
              f"{r['cleanup_s']} s after them, removal {r['removal_s']} s (RemoveContainer attempts "
              f"{r['rm_attempts']})")  # fmt: skip
        said = [line for lines in r["containerd"].values() for line in lines]
        failed = [line for line in said if "shim disconnected" in line]
        if failed or said:
            print(f"{handler}: containerd, e.g. {(failed or said)[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=8, help="per handler: deletes at once")
    parser.add_argument("--seed", type=int, default=None, help="the holds' delays (random when omitted)")
    parser.add_argument("--settle", type=float, default=60.0, help="s after kubelet's removal, no sweep")
    parser.add_argument("--runc-guard-first", action="store_true",
                        help="run runc-guard's storm first, then stock's (the order's own effect)")
    parser.add_argument("--node", choices=vm.NODES, default=vm.SID,
                        help="sid: containerd 2.1.9 + runc 1.3.6 as Debian installs them (stock / runc)")
    args = vm_bench_args(parser)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 30)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rgvm-bench-") as tmp, vm.booted_vm(tmp, node=args.node) as node:
        print(f"booted {args.node} in {node.boot_s:.0f} s (TCG, {node.smp} vCPU)", flush=True)
        t = time.monotonic()
        setup: dict[str, Any] = node.guest("setup.py", timeout=600)
        print(f"{setup.get('containerd_version')} configured in {time.monotonic() - t:.0f} s", flush=True)
        storms: dict[str, Any] = node.guest(
            "scenarios.py", "storm", ",".join(HANDLERS[::-1] if args.runc_guard_first else HANDLERS),
            str(args.pods), str(args.seed), str(args.settle),
            timeout=3600,
        )  # fmt: skip
        boot_s = node.boot_s
    for handler in HANDLERS:
        if "error" in storms[handler]:
            raise SystemExit(f"{handler}: {storms[handler]['error']}")
    report(args, storms, boot_s)
    print(f"{time.monotonic() - started:.0f} s in all")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"setup": setup, "storms": storms}, f, indent=1)


if __name__ == "__main__":
    main()
