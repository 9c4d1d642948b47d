"""Which per-directory work of the sweep does the concurrent probe feel? An A/B at one fixed rate.

The same leaked tree (``--containers`` x every hierarchy) is removed in-process
at one fixed rate (``--batch`` directories, then a sleep so each batch starts
``--period`` s after the previous one), whole containers at a time, with a
different amount of work per directory in each variant, while the probe of
bench.sweep_gentleness (mkdir+rmdir of a memory cgroup every 5 ms; another
hierarchy with ``--probe-hierarchy``, e.g. ``cpuset``) runs:

- ``rmdir``: rmdir only (the floor: what the kernel's teardown costs);
- ``once``: one look per directory (list children, read ``cgroup.procs``), then rmdir;
- ``twice``: the sweep's work before 2026-12-01: ``read_facts`` (list, lstat,
  ``cgroup.procs``) then ``attempt_removal`` (list, ``cgroup.procs`` again, rmdir);
- ``stat``: list + lstat, no ``cgroup.procs`` read, then rmdir (is it the read?);
- ``by-hierarchy``: ``once``, but one hierarchy's directories back to back
  instead of container by container (every hierarchy in turn);
  ``memory-first`` / ``memory-last``: the same with the memory hierarchy first / last;
- ``created``: ``once``, containers in the order the kernel made them (inode numbers);
- ``flag``: ``once``, and each v1 cpuset's ``cpuset.sched_load_balance`` set to 0
  before its rmdir (what the sweep does since 2026-12-01: RealCgroupFs.stop_load_balance);
- ``hold``: nothing removed; the tree stays next to the probe for ``--idle`` s.

Variants run ``--rounds`` times, interleaved with idle phases; the probe's p99
is compared with the pooled idle p99. Run as root:
``python -m bench.sweep_work --containers 2000 --rounds 2``; the figures are in
docs/sweep-pacing.md ("What drives the probe's tail").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable

from bench.common import (
    PREFIX,
    Probe,
    build_pod_tree,
    cgroup_mounts,
    phase_stats,
    print_table,
    remove_everywhere,
)
from runc_guard.delete.cgroupfs import RealCgroupFs
from runc_guard.delete.cleanup import attempt_removal, subtree_leaf_first
from runc_guard.errors import CleanupReport

FS = RealCgroupFs()


def _rmdir(unit: list[str]) -> int:
    for path in unit:
        os.rmdir(path)
    return len(unit)


def _once(unit: list[str]) -> int:
    for path in unit:
        for sub in subtree_leaf_first(path, FS):
            if not FS.read_procs(sub):
                os.rmdir(sub)
    return len(unit)


def _flag(unit: list[str]) -> int:
    """``once``, and a v1 cpuset's sched_load_balance cleared before its rmdir (see the docstring)."""
    for path in unit:
        for sub in subtree_leaf_first(path, FS):
            if not FS.read_procs(sub):
                if "/cpuset/" in sub:
                    with open(os.path.join(sub, "cpuset.sched_load_balance"), "w") as f:
                        f.write("0")
                os.rmdir(sub)
    return len(unit)


def _twice(unit: list[str]) -> int:
    for path in unit:
        for sub in subtree_leaf_first(path, FS):
            FS.modified_at(sub)
            FS.read_procs(sub)
    attempt_removal(unit, FS, CleanupReport(), kill=False)
    return len(unit)


def _stat(unit: list[str]) -> int:
    for path in unit:
        for sub in subtree_leaf_first(path, FS):
            FS.modified_at(sub)
            os.rmdir(sub)
    return len(unit)


VARIANTS: dict[str, Callable[[list[str]], int]] = {
    "rmdir": _rmdir,
    "once": _once,
    "twice": _twice,
    "stat": _stat,
    "by-hierarchy": _once,
    "memory-first": _once,
    "memory-last": _once,
    "hold": _once,
    "created": _once,
    "flag": _flag,
}


def units_of(pods: list[str], name: str) -> list[list[str]]:
    """Container by container (each unit: its dir in every hierarchy), or hierarchy by hierarchy."""
    ids = sorted(os.listdir(pods[0]))
    ids = [i for i in ids if os.path.isdir(os.path.join(pods[0], i))]
    if name == "hold":
        return []
    if name == "created":  # in the order the kernel made them: kernfs inode numbers grow
        ids.sort(key=lambda i: os.lstat(os.path.join(pods[0], i)).st_ino)
    if name in ("memory-first", "memory-last"):
        first = name == "memory-first"
        pods = sorted(pods, key=lambda p: ("/memory/" in p) != first)
    if name in ("by-hierarchy", "memory-first", "memory-last"):
        return [[os.path.join(pod, i)] for pod in pods for i in ids]
    return [[os.path.join(pod, i) for pod in pods] for i in ids]


def paced(units: list[list[str]], work: Callable[[list[str]], int], batch: int, period: float) -> float:
    """Remove ``units`` with ``work``, ``batch`` dirs per ``period`` s; returns the time spent removing."""
    busy = 0.0
    done = 0
    next_start = time.monotonic()
    for unit in units:
        if done >= batch:
            done = 0
            next_start += period
            time.sleep(max(0.0, next_start - time.monotonic()))
        t = time.monotonic()
        done += work(unit)
        busy += time.monotonic() - t
    return busy


def main() -> int:  # noqa: PLR0915 - one linear script of phases
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--containers", type=int, default=2000)
    parser.add_argument("--idle", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--period", type=float, default=0.33)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--probe-hierarchy", default="memory", help="where the probe makes its cgroups")
    args = parser.parse_args()
    names = args.variants.split(",")
    mounts = cgroup_mounts()
    top = f"{PREFIX}-work-{uuid.uuid4().hex[:8]}"
    probe_mount = next((m for m in mounts if m.endswith("/" + args.probe_hierarchy)), mounts[0])
    probe_parent = os.path.join(probe_mount, f"{PREFIX}-probe-{uuid.uuid4().hex[:8]}")
    labels: list[tuple[str, float, float]] = []
    os.mkdir(probe_parent)
    try:
        with Probe(probe_parent) as probe:
            for rnd in range(args.rounds):
                order = names[rnd % len(names) :] + names[: rnd % len(names)]
                for name in order:
                    probe.mark()
                    labels.append(("idle", args.idle, 0.0))
                    time.sleep(args.idle)
                    probe.mark()
                    labels.append(("(setup)", 0.0, 0.0))
                    pods = build_pod_tree(top, f"pod{uuid.uuid4()}", args.containers, mounts)
                    time.sleep(1)
                    units = units_of(pods, name)
                    probe.mark()
                    t = time.monotonic()
                    busy = paced(units, VARIANTS[name], args.batch, args.period)
                    if name == "hold":  # the tree stays: the probe next to it, nothing removed
                        time.sleep(args.idle)
                    labels.append((name, time.monotonic() - t, busy))
                    probe.mark()
                    labels.append(("(cleanup)", 0.0, 0.0))
                    for pod in pods:
                        for child in os.listdir(pod):
                            if os.path.isdir(os.path.join(pod, child)):
                                os.rmdir(os.path.join(pod, child))
                        os.rmdir(pod)
                    print(f"  {name}: {labels[-2][1]:.1f} s (removing {busy:.1f} s)", file=sys.stderr)
            probe.mark()
            labels.append(("idle", args.idle, 0.0))
            time.sleep(args.idle)
            timed = probe.timed_phases()[1:]
            phases = [[lat for _, lat in phase] for phase in timed]
    finally:
        remove_everywhere(top)
        remove_everywhere(os.path.relpath(probe_parent, os.path.dirname(probe_parent)))
    pooled = [
        s for (label, _, _), samples in zip(labels, phases, strict=False) if label == "idle" for s in samples
    ]
    idle = phase_stats(pooled)
    rows: list[tuple[object, ...]] = [("idle (pooled)", "", "", *idle, 1.0)]
    per: dict[str, list[float]] = {}
    for (label, elapsed, busy), samples in zip(labels, phases, strict=False):
        if label in ("idle", "(setup)", "(cleanup)"):
            continue
        stats = phase_stats(samples)
        per.setdefault(label, []).append(stats[2] / idle[2])
        rows.append((label, elapsed, busy, *stats, stats[2] / idle[2]))
    print_table(
        f"{args.containers} containers x {len(mounts)} hierarchies, {args.batch} dirs every {args.period} s, "
        f"probe in {probe_mount}",
        ["variant", "s", "removing s", "probe samples", "p50 ms", "p99 ms", "max ms", "p99 / pooled idle"],
        rows,
    )
    tens: list[tuple[object, ...]] = []
    for (label, _, _), samples in zip(labels, timed, strict=False):
        if label in ("idle", "(setup)", "(cleanup)") or not samples:
            continue
        start = samples[0][0]
        slices: dict[int, list[float]] = {}
        for at, lat in samples:
            slices.setdefault(int((at - start) // 5), []).append(lat)
        tens.append((label, *(f"{phase_stats(v)[2]:.2f}" for _, v in sorted(slices.items()))))
    print_table("probe p99 ms per 5 s of each variant", ["variant", "5 s slices..."], tens)
    print_table(
        "median ratio per variant",
        ["variant", "runs", "p99 / pooled idle (median)"],
        [(k, len(v), statistics.median(v)) for k, v in per.items()],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
