"""Sweep gentleness: removing 8147 leaked containers x every hierarchy without stalling the node.

A synthetic tree in the incident's shape (docs/background.md, the failure): ``<hierarchy>/rgbench-sweep-<x>/
burstable/pod<uid>/<64-hex id>`` for 8147 ids in all 10 hierarchies of this
machine (81,470 empty directories). While it is removed, a probe process
creates and removes a cgroup in a loop (what every other pod's runtime does),
recording each pair's latency; every cgroup v1/v2 mkdir and rmdir takes the
kernel's global ``cgroup_mutex``. Phases, one after the other in one run with
the same probe:

- ``idle``: nothing but the probe, before every other phase and at the end;
  pooled, they are the baseline (the machine's own noise over the run);
- ``naive rmdir loop``: the control, every directory removed as fast as possible;
- ``sweep --pacing fixed``: ``runc-guardctl sweep`` with the fixed pace's
  defaults (batch 500 directories, pause 1 s, sys% ceiling 30);
- ``sweep --pacing fixed --pause 0``: the same with no pause;
- ``sweep --pacing adaptive``: the feedback pace (docs/sweep-pacing.md);
- ``naive rmdir loop`` (``--naive``): the control, every directory removed as
  fast as possible.

Every sweep runs with ``--min-age 0`` (the tree is seconds old) and
runtime/bundle roots pointed at empty directories. The modes run ``--rounds``
times, interleaved (round-robin, the order rotating each round), so each sees
the same noise of this shared machine; the summary quotes medians over rounds.

Reported per phase: probe p50/p99/max against the pooled idle phases and the
idle phase just before it, node-wide system CPU % (/proc/stat, all cores),
the remover's own CPU (wait4 rusage) and total time; per sweep, a table per
second (batch target, dirs removed, pause, canary, signals over their limit,
probe p99, sys%) from the sweep's JSON report and a /proc/stat sampler.
Target (issue 14): 8147 x 10 dirs in <= 60 s with the probe's p99 <= 2x idle.
``--plot PNG`` draws the probe's latency by percentile per phase, idle in black
(bench.plots; matplotlib is the ``bench`` extra).

Run as root: ``python -m bench.sweep_gentleness [--containers 8147] [--idle 5] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

from bench.common import (
    PREFIX,
    Probe,
    build_pod_tree,
    cgroup_mounts,
    percentile_ms,
    phase_stats,
    print_table,
    remove_everywhere,
    run_measured,
    sys_percent,
)
from labkit.scenario import guard_env
from runc_guard.node.sweep import cpu_sample

#: The naive control: a separate interpreter removing every container dir, no pause.
NAIVE = """
import os, sys
for pod in sys.argv[1:]:
    for name in os.listdir(pod):
        p = os.path.join(pod, name)
        if os.path.isdir(p):
            os.rmdir(p)
"""


#: The kernel finishes a removed cgroup later (css offline/free in workqueues, which
#: take cgroup_mutex again): the first part of each pause is told apart from the rest.
AFTER_BATCH = 0.2
SEGMENTS = (
    "start-up + discovery",
    "planning (reads every unit)",
    "removing (in a batch)",
    f"pause: first {AFTER_BATCH:g} s after a batch",
    "pause: the rest",
)


def split_sweep(
    timeline: tuple[float, float, float, list[tuple[float, float]]], samples: list[tuple[float, float]]
) -> list[tuple[str, float, list[float]]]:
    """Split a sweep phase's probe samples: start-up and discovery, planning, removing, pausing.

    The report's batch times are relative to the start of ``Sweeper.run``, which began
    ``duration`` seconds before the process ended (its exit work is a few ms).
    """
    t_start, t_end, duration, batches = timeline
    run_start = t_end - duration
    starts = [run_start + a for a, _ in batches]
    ends = [run_start + b for _, b in batches]
    first = starts[0] if batches else t_end
    last = ends[-1] if batches else t_end
    buckets: list[list[float]] = [[], [], [], [], []]
    for at, latency in samples:
        if at > last:
            continue
        if at < run_start:
            buckets[0].append(latency)
        elif at < first:
            buckets[1].append(latency)
        else:
            i = bisect.bisect_right(starts, at) - 1
            if at <= ends[i]:
                buckets[2].append(latency)
            else:
                buckets[3 if at - ends[i] <= AFTER_BATCH else 4].append(latency)
    in_batches = sum(b - a for a, b in zip(starts, ends, strict=True))
    gaps = [min(AFTER_BATCH, nxt - end) for end, nxt in zip(ends, [*starts[1:], last], strict=True)]
    seconds = [
        run_start - t_start,
        first - run_start,
        in_batches,
        sum(gaps),
        last - first - in_batches - sum(gaps),
    ]
    return list(zip(SEGMENTS, seconds, buckets, strict=True))


#: name -> (label, runc-guardctl sweep arguments)
MODES: dict[str, tuple[str, list[str]]] = {
    "fixed": ("sweep --pacing fixed (defaults)", ["--pacing", "fixed"]),
    "pause0": ("sweep --pacing fixed --pause 0", ["--pacing", "fixed", "--pause", "0"]),
    "adaptive": ("sweep --pacing adaptive", ["--pacing", "adaptive"]),
}


class CpuSampler:
    """/proc/stat every 0.1 s in a thread, so any second of a phase has its node sys%."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.samples: list[tuple[float, tuple[int, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), cpu_sample()))
            self._stop.wait(self.interval)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def sys_between(self, start: float, end: float) -> float | None:
        """Node sys% between the samples nearest to ``start`` and ``end``."""
        times = [at for at, _ in self.samples]
        i = min(bisect.bisect_left(times, start), len(times) - 1)
        j = min(bisect.bisect_left(times, end), len(times) - 1)
        if j <= i:
            return None
        return sys_percent(self.samples[i][1], self.samples[j][1])


def per_second(
    phase: dict[str, Any], samples: list[tuple[float, float]], sampler: CpuSampler
) -> list[tuple[object, ...]]:
    """One row per second of a sweep: what the pace decided and what the probe and /proc/stat saw."""
    _t_start, t_end, duration, _ = phase["timeline"]
    run_start = t_end - duration
    seconds = max(1, int(duration + 0.999))
    rows: list[tuple[object, ...]] = []
    batches = phase["batch_docs"]
    for sec in range(seconds):
        lo, hi = run_start + sec, run_start + min(sec + 1, duration)
        in_sec = [b for b in batches if sec <= b["started"] < sec + 1]
        probe = [lat for at, lat in samples if lo <= at < hi]
        canaries = [b["canary_ms"] for b in in_sec if b.get("canary_ms") is not None]
        congested = sorted({c for b in in_sec for c in b.get("congested", [])})
        decisions = [b["decision"] for b in in_sec if b.get("decision")]
        counted = " ".join(f"{d} {decisions.count(d)}" for d in sorted(set(decisions)))
        node_sys = sampler.sys_between(lo, hi)
        rows.append(
            (
                sec,
                len(in_sec),
                max((b.get("target", 0) for b in in_sec), default=""),
                sum(b["dirs_removed"] for b in in_sec),
                max((b["pause"] for b in in_sec), default=""),
                max(canaries) if canaries else "",
                " ".join(congested),
                counted,
                len(probe),
                percentile_ms(probe, 99) if probe else "",
                max(probe) * 1000 if probe else "",
                "" if node_sys is None else node_sys,
            )
        )
    return rows


def run_phase(label: str, probe: Probe, action: Any) -> dict[str, Any]:
    """Mark the probe, run ``action`` (returns a dict), and sample /proc/stat around it."""
    probe.mark()
    before = cpu_sample()
    started = time.monotonic()
    result = action()
    elapsed = time.monotonic() - started
    after = cpu_sample()
    return dict(result, label=label, elapsed=elapsed, sys=sys_percent(before, after))


def main() -> int:  # noqa: PLR0915 - one linear script of phases
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--containers", type=int, default=8147)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of each idle phase")
    parser.add_argument("--rounds", type=int, default=2, help="runs of every mode, interleaved")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}")
    parser.add_argument("--max-sys-percent", type=float, default=30.0)
    parser.add_argument("--naive", action="store_true", help="also the naive rmdir loop (once)")
    parser.add_argument(
        "--defaults-only",
        action="store_true",
        help="only idle and the fixed sweep with defaults (--modes fixed)",
    )
    parser.add_argument(
        "--extra-sweep",
        action="append",
        default=[],
        metavar="ARGS",
        help='another sweep mode with these options, e.g. "--pacing fixed --batch 10"',
    )
    parser.add_argument(
        "--per-second",
        choices=["first", "all", "none"],
        default="first",
        help="per-second tables for the first round of each mode, every run, or none",
    )
    parser.add_argument(
        "--plot",
        default=None,
        metavar="PNG",
        help="draw the probe's latency percentiles per phase against idle (bench.plots, matplotlib)",
    )
    parser.add_argument(
        "--probe-hierarchy",
        default="memory",
        help="where the probe makes its cgroup (memory: the costliest css; cpuset: what a container "
        "start's cpuset mkdir waits for)",
    )
    args = parser.parse_args()
    ctl = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")
    have_sweep = os.path.exists(ctl) and run_measured([ctl, "sweep", "--help"]).status == 0
    modes = {
        name: MODES[name] for name in (["fixed"] if args.defaults_only else args.modes.split(",")) if name
    }
    for extra in args.extra_sweep:
        modes[extra] = (f"sweep {extra}", extra.split())
    mounts = cgroup_mounts()
    top = f"{PREFIX}-sweep-{uuid.uuid4().hex[:8]}"
    fallback = mounts[0] if args.probe_hierarchy == "memory" else None  # as before, e.g. pure cgroup2
    probe_mount = next((m for m in mounts if m.endswith("/" + args.probe_hierarchy)), fallback)
    if probe_mount is None:
        parser.error(f"no {args.probe_hierarchy} hierarchy mounted (have: {', '.join(mounts)})")
    probe_parent = os.path.join(probe_mount, f"{PREFIX}-probe-{uuid.uuid4().hex[:8]}")
    phases: list[dict[str, Any]] = []
    labels: list[str] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}-") as workdir, CpuSampler() as sampler:
        env = guard_env(workdir)
        empty = os.path.join(workdir, "empty")
        os.mkdir(empty)
        os.mkdir(probe_parent)
        try:
            with Probe(probe_parent) as probe:

                def idle() -> dict[str, Any]:
                    time.sleep(args.idle)
                    return {"dirs": 0, "cpu": 0.0, "stime": 0.0}

                def build() -> str:
                    """A fresh tree under a new pod: every phase removes its own."""
                    probe.mark()
                    labels.append("(setup)")
                    t = time.monotonic()
                    pod = f"burstable/pod{uuid.uuid4()}"
                    build_pod_tree(top, pod, args.containers, mounts)
                    print(
                        f"  tree of {args.containers} x {len(mounts)} built in {time.monotonic() - t:.1f} s",
                        file=sys.stderr,
                    )
                    time.sleep(1)  # let the kernel settle before the phase
                    return pod

                def naive(pod: str) -> dict[str, Any]:
                    pods = [os.path.join(m, top, pod) for m in mounts]
                    run = run_measured([sys.executable, "-c", NAIVE, *pods])
                    return {
                        "dirs": args.containers * len(mounts),
                        "cpu": run.cpu,
                        "stime": run.stime,
                        "status": run.status,
                    }

                def sweep(extra: list[str]) -> dict[str, Any]:
                    report = os.path.join(workdir, "report.json")
                    t_start = time.monotonic()
                    run = run_measured(
                        [
                            ctl,
                            "sweep",
                            "--kubepods",
                            top,
                            "--min-age",
                            "0",
                            "--runtime-root",
                            empty,
                            "--bundle-root",
                            empty,
                            "--max-sys-percent",
                            str(args.max_sys_percent),
                            "--format",
                            "json",
                            *extra,
                        ],
                        env,
                        stdout_path=report,
                    )
                    with open(report) as f:
                        doc = json.load(f) if run.status == 0 else {}
                    docs = doc.get("batches", [])
                    return {
                        "dirs": doc.get("dirs_removed", 0),
                        "cpu": run.cpu,
                        "stime": run.stime,
                        "status": run.status,
                        "batches": len(docs),
                        "slowed": doc.get("slowed", 0.0),
                        "batch_docs": docs,
                        "baseline": doc.get("baseline", {}),
                        "timeline": (
                            t_start,
                            time.monotonic(),
                            doc.get("duration", 0.0),
                            [(b["started"], b["finished"]) for b in docs],
                        ),
                    }

                def timed(label: str, action: Any, **extra: Any) -> None:
                    labels.append(label)
                    phases.append(dict(run_phase(label, probe, action), **extra))
                    print(f"  {label}: {phases[-1]['elapsed']:.1f} s", file=sys.stderr)

                if args.naive:
                    timed("idle", idle)
                    pod = build()
                    timed("naive rmdir loop", lambda: naive(pod), mode="naive", round=0)
                if have_sweep:
                    names = list(modes)
                    for rnd in range(args.rounds):
                        order = names[rnd % len(names) :] + names[: rnd % len(names)]
                        for name in order:
                            label, extra = modes[name]
                            timed("idle", idle)
                            build()
                            timed(label, lambda e=extra: sweep(e), mode=name, round=rnd)
                else:
                    print(
                        "runc-guardctl sweep is not installed: only idle and the naive loop", file=sys.stderr
                    )
                timed("idle", idle)
                timed_samples = probe.timed_phases()
        finally:
            remove_everywhere(top)
            remove_everywhere(os.path.relpath(probe_parent, os.path.dirname(probe_parent)))
    report_tables(args, mounts, labels, phases, timed_samples, sampler)
    if args.plot:
        plot_probe(args.plot, phases, f"Sweep gentleness: {args.containers} leaked containers x "
                   f"{len(mounts)} hierarchies; probe = mkdir+rmdir in {args.probe_hierarchy} every 5 ms")
        print(f"\nwrote {args.plot}")
    print(
        f"\ntarget: {args.containers} x {len(mounts)} dirs in <= 60 s with the probe's p99 <= 2x "
        f"idle p99; whole run {time.monotonic() - started:.0f} s"
    )
    return 0


def plot_probe(path: str, phases: list[dict[str, Any]], title: str) -> None:
    """The probe's latency percentiles per phase (rounds pooled), the pooled idle phases as baseline."""
    from bench import plots

    pooled: dict[str, list[float]] = {}
    for phase in phases:
        label = "idle (pooled)" if phase["label"] == "idle" else phase["label"]
        pooled.setdefault(label, []).extend(lat for _, lat in phase["samples"])
    plots.plot_latency_percentiles(path, pooled, title, baseline="idle")


def report_tables(
    args: argparse.Namespace,
    mounts: list[str],
    labels: list[str],
    phases: list[dict[str, Any]],
    timed_samples: list[list[tuple[float, float]]],
    sampler: CpuSampler,
) -> None:
    """Every table: per phase, medians per mode, per second, and where the samples fall."""
    # probe phase 0 is before the first mark; phase i+1 belongs to labels[i]. The idle
    # phases (one before each measured phase and one at the end) are pooled: the baseline
    # is the machine's own noise over the whole run (it is shared with other sessions).
    timed_labels = [label for label in labels if label != "(setup)"]
    phase_samples: list[list[tuple[float, float]]] = []
    for i, label in enumerate(labels):
        if label != "(setup)":
            phase_samples.append(timed_samples[i + 1] if i + 1 < len(timed_samples) else [])
    assert len(timed_labels) == len(phases)
    for phase, samples in zip(phases, phase_samples, strict=True):
        phase["samples"] = samples
    idle_phases = [p for p in phases if p["label"] == "idle"]
    pooled = [lat for p in idle_phases for _, lat in p["samples"]]
    idle_p99 = phase_stats(pooled)[2]
    ncpu = os.cpu_count() or 1
    rows: list[tuple[object, ...]] = [
        (
            f"idle ({len(idle_phases)} phases pooled)",
            "",
            0,
            sum(p["elapsed"] for p in idle_phases),
            *phase_stats(pooled),
            1.0,
            1.0,
            statistics.mean(p["sys"] for p in idle_phases),
            "",
            0.0,
            0.0,
            "",
            "",
        )
    ]
    summary: dict[str, list[dict[str, float]]] = {}
    for i, phase in enumerate(phases):
        if phase["label"] == "idle":
            continue
        count, p50, p99, worst = phase_stats([lat for _, lat in phase["samples"]])
        before = phase_stats([lat for _, lat in phases[i - 1]["samples"]])[2] if i else float("nan")
        per_sec = (
            [r[-1] for r in per_second(phase, phase["samples"], sampler) if isinstance(r[-1], float)]
            if "timeline" in phase
            else []
        )
        sys_median = statistics.median(per_sec) if per_sec else phase["sys"]
        rows.append(
            (
                phase["label"],
                phase.get("round", 0) + 1,
                phase["dirs"],
                phase["elapsed"],
                count,
                p50,
                p99,
                worst,
                p99 / idle_p99,
                p99 / before,
                phase["sys"],
                sys_median,
                100 * phase["stime"] / (phase["elapsed"] * ncpu),
                phase["cpu"],
                phase.get("batches", ""),
                phase.get("slowed", ""),
            )
        )
        summary.setdefault(phase["label"], []).append(
            {
                "elapsed": phase["elapsed"],
                "p50": p50,
                "p99": p99,
                "ratio": p99 / idle_p99,
                "ratio_before": p99 / before,
                "sys": sys_median,
                "dirs": phase["dirs"],
            }
        )
    print_table(
        f"Sweep gentleness: {args.containers} leaked containers x {len(mounts)} hierarchies; "
        f"probe = mkdir+rmdir of one cgroup in {args.probe_hierarchy} every 5 ms; every run",
        [
            "phase",
            "round",
            "dirs removed",
            "total s",
            "probe samples",
            "probe p50 ms",
            "probe p99 ms",
            "probe max ms",
            "p99 / pooled idle p99",
            "p99 / idle p99 before",
            "node sys % (phase)",
            "node sys % (median of seconds)",
            "remover's own sys %",
            "remover CPU s",
            "batches",
            "slowed s",
        ],
        rows,
    )
    med = statistics.median
    print_table(
        f"Medians over rounds (pooled idle: p50 {phase_stats(pooled)[1]:.2f} ms, p99 {idle_p99:.2f} ms)",
        [
            "phase",
            "runs",
            "dirs removed",
            "duration s",
            "probe p50 ms",
            "probe p99 ms",
            "p99 / pooled idle",
            "p99 / idle before",
            "node sys % median",
        ],
        [
            (
                label,
                len(runs),
                med([r["dirs"] for r in runs]),
                med([r["elapsed"] for r in runs]),
                med([r["p50"] for r in runs]),
                med([r["p99"] for r in runs]),
                med([r["ratio"] for r in runs]),
                med([r["ratio_before"] for r in runs]),
                med([r["sys"] for r in runs]),
            )
            for label, runs in summary.items()
        ],
    )
    shown: set[str] = set()
    for phase in phases:
        if "timeline" not in phase or args.per_second == "none":
            continue
        if args.per_second == "first" and phase["label"] in shown:
            continue
        shown.add(phase["label"])
        print_table(
            f"{phase['label']}, round {phase.get('round', 0) + 1}, per second "
            f"(pace baseline: {phase.get('baseline') or 'none'})",
            [
                "t s",
                "batches",
                "batch target (dirs)",
                "dirs removed",
                "pause s",
                "canary ms (worst)",
                "over limit",
                "decisions",
                "probe samples",
                "probe p99 ms",
                "probe max ms",
                "node sys %",
            ],
            per_second(phase, phase["samples"], sampler),
        )
    segment_rows = []
    for phase in phases:
        if "timeline" not in phase:
            continue
        for segment, seconds, seg_samples in split_sweep(phase["timeline"], phase["samples"]):
            count, p50, p99, worst = phase_stats(seg_samples)
            over = sum(x * 1000 > 2 * idle_p99 for x in seg_samples)
            segment_rows.append(
                (
                    phase["label"],
                    phase.get("round", 0) + 1,
                    segment,
                    seconds,
                    count,
                    p50,
                    p99,
                    worst,
                    f"{100 * over / max(1, count):.1f} %",
                )
            )
    if segment_rows:
        print_table(
            "Where the sweep's probe samples fall (from the sweep's JSON report: batch start/end)",
            [
                "phase",
                "round",
                "segment",
                "seconds",
                "probe samples",
                "p50 ms",
                "p99 ms",
                "max ms",
                "samples over 2x idle p99",
            ],
            segment_rows,
        )


if __name__ == "__main__":
    sys.exit(main())
