"""Dying memory cgroups after container deletes: stock runc vs runc-guard (issue 32).

Each lifecycle is a real runc 1.1.5 host-PID container that writes ``--mib`` MiB
into a host directory bind-mounted into it (a log in a volume that outlives the
container), dies (init SIGKILLed: containerd's dead-shim path) and is deleted
with ``delete --force``, by stock runc, then through runc-guard as shipped
(its finisher on: what the reply's 0.1 s leaves is held aside and reclaimed
after the reply). The kernel's count of memory cgroups (``/proc/cgroups``:
live and dying alike) is read before and ``--settle`` seconds after; the
containers' own parent cgroups tell how much page cache each front left charged
below them. Last, one container per front writes ``--large-mib`` (a large cache,
clean then dirty): how long the delete's reply takes with it, how long until
its page cache is gone (runc-guard, finisher on as shipped: held aside and
reclaimed after the reply, delete.memcg_hold), and the cgroup probe's latency
(bench.common.Probe) meanwhile against the 5 s before.

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

from bench.common import PREFIX, Probe, percentile_ms, print_table
from labkit.kernel import RUNC, remove_tree, unique, volume_writer_lifecycle, wait_for, wait_reported
from labkit.scenario import guard_env

MEMORY = "/sys/fs/cgroup/memory"
STOCK = "stock runc 1.1.5"


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


#: How long the large case waits for the page cache below its parent to go (writeback of a dirty GiB
#: waits for the kernel's flusher, dirty_expire_centisecs: 30 s by default; late_reclaim.LATE_MAX 120 s).
FREED_WAIT = 200.0
#: Below this the large container's memcg counts as freed (kernel memory is reparented, not page cache).
FREED_KB = 8 << 10


def large(front: Front, workdir: str, volume: str, mib: int, synced: bool) -> tuple[object, ...]:
    """One container with ``mib`` MiB of page cache (dirty, or clean when ``synced``): the delete's reply
    time, how long until the cache below its parent is gone (runc-guard: held, reclaimed after the reply
    by the finisher; stock: it stays) and the cgroup probe's latency meanwhile against just before."""
    parent = unique(f"{PREFIX}-memcg-large")
    os.mkdir(os.path.join(MEMORY, parent))
    probe_parent = unique(f"{PREFIX}-memcg-probe")
    os.mkdir(os.path.join(MEMORY, probe_parent))
    try:
        with Probe(os.path.join(MEMORY, probe_parent)) as probe:
            time.sleep(5)  # the probe's idle phase
            probe.mark()
            life = volume_writer_lifecycle(workdir, parent, volume, front.argv, front.env, mib, synced)
            replied = time.monotonic()
            probe.mark()
            # stock has nothing that would free it: 15 s show that (the lifecycles' settle time)
            wait = FREED_WAIT if front.name != STOCK else 15.0
            freed = wait_for(lambda: usage_kb(parent) < FREED_KB, wait, 0.1)
            after = time.monotonic() - replied if freed else None
            idle, _, late = probe.phases()[:3]
        return (front.name, mib, "clean" if synced else "dirty", round(life.delete_s * 1000, 1), life.status,
                f"{after:.1f}" if after is not None else f"not in {wait:.0f}", usage_kb(parent),
                round(percentile_ms(idle, 50), 2), round(percentile_ms(idle, 99), 2),
                round(percentile_ms(late, 50), 2), round(percentile_ms(late, 99), 2))
    finally:
        remove_everywhere(parent)
        remove_everywhere(probe_parent)


def remove_everywhere(parent: str) -> None:
    for mount in os.listdir("/sys/fs/cgroup"):
        remove_tree(os.path.join("/sys/fs/cgroup", mount, parent))


def report_stats(workdir: str) -> None:
    stats = os.path.join(workdir, "stats.jsonl")
    if not os.path.exists(stats):
        return
    with open(stats) as f:
        lines = [doc for doc in map(json.loads, f) if doc.get("kind") != "memcg"]  # deletes only
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
        held = [r for e in deletes for r in e.get("memcg_held", {}).values()]
        late = [e for e in entries if e.get("event") == "memcg_reclaimed_late"]
        print(f"held aside: {len(held)}; reclaimed late: {len(late)}, of which removed still charged "
              f"{sum(1 for e in late if e.get('memcg_unreclaimed'))}")


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
    # runc-guard as shipped: its finisher on (guard_env turns it off for tests), which reclaims
    # after the reply what the reply's 0.1 s left
    finishing = Front("runc-guard", [shim], guard_env(workdir, RUNC_GUARD_FINISH_WINDOW="60"))
    fronts = [Front(STOCK, [RUNC], dict(os.environ)), finishing]
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
            f"one container with {args.large_mib} MiB of page cache in a volume; cgroup probe (mkdir+rmdir) "
            "ms 5 s before vs from the reply until freed",
            ["front", "MiB", "cache", "delete ms", "exit", "freed after s", "KiB left charged",
             "probe p50 before", "probe p99 before", "probe p50 after", "probe p99 after"],
            [large(front, workdir, volume, args.large_mib, synced)
             for synced in (True, False) for front in (fronts[0], finishing)],
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
