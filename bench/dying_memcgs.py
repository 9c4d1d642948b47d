"""Dying memory cgroups after container deletes: stock runc vs runc-guard (issue 32).

Each lifecycle is a real runc 1.1.5 host-PID container that writes ``--mib`` MiB
into a host directory bind-mounted into it (a log in a volume that outlives the
container), dies (init SIGKILLed: containerd's dead-shim path) and is deleted
with ``delete --force``, by stock runc or through runc-guard, alternating one
lifecycle of each. The kernel's count of memory cgroups (``/proc/cgroups``:
live and dying alike) is read before and ``--settle`` seconds after; the
containers' own parent cgroups tell how much page cache each front left charged
below them. A last pair writes ``--large-mib`` (a large cache): how long the
delete's reply takes with it, and whether runc-guard reclaimed it or left it.

The memcg count is node-wide: run it on a quiet machine. As root:
``python -m bench.dying_memcgs [--lifecycles 10] [--mib 1] [--large-mib 1024]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from bench.common import PREFIX, print_table
from labkit.kernel import RUNC, remove_tree, unique, volume_writer_lifecycle
from labkit.scenario import guard_env

MEMORY = "/sys/fs/cgroup/memory"


def memcgs() -> int:
    with open("/proc/cgroups") as f:
        for line in f:
            fields = line.split()
            if fields and fields[0] == "memory":
                return int(fields[2])
    raise RuntimeError("no memory controller in /proc/cgroups")


def usage_kb(parent: str) -> int:
    with open(os.path.join(MEMORY, parent, "memory.usage_in_bytes")) as f:
        return int(f.read()) >> 10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lifecycles", type=int, default=10)
    parser.add_argument("--mib", type=int, default=1)
    parser.add_argument("--large-mib", type=int, default=1024)
    parser.add_argument("--settle", type=float, default=15.0)
    args = parser.parse_args()
    if not os.path.isdir(MEMORY):
        sys.exit("bench.dying_memcgs: needs the cgroup v1 memory hierarchy (the VM lab is the v2 case)")
    shim = os.path.join(os.path.dirname(sys.executable), "runc-guard")
    workdir = tempfile.mkdtemp(prefix=f"{PREFIX}-memcg-")
    volume = tempfile.mkdtemp(prefix=f"{PREFIX}-volume-", dir="/var/tmp")
    fronts = {"stock runc 1.1.5": [RUNC], "runc-guard": [shim]}
    parents = {name: unique(f"{PREFIX}-memcg") for name in fronts}
    env = {name: guard_env(workdir) if name == "runc-guard" else dict(os.environ) for name in fronts}
    try:
        for parent in parents.values():
            os.mkdir(os.path.join(MEMORY, parent))
        before = memcgs()
        replies: dict[str, list[float]] = {name: [] for name in fronts}
        statuses: dict[str, list[int]] = {name: [] for name in fronts}
        counts: dict[str, int] = {}
        for name, argv in fronts.items():  # one front at a time: the memcg count is node-wide
            start = memcgs()
            for _ in range(args.lifecycles):
                life = volume_writer_lifecycle(workdir, parents[name], volume, argv, env[name], args.mib)
                replies[name].append(life.delete_s)
                statuses[name].append(life.status)
            time.sleep(args.settle)
            counts[name] = memcgs() - start
        rows = [
            (name, args.lifecycles, f"+{counts[name]}", usage_kb(parents[name]),
             round(statistics.median(replies[name]) * 1000, 1), sorted(set(statuses[name])))
            for name in fronts
        ]
        print_table(
            f"{args.lifecycles} lifecycles x {args.mib} MiB into a volume, delete --force (host PID, hybrid)",
            ["front", "lifecycles", f"memcgs {args.settle:.0f} s later", "KiB left charged below the parent",
             "delete p50 ms", "exit statuses"],
            rows,
        )
        large = []
        for name, argv in fronts.items():
            parent = unique(f"{PREFIX}-memcg-large")
            parents[f"{name} large"] = parent
            os.mkdir(os.path.join(MEMORY, parent))
            life = volume_writer_lifecycle(workdir, parent, volume, argv, env[name], args.large_mib)
            large.append((name, args.large_mib, round(life.delete_s * 1000, 1), life.status,
                          usage_kb(parent)))
        print_table(
            f"one container with {args.large_mib} MiB of page cache (dirty) in a volume",
            ["front", "MiB", "delete ms", "exit", "KiB left charged"],
            large,
        )
        stats = os.path.join(workdir, "stats.jsonl")
        if os.path.exists(stats):
            with open(stats) as f:
                lines = [json.loads(line) for line in f]
            kb = [line.get("reclaimed_kb", 0) for line in lines]
            left = sum(line.get("memcg_left", 0) for line in lines)
            print(f"\nrunc-guard's stats lines: {len(lines)} deletes, reclaimed KiB p50 "
                  f"{statistics.median(kb) if kb else 0}, memcgs left charged {left}")
        print(f"memory cgroups on the node: {before} before, {memcgs()} after")
    finally:
        for parent in parents.values():
            for mount in os.listdir("/sys/fs/cgroup"):
                remove_tree(os.path.join("/sys/fs/cgroup", mount, parent))
        shutil.rmtree(volume, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
