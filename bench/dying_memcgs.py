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

The memcg count is node-wide: run it on a quiet machine. Dying memcgs left by
earlier work are freed whenever their pages go, which would move the count under
the bench, so it first writes back and drops the node's clean page cache
(``sync; echo 1 > /proc/sys/vm/drop_caches``: a lab machine's, never a node's;
``--no-drop-caches`` skips it). As root:
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
from labkit.kernel import RUNC, remove_tree, unique, volume_writer_lifecycle, wait_reported
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


def drop_page_cache(what: int = 1) -> None:
    """Write back and drop the clean page cache, so dying memcgs left by earlier work go first.

    ``what`` 3 drops the reclaimable slab (dentries, inodes) too, which can pin a dying memcg as well.
    """
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write(str(what))
    time.sleep(2)


class Front:
    """One front's lifecycles: the delete's argv and environment, its parent cgroup, what it left."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name, self.argv, self.env = name, argv, env
        self.parent = unique(f"{PREFIX}-memcg")
        self.replies: list[float] = []
        self.statuses: list[int] = []
        self.memcgs = 0
        self.left_kb = 0

    def run(self, workdir: str, volume: str, args: argparse.Namespace) -> None:
        os.mkdir(os.path.join(MEMORY, self.parent))
        if not args.no_drop_caches:
            drop_page_cache()
        start = memcgs()
        for _ in range(args.lifecycles):
            life = volume_writer_lifecycle(workdir, self.parent, volume, self.argv, self.env, args.mib)
            self.replies.append(life.delete_s)
            self.statuses.append(life.status)
        time.sleep(args.settle)
        self.memcgs = memcgs() - start
        self.left_kb = usage_kb(self.parent)

    def row(self, lifecycles: int) -> tuple[object, ...]:
        return (self.name, lifecycles, f"{self.memcgs:+d}", self.left_kb,
                round(statistics.median(self.replies) * 1000, 1), sorted(set(self.statuses)))


def large(front: Front, workdir: str, volume: str, mib: int) -> tuple[object, ...]:
    """One container with ``mib`` MiB of dirty page cache: the delete's time and what stays charged."""
    parent = unique(f"{PREFIX}-memcg-large")
    os.mkdir(os.path.join(MEMORY, parent))
    try:
        life = volume_writer_lifecycle(workdir, parent, volume, front.argv, front.env, mib)
        return (front.name, mib, round(life.delete_s * 1000, 1), life.status, usage_kb(parent))
    finally:
        remove_everywhere(parent)


def remove_everywhere(parent: str) -> None:
    for mount in os.listdir("/sys/fs/cgroup"):
        remove_tree(os.path.join("/sys/fs/cgroup", mount, parent))


def report_stats(workdir: str) -> None:
    stats = os.path.join(workdir, "stats.jsonl")
    if not os.path.exists(stats):
        return
    with open(stats) as f:
        lines = [json.loads(line) for line in f]
    kb = [line.get("reclaimed_kb", 0) for line in lines]
    left = sum(line.get("memcg_left", 0) for line in lines)
    print(f"\nrunc-guard's stats lines: {len(lines)} deletes, reclaimed KiB p50 "
          f"{statistics.median(kb) if kb else 0}, memcgs left charged {left}")
    wait_reported(os.path.join(workdir, "cache"), timeout=30)
    events = os.path.join(workdir, "events.jsonl")
    if os.path.exists(events):
        with open(events) as f:
            entries = [json.loads(line) for line in f if line.strip()]
        deletes = [e for e in entries if e.get("event") == "delete"]
        why = [r for e in deletes for r in e.get("memcg_unreclaimed", {}).values()]
        print(f"left charged, why: {dict((r, why.count(r)) for r in set(why)) or 'none'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lifecycles", type=int, default=10)
    parser.add_argument("--mib", type=int, default=1)
    parser.add_argument("--large-mib", type=int, default=1024)
    parser.add_argument("--settle", type=float, default=15.0)
    parser.add_argument("--no-drop-caches", action="store_true",
                        help="do not drop the page cache first (the count may move under the bench)")
    args = parser.parse_args()
    if not os.path.isdir(MEMORY):
        sys.exit("bench.dying_memcgs: needs the cgroup v1 memory hierarchy (the VM lab is the v2 case)")
    shim = os.path.join(os.path.dirname(sys.executable), "runc-guard")
    workdir = tempfile.mkdtemp(prefix=f"{PREFIX}-memcg-")
    volume = tempfile.mkdtemp(prefix=f"{PREFIX}-volume-", dir="/var/tmp")
    fronts = [Front("stock runc 1.1.5", [RUNC], dict(os.environ)),
              Front("runc-guard", [shim], guard_env(workdir))]
    try:
        before = memcgs()
        for front in fronts:  # one front at a time: the memcg count is node-wide
            front.run(workdir, volume, args)
        print_table(
            f"{args.lifecycles} lifecycles x {args.mib} MiB into a volume, delete --force (host PID, hybrid)",
            ["front", "lifecycles", f"memcgs {args.settle:.0f} s later", "KiB left charged below the parent",
             "delete p50 ms", "exit statuses"],
            [front.row(args.lifecycles) for front in fronts],
        )
        print_table(
            f"one container with {args.large_mib} MiB of page cache (dirty) in a volume",
            ["front", "MiB", "delete ms", "exit", "KiB left charged"],
            [large(front, workdir, volume, args.large_mib) for front in fronts],
        )
        report_stats(workdir)
        print(f"memory cgroups on the node: {before} before, {memcgs()} after")
    finally:
        for front in fronts:
            remove_everywhere(front.parent)
        shutil.rmtree(volume, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
