"""Dying memory cgroups in a 1 s crash loop through the CRI: stock runc vs runc-guard (issue 32).

bench.crashloop's kubelet at the KEP-5593 back-off floor, with an ``emptyDir``:
each pod gets a host directory bind-mounted at /data that outlives every attempt,
and each attempt first appends ``--mib`` MiB to /data/crash.log (no fsync: a
log append), then starts the bench's sleepers and crashes as bench.crashloop
crashes (init SIGKILLed, two children dying 0.3-3 s later). The crash is kept,
not a plain non-zero exit, because a crash-looping pod is one kubelet restarts
after the runtime has torn it down, and the OOM kill KEP-5593 is about is a
SIGKILL from outside with a teardown that takes time; the same seed gives both
handlers the same teardowns.

The memory cgroup count (``/proc/cgroups``) is node-wide on a hybrid host and
counts dying memcgs, so the handlers run one after the other (stock, then
runc-guard), each after ``sync; echo 3 > /proc/sys/vm/drop_caches`` (dying
memcgs of earlier work go first). Every ``--sample`` s: that count, and per
handler the memory charged below its pods' own cgroups in the v1 memory
hierarchy (``memory.usage_in_bytes``: hierarchical, so it includes what dying
children still pin; immune to other work on the node). Reported per handler:
restarts, restarts per minute, the count at the start, when the last attempt
is removed and ``--settle`` s later, its growth per restart, KiB pinned below
the pods, and how the deletes ended (containerd's failed task deletes; for
runc-guard its stats lines' outcomes and what it reclaimed).

Run as root, on a quiet machine: ``python -m bench.memcg_crashloop [--minutes 10]
[--pods 1] [--mib 1] [--containerd 1.6]`` (1.7 and 2.1 come from Debian's archive, ``labkit.runtimes``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
from typing import Any

from bench import crashloop as loopbench
from bench.common import print_table
from bench.dying_memcgs import MEMORY, drop_page_cache, memcgs
from labkit import containerd as cl
from labkit import cri as cr
from runc_guard.delete.outcomes import MEMCG_LINE

#: Where an attempt sees its pod's emptyDir, and the log it appends to there.
DATA, LOG = "/data", "crash.log"


def pinned_kb(loops: list[loopbench.PodLoop]) -> int | None:
    """KiB charged below these pods' own memory cgroups (live and dying children), None when gone."""
    total = 0
    for loop in loops:
        try:
            with open(os.path.join(MEMORY, loop.pod.cgroup_parent.strip("/"), "memory.usage_in_bytes")) as f:
                total += int(f.read()) >> 10
        except (OSError, ValueError):
            return None
    return total


def probe(loops: dict[str, list[loopbench.PodLoop]]) -> dict[str, Any]:
    """The node's memcg count and, per handler, what is charged below its pods."""
    return {"memcgs": memcgs(), "pinned_kb": {h: pinned_kb(pod_loops) for h, pod_loops in loops.items()}}


def appender(volumes: str, mib: int) -> loopbench.Workload:
    """Each pod's emptyDir under ``volumes``; each attempt appends ``mib`` MiB there, then sleeps."""
    sleepers = cl.sleepers_command(loopbench.CHILDREN)

    def workload(pod: cr.Pod) -> tuple[list[str], list[dict[str, Any]]]:
        empty_dir = os.path.join(volumes, pod.name)
        os.makedirs(empty_dir, exist_ok=True)
        # head, not dd: the lab's busybox image has no dd applet. ``>>``: an append, never fsync'd.
        script = f"head -c {mib << 20} /dev/zero >> {DATA}/{LOG}; {sleepers[-1]}"
        return [*sleepers[:-1], script], [{"container_path": DATA, "host_path": empty_dir}]

    return workload


def unreclaimed(lab: cr.CriLab, result: loopbench.Result) -> dict[str, int]:
    """Why runc-guard left memcgs charged, counted: its canonical delete entries' ``memcg_unreclaimed``,
    the memcgs they held aside (``held``), and of those what the finisher removed still charged
    (``late: <why>``, from its ``memcg_reclaimed_late`` entries; ``late: freed`` when none was)."""
    ids = {cid for loops in result.loops.values() for loop in loops for cid in loop.attempts}
    why: dict[str, int] = {}

    def count(key: str) -> None:
        why[key] = why.get(key, 0) + 1

    for entry in cl.guard_events(lab.settings):
        if entry.get("container_id") not in ids:
            continue
        if entry.get("event") == "delete":
            for reason in entry.get("memcg_unreclaimed", {}).values():
                count(reason)
            for _ in entry.get("memcg_held", {}):
                count("held")
        elif entry.get("event") == "memcg_reclaimed_late":
            for reason in entry.get("memcg_unreclaimed", {"": "freed"}).values():
                count(f"late: {reason.split(' (')[0]}")
    return why


def summary(handler: str, result: loopbench.Result, minutes: float, why: dict[str, int]) -> dict[str, Any]:
    """One handler's figures: restarts, the memcg count three times, what is pinned, how deletes ended."""
    restarts = sum(loop.restarts for loop in result.loops[handler])
    start = result.samples[0]
    outcomes: dict[str, int] = {}
    left_by: dict[str, int] = {}  # memcgs left charged, by the delete's outcome (did it wait?)
    deletes = [s for s in result.stats if s.get("kind") != MEMCG_LINE]  # not a late reclaim's line
    for s in deletes:
        outcomes[str(s.get("outcome"))] = outcomes.get(str(s.get("outcome")), 0) + 1
        if s.get("memcg_left"):
            left_by[str(s.get("outcome"))] = left_by.get(str(s.get("outcome")), 0) + int(str(s["memcg_left"]))
    return {
        "restarts": restarts,
        "per_minute": restarts / minutes,
        "memcgs": [start["memcgs"], result.at_end["memcgs"], result.settled["memcgs"]],
        "growth_per_restart": (result.settled["memcgs"] - start["memcgs"]) / restarts if restarts else None,
        "pinned_kb": [start["pinned_kb"][handler], result.at_end["pinned_kb"][handler],
                      result.settled["pinned_kb"][handler]],
        "taskexit_errors": result.requeued.get(handler, 0),
        "outcomes": outcomes,
        "reclaimed_kb": sum(int(str(s.get("reclaimed_kb", 0))) for s in result.stats),
        "memcg_left": sum(int(str(s.get("memcg_left", 0))) for s in result.stats),
        "waited_s": sum(int(str(s.get("waited_ms", 0))) for s in deletes) / 1000,
        "unreclaimed": why,
        "left_by_outcome": left_by,
        "stuck": sum(loop.stuck for loop in result.loops[handler]),
        "errors": [e for loop in result.loops[handler] for e in loop.errors],
    }


def report(runs: dict[str, dict[str, Any]], labels: dict[str, str], title: str, settle: float) -> None:
    rows = []
    for handler, run in runs.items():
        s = run["summary"]
        growth = s["growth_per_restart"]
        deletes = f"containerd failed task deletes (TaskExit errors) {s['taskexit_errors']}"
        if handler == cr.GUARD_HANDLER:
            deletes += (f"; runc-guard outcomes {json.dumps(s['outcomes'])}, waited {s['waited_s']:.1f} s, "
                        f"reclaimed {s['reclaimed_kb']:,} KiB, memcgs left charged {s['memcg_left']} "
                        f"{json.dumps(s['unreclaimed'])}, by outcome {json.dumps(s['left_by_outcome'])}")
        rows.append([
            labels[handler], s["restarts"], f"{s['per_minute']:.1f}", " / ".join(str(m) for m in s["memcgs"]),
            "-" if growth is None else f"{growth:+.3f}", " / ".join(f"{k:,}" for k in s["pinned_kb"]),
            deletes, s["stuck"], len(s["errors"]),
        ])  # fmt: skip
    print_table(title, [
        "handler", "restarts", "restarts/min", f"node memcgs start / end / end+{settle:g} s",
        f"memcgs per restart (end+{settle:g} s)", f"KiB below the pod start / end / end+{settle:g} s",
        "deletes", "stuck", "bench errors"], rows)
    minutes = max(int(max(s["t"] for s in run["samples"]) // 60) for run in runs.values())
    over_time = []
    for minute in range(minutes + 1):
        row: list[object] = [minute]
        for handler, run in runs.items():
            sample = min(run["samples"], key=lambda s, m=minute: abs(s["t"] - 60 * m))
            row += [sample["memcgs"], sample[handler]["restarts"], sample["pinned_kb"][handler]]
        over_time.append(row)
    print_table("over time (the sample nearest each minute)", [
        "minute", *(f"{labels[h]}: {what}" for h in runs
                    for what in ("node memcgs", "restarts", "KiB below"))],
        over_time)
    for handler, run in runs.items():
        for line in run["summary"]["errors"][:5]:
            print(f"error ({handler}): {line}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=1, help="crash-looping pods per handler")
    parser.add_argument("--minutes", type=float, default=10.0, help="per handler")
    parser.add_argument("--mib", type=int, default=1, help="appended to the emptyDir by each attempt")
    parser.add_argument("--containerd", choices=loopbench.CONTAINERDS, default=cl.CONTAINERD_16)
    parser.add_argument("--runc", choices=loopbench.RUNCS, default=None,
                        help="default: the containerd build's own (1.6: 1.1.5, 1.7 and 2.1: 1.3.6)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--settle", type=float, default=15.0,
                        help="seconds after the last delete, count again")
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--no-drop-caches", action="store_true",
                        help="do not drop the page cache before each handler (the count may move under it)")
    parser.add_argument("--json", default=None, metavar="PATH", help="the samples and the figures")
    args = parser.parse_args()
    if not os.path.isdir(MEMORY):
        sys.exit("bench.memcg_crashloop: needs the cgroup v1 memory hierarchy "
                 "(bench.vm_crashloop is the v2 case)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    workdir = tempfile.mkdtemp(prefix="rgmemloop-")
    # On disk, not /tmp: a tmpfs page is shmem, which no reclaim frees without swap.
    volumes = tempfile.mkdtemp(prefix="rgmemloop-emptydir-", dir="/var/tmp")
    runs: dict[str, dict[str, Any]] = {}
    try:
        with loopbench.lab_in(workdir, args.containerd, args.runc, **loopbench.node_overrides()) as lab:
            runc_version = loopbench.runc_version(lab.runc)
            labels = {cr.STOCK_HANDLER: f"stock runc {runc_version}", cr.GUARD_HANDLER: "runc-guard"}
            for handler, label in labels.items():  # one after the other: the count is node-wide
                if not args.no_drop_caches:
                    drop_page_cache(3)
                print(f"{label}: {args.minutes:g} min", file=sys.stderr, flush=True)
                result = loopbench.crash_loops(
                    lab, args.pods, args.minutes * 60, seed, args.settle, args.sample, handlers=(handler,),
                    progress=True, workload=appender(volumes, args.mib), probe=probe)
                why = unreclaimed(lab, result) if handler == cr.GUARD_HANDLER else {}
                runs[handler] = {"summary": summary(handler, result, args.minutes, why),
                                 "samples": result.samples, "deletes": result.stats}
                for loop in result.loops[handler]:  # its pause container and cgroups go before the next run
                    with contextlib.suppress(RuntimeError, OSError):
                        lab.remove_pod(loop.pod)
        title = (f"Crash loop with an emptyDir: {args.pods} pod(s) per handler, one handler after the other, "
                 f"{args.minutes:g} min each, {args.mib} MiB appended per attempt, "
                 f"containerd {args.containerd} + runc {runc_version}, hybrid host (seed {seed})")
        report(runs, labels, title, args.settle)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"title": title, "labels": labels, "seed": seed, "runs": runs}, f)
    finally:
        shutil.rmtree(volumes, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
