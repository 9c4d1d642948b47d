"""Real memcg OOM kills on a pure cgroup v2 node, restarted like CrashLoopBackOff, stock vs runc-guard.

Boots the VM lab (``labkit.vm``: Debian 12, kernel 6.1, systemd PID 1, containerd
1.6.20 with ``SystemdCgroup = true``, TCG) and runs ``scenarios.py crash-loop``:
one pod per handler (``stock``: runc 1.1.5 alone; ``runc``: runc-guard in front
of it), in parallel; each attempt is a container with a 64 MiB ``memory.max``
whose init forks 8 sleepers and becomes ``busybox dd bs=200M`` (the kernel's
memcg OOM killer kills it); kubelet's CrashLoopBackOff at its 1 s floor: wait
for the exit (1 s polls, PLEG's period), 1 s, start the next attempt, remove the
previous one. Then ``runc-guardctl sweep``, and what each handler left: cgroup
directories, scope units, runc states, pending records; exits and runc-guard's
journal outcomes. Figures are TCG's: ~15-25x slower than the host.

``--mib N``: the emptyDir variant (issue 32): each attempt appends N MiB to its
pod's emptyDir (a guest directory that outlives the attempts; no fsync) and
exits 1, instead of being OOM-killed (a memcg OOM would first reclaim that page
cache itself). Throughout, every 5 s, ``nr_dying_descendants`` of each pod's
slice (per parent on v2: the handlers run in parallel without mixing) and of
the root (the node's, both handlers), and the memory charged below each slice;
reported at the start, when the last attempt is removed, and 15 s later.

``--driver cgroupfs``: both handlers with containerd's cgroupfs driver
(``SystemdCgroup = false``, setup.py's ``stock-fs`` / ``runc-fs``; pods in
``/kubepods/burstable/pod<uid>``): runc's delete, not systemd, removes the
container's cgroup, so runc-guard's delete still finds it.

``--node sid``: the same on the modern node (``labkit.vm.SID``: kernel 7.x, its own
containerd 2.1 and runc 1.3, which ``stock`` / ``runc`` then run).

Run: ``python -m bench.vm_crashloop [--restarts 300] [--minutes 25] [--pid container] [--mib 1]
[--driver systemd] [--node sid]``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any

from bench.common import print_table, vm_bench_args
from labkit import vm


def dying_table(loop: dict[str, Any], args: argparse.Namespace) -> None:
    """The emptyDir variant's figures: dying cgroups per pod slice and at the root, three times."""

    def three(r: dict[str, Any], key: str) -> str:
        return " / ".join(str(r["dying"][when][key]) for when in ("start", "end", "settled"))

    rows = []
    for handler in pair(args):
        r = loop[handler]
        growth = r["dying"]["settled"]["pod"] - r["dying"]["start"]["pod"]
        rows.append([
            handler, r["restarts"] - 1, r["per_minute"], three(r, "pod"),
            f"{growth / max(r['restarts'] - 1, 1):+.3f}", three(r, "root"), three(r, "pod_kb"),
            json.dumps(r["exits"]), json.dumps(r["outcomes"]), json.dumps(r["memcg"]),
        ])  # fmt: skip
    print_table(
        f"emptyDir crash loop, {args.mib} MiB appended per attempt, pid={args.pid}, "
        f"{args.driver} driver, both handlers at once (TCG)",
        ["handler", "restarts", "restarts/min", "dying below the pod slice start / end / end+15 s",
         "per restart (end+15 s)", "dying below the root start / end / end+15 s",
         "KiB below the pod slice start / end / end+15 s", "exits", "runc-guard journal",
         "runc-guard journal: memcgs reclaimed (KiB, deletes) / left charged (why)"],
        rows,
    )  # fmt: skip


def pair(args: argparse.Namespace) -> tuple[str, str]:
    """The guest's handlers for ``--driver``: runc 1.1.5 alone, then behind runc-guard (setup.py)."""
    return ("stock", "runc") if args.driver == "systemd" else ("stock-fs", "runc-fs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=300, help="per handler, at most")
    parser.add_argument("--minutes", type=float, default=25.0, help="stop starting attempts after this")
    parser.add_argument("--mib", type=int, default=0,
                        help="the emptyDir variant: MiB appended per attempt, which exits 1 (0: OOM kills)")
    parser.add_argument("--driver", choices=("systemd", "cgroupfs"), default="systemd",
                        help="containerd's cgroup driver for both handlers (SystemdCgroup true / false)")
    parser.add_argument("--node", choices=vm.NODES, default=vm.BOOKWORM,
                        help="the guest's Debian: 12 (containerd 1.6.20, runc 1.1.5) or sid (2.1, runc 1.3)")
    args = vm_bench_args(parser)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rgvm-bench-") as tmp, vm.booted_vm(tmp, node=args.node) as node:
        print(f"booted in {node.boot_s:.0f} s (TCG, {node.smp} vCPU)", flush=True)
        node.guest("setup.py", timeout=600)
        seconds = args.minutes * 60
        loop: dict[str, Any] = node.guest(
            "scenarios.py", "crash-loop", ",".join(pair(args)), str(args.restarts), str(seconds), args.pid,
            str(args.mib),
            timeout=seconds + 900,
        )  # fmt: skip
        ids = [c for h in pair(args) for c in loop[h].get("ids", [])]
        tools: dict[str, Any] = node.guest("scenarios.py", "node-tools", "-", *ids, timeout=1800)
    rows = []
    for handler in pair(args):
        r = loop[handler]
        if "error" in r:
            raise SystemExit(f"{handler}: {r['error']}")
        after = [tools["left"][c] for c in r["ids"]]
        rows.append([
            handler, r["restarts"], r["oom_kills"], r["per_restart_s"], r["dirs"], r["units_left"],
            r["states"], r["records"], sum(a["dirs"] for a in after), sum(bool(a["state"]) for a in after),
            sum(a["records"] for a in after), json.dumps(r["exits"]), json.dumps(r["outcomes"]),
        ])  # fmt: skip
    print_table(
        f"{'emptyDir' if args.mib else 'OOM'} crash loop, pid={args.pid}, {args.minutes:g} min budget (TCG)",
        ["handler", "restarts", "oom_kill", "s/restart", "dirs", "scope units", "states", "records",
         "dirs after sweep", "states after sweep", "records after sweep", "exits", "runc-guard journal"],
        rows,
    )  # fmt: skip
    if args.mib:
        dying_table(loop, args)
    units = len(tools["scope_units"])
    print(f"sweep: {tools['sweep'][:1]}; audit after: rc {tools['audit_after_rc']}; "
          f"scope units left on the node: {units}; {time.monotonic() - started:.0f} s in all")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"loop": loop, "tools": tools}, f, indent=1)
    os.sync()


if __name__ == "__main__":
    main()
