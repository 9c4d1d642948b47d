"""A crash storm on a chosen containerd + runc: N Path B crashes at once, teardowns 0.3-3 s.

Per runtime (the stock runc, then runc-guard fronting the same runc, in one run on
one private containerd): start N host-PID busybox tasks, freeze two of each
task's three children in a freezer hold of its own, SIGKILL every init and every
shim within a moment (a node's worth of OOMed pods), and thaw each hold after its
own delay drawn from 0.3-3 s. containerd's dead-shim cleanup then runs N
``delete --force`` at once. Reported: cgroup directories and runtime state left
(and pending records), runc-guard's wait (p50/p99 from its stats lines), its CPU
per delete (its own, from the canonical entry; the runtime's separately), and
the peak memory of all runc-guard processes alive at once (sampled every 20 ms,
resident set, shared file pages counted once). What the deadline leaves is then
given to ``runc-guardctl sweep`` and counted again.

Run as root: ``python -m bench.storm [--containers 200] [--containerd 2.1] [--runc 1.3]``
(containerd 1.7 / 2.1 and runc 1.3 come from Debian's archive, labkit.runtimes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from bench.common import print_table
from labkit import containerd as cl
from labkit.kernel import FreezerHold, wait_for
from runc_guard.settings import Settings

PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


#: How often the memory sampler scans /proc. Every 20 ms, its scans of ~1000 processes
#: took a share of the CPU the storm's deletes needed inside containerd's 5 s budget.
MEMORY_SAMPLE_INTERVAL = 0.25


class MemorySampler(threading.Thread):
    """Peak resident memory of all live processes running ``needle`` (shared pages once)."""

    def __init__(self, needle: str, interval: float = MEMORY_SAMPLE_INTERVAL) -> None:
        super().__init__(daemon=True)
        self.needle = needle.encode()
        self.peak_kb = 0
        self.peak_count = 0
        self.interval = interval
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            private = shared = count = 0
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                try:
                    with open(f"/proc/{name}/cmdline", "rb") as f:
                        if self.needle not in f.read():
                            continue
                    with open(f"/proc/{name}/statm") as f:
                        fields = f.read().split()
                except OSError:
                    continue
                resident, file_shared = int(fields[1]) * PAGE_KB, int(fields[2]) * PAGE_KB
                private += resident - file_shared
                shared = max(shared, file_shared)
                count += 1
            if private + shared > self.peak_kb:
                self.peak_kb, self.peak_count = private + shared, count
            self.stop.wait(self.interval)


class LeftoverSampler(threading.Thread):
    """Every second from the kills on: cgroup dirs and runtime states the storm's tasks have left."""

    def __init__(self, lab: cl.GuardedLab, ns: str, tasks: list[Any], interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.lab, self.ns, self.tasks, self.interval = lab, ns, tasks, interval
        self.started = time.monotonic()
        self.dirs: list[tuple[float, int]] = []
        self.states: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic() - self.started
            self.dirs.append((now, sum(len(t.cgroup_dirs()) for t in self.tasks)))
            self.states.append((now, sum(os.path.exists(self.lab.containerd.runc_state(self.ns, t.id))
                                         for t in self.tasks)))
            self.stop.wait(self.interval)


#: containerd's budget for one dead-shim cleanup (io.containerd.timeout.shim.cleanup).
CLEANUP_BUDGET = 5.0


def cpu_times() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole node since boot, from /proc/stat.

    Busy counts user, system, irq and softirq time, not ``nice``: what niced work
    (runc-guard's reporter and finisher, anything else at a lower priority) used is
    time the storm could have had.
    """
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq = (int(x) for x in f.readline().split()[1:8])
    tick = os.sysconf("SC_CLK_TCK")
    return (user + system + irq + softirq) / tick, (idle + iowait + nice) / tick


def storm(
    lab: cl.GuardedLab, ns: str, binary: str, delays: list[float], settle: float = 60.0
) -> dict[str, Any]:
    """One storm through ``binary``: what it left when its last process died and ``settle`` s
    later (no sweep), and what it cost."""
    ctd = lab.containerd
    tasks = [cl.run_task(ctd, ns, binary, children=3) for _ in delays]
    holds = [FreezerHold.create() for _ in tasks]
    sampler = MemorySampler(cl.guard_binary())
    try:
        victims = []
        for task, hold in zip(tasks, holds, strict=True):
            hold.hold(task.children()[:2])
            init = task.init_pid()
            victims.append((init, task.shim_pid(init)))
        sampler.start()
        over_time = LeftoverSampler(lab, ns, tasks)
        over_time.start()
        busy_before, idle_before = cpu_times()
        killed = time.monotonic()
        for init, shim in victims:
            os.kill(init, 9)
            os.kill(shim, 9)
        for delay, hold in sorted(zip(delays, holds, strict=True), key=lambda pair: pair[0]):
            time.sleep(max(0.0, killed + delay - time.monotonic()))
            hold.release()
        # How much of the node containerd's 5 s cleanup budget had: the storm's own demand.
        time.sleep(max(0.0, killed + CLEANUP_BUDGET - time.monotonic()))
        busy_after, idle_after = cpu_times()
        window = time.monotonic() - killed  # longer than the budget when thawing the holds ran late
        wait_for(lambda: all(t.gone() for t in tasks), 120, 0.1)
        wait_for(lambda: not any(t.pids() for t in tasks), 30, 0.1)
        elapsed = time.monotonic() - killed
        at_end = leftovers(lab, ns, tasks)
        # What a node has a minute after the storm's last process died, with no sweep run:
        # runc-guard's finisher works in this time; stock leaks stay.
        time.sleep(settle)
    finally:
        sampler.stop.set()
        if "over_time" in locals():
            over_time.stop.set()
        for hold in holds:
            hold.destroy()
    stats = cl.delete_stats(lab.settings, {t.id for t in tasks})
    return {
        "tasks": tasks,
        **leftovers(lab, ns, tasks),
        "at_end": at_end,
        "elapsed": elapsed,
        "budget_cpu": (busy_after - busy_before, idle_after - idle_before, window),
        "stats": stats,
        "peak_kb": sampler.peak_kb,
        "peak_count": sampler.peak_count,
        "dirs_over_time": over_time.dirs,
        "states_over_time": over_time.states,
    }


def leftovers(lab: cl.GuardedLab, ns: str, tasks: list[Any]) -> dict[str, Any]:
    """Cgroup dirs, runtime states, pending records and tasks containerd never finished, now."""
    left = {t.id: t.cgroup_dirs() for t in tasks}
    return {
        "left": left,
        "dirs": sum(len(d) for d in left.values()),
        "containers": sum(1 for d in left.values() if d),
        "states": [t.id for t in tasks if os.path.exists(lab.containerd.runc_state(ns, t.id))],
        "records": [r for r in cl.pending_records(lab.settings) if r.split("@")[0] in left],
        "unfinished": sum(1 for t in tasks if not t.gone()),
    }


def sweep(lab: cl.GuardedLab, ns: str, runc: str, task_id: str) -> dict[str, Any]:
    """``runc-guardctl sweep`` over the lab's roots (what a node's timer would run next)."""
    ctd = lab.containerd
    state_root = os.path.dirname(os.path.dirname(ctd.runc_state(ns, task_id)))
    bundle_root = os.path.dirname(os.path.dirname(ctd.bundle(ns, task_id)))
    ctl = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")
    started = time.monotonic()
    proc = subprocess.run(
        [ctl, "sweep", "--min-age", "0", "--pacing", "fixed", "--pause", "0", "--format", "json",
         "--kubepods", ns,
         "--runtime-root", state_root, "--bundle-root", bundle_root],
        capture_output=True, text=True, check=False, timeout=600,
        env={**os.environ, **lab.settings, "RUNC_GUARD_RUNTIME": runc},
    )
    report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    return {"status": proc.returncode, "seconds": time.monotonic() - started, "report": report}


def _pct(values: list[int], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return str(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--containers", type=int, default=200)
    parser.add_argument("--containerd", choices=[cl.CONTAINERD_16, cl.CONTAINERD_17, cl.CONTAINERD_21],
                        default=cl.CONTAINERD_21)
    parser.add_argument("--runc", choices=[cl.RUNC_1_1, cl.RUNC_1_3], default=cl.RUNC_1_3)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--finish-window", default=None, metavar="SECONDS",
                        help="runc-guard's finish_window (default: as shipped; 0: no finisher)")
    parser.add_argument("--only-guard", action="store_true",
                        help="skip the stock run (quicker experiments; the table then has no control)")
    parser.add_argument("--plot", metavar="PNG", default=None,
                        help="draw what was left over time, stock vs runc-guard (needs the bench extra)")
    parser.add_argument("--settle", type=float, default=60.0,
                        help="seconds after the storm's last process died to count again (no sweep)")
    return parser.parse_args()


def main() -> int:
    args = _parse()
    build = cl.find_build(args.containerd)
    runc = cl.runc_binary(args.runc)
    if build is None or runc is None:
        print(f"containerd {args.containerd} or runc {args.runc} could not be had from Debian's archive")
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    rng = random.Random(seed)
    delays = [round(rng.uniform(0.3, 3.0), 2) for _ in range(args.containers)]
    workdir = tempfile.mkdtemp(prefix="rgstorm-")
    rows = []
    reasons: list[tuple[str, int]] = []
    dirs_series: dict[str, list[tuple[float, int]]] = {}
    states_series: dict[str, list[tuple[float, int]]] = {}
    try:
        # The node's reporter linger (the labs use 0 so that tests see each entry at once):
        # in a storm one reporter then serves every delete, as on a node.
        # So is the finish window (the labs turn the finisher off): the shipped default unless given.
        node = {"RUNC_GUARD_REPORTER_LINGER": str(Settings().reporter_linger),
                "RUNC_GUARD_FINISH_WINDOW": str(Settings().finish_window)}
        if args.finish_window is not None:
            node["RUNC_GUARD_FINISH_WINDOW"] = args.finish_window
        with cl.guarded_containerd(workdir, build=build, runc=runc, **node) as lab, \
                cl.namespace(lab.containerd) as ns:
            runs = [(f"runc {args.runc} (stock)", runc), ("runc-guard", cl.guard_binary())]
            for label, binary in runs[1:] if args.only_guard else runs:
                result = storm(lab, ns, binary, delays, args.settle)
                dirs_series[label] = result["dirs_over_time"]
                states_series[label] = result["states_over_time"]
                # The deletes' own lines: the finisher's finished_late lines are no delete's wait or CPU.
                own = [s for s in result["stats"] if s.get("outcome") != "finished_late"]
                waited = [int(s["waited_ms"]) for s in own]
                cpu = [int(s.get("cpu_ms", 0)) for s in own]
                outcomes: dict[str, int] = {}
                for s in result["stats"]:
                    outcomes[str(s["outcome"])] = outcomes.get(str(s["outcome"]), 0) + 1
                after = {"dirs": "-", "states": "-"}
                if binary != runc and (result["dirs"] or result["states"]):
                    swept = sweep(lab, ns, runc, result["tasks"][0].id)
                    after = {
                        "dirs": str(sum(len(t.cgroup_dirs()) for t in result["tasks"])),
                        "states": str(sum(os.path.exists(lab.containerd.runc_state(ns, t.id))
                                          for t in result["tasks"])),
                    }
                    print(f"sweep after the storm: exit {swept['status']} in {swept['seconds']:.1f} s")
                end = result["at_end"]
                rows.append([
                    label, str(len(delays)),
                    f"{end['dirs']} / {end['containers']} / {len(end['states'])} / {len(end['records'])}",
                    str(result["dirs"]), str(result["containers"]),
                    str(len(result["states"])), str(len(result["records"])), str(result["unfinished"]),
                    f"{after['dirs']} / {after['states']}",
                    _pct(waited, 0.5), _pct(waited, 0.99),
                    f"{statistics.median(cpu):.0f}" if cpu else "-",
                    f"{result['peak_kb'] / 1024:.0f} MiB ({result['peak_count']} procs)" if cpu else "-",
                    " ".join(f"{k}={v}" for k, v in sorted(outcomes.items())) or "-",
                    f"{result['elapsed']:.1f}",
                    "{:.1f} / {:.1f} in {:.1f} s".format(*result["budget_cpu"]),
                    paths_taken(lab.settings, {t.id for t in result["tasks"]}) if binary != runc else "-",
                ])
                if binary != runc:
                    reasons = deadline_reasons(lab.settings, {t.id for t in result["tasks"]})
                    unfinished = [t.id for t in result["tasks"] if not t.gone()]
                    why_unfinished(lab, unfinished)
                cl.remove_namespace(lab.containerd, ns)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_table(
        f"Crash storm: {len(delays)} Path B crashes at once, containerd {args.containerd}, "
        f"runc {args.runc}, teardowns 0.3-3 s (seed {seed})",
        ["runtime", "crashes", "at the end: dirs / containers / states / records",
         f"{args.settle:g} s later, no sweep: dirs left", "containers leaking", "runtime states left",
         "pending records", "tasks never finished",
         "after sweep: dirs / states", "wait p50 ms", "wait p99 ms", "CPU/delete ms (median)",
         "peak memory, all runc-guard", "outcomes", "storm s",
         f"node CPU s from the kills to {CLEANUP_BUDGET:g} s or later: busy / idle or niced",
         "deletes: full path / stepped aside / no entry"],
        rows,
    )
    if args.plot:
        _plot(args, len(delays), seed, dirs_series, states_series)
    print_table("Why runc-guard's deletes ended at the deadline (reason, numbers elided)",
                ["reason", "deletes"], [[r, str(n)] for r, n in reasons])
    return 0


def _plot(
    args: argparse.Namespace, crashes: int, seed: int, dirs: dict[str, Any], states: dict[str, Any]
) -> None:
    """The storm's picture: dirs and states left over time, one line per runtime (bench extra)."""
    from bench.plots import plot_panels

    plot_panels(args.plot, [("cgroup dirs left", dirs), ("runtime states left", states)],
                f"{crashes} crashes at once, containerd {args.containerd} + runc {args.runc} "
                f"(seed {seed}): left after the kills, no sweep", "seconds after the kills")
    print(f"picture: {args.plot}")


def why_unfinished(lab: cl.GuardedLab, ids: list[str]) -> None:
    """For each task containerd never finished: runc-guard's own account and containerd's error."""
    if not ids:
        return
    ours: dict[str, list[str]] = {i: [] for i in ids}
    for entry in cl.guard_events(lab.settings):
        cid = str(entry.get("container_id"))
        if cid in ours:
            detail = entry.get("total_ms") or entry.get("since_record_ms") or entry.get("reason", "")
            ours[cid].append(f"{entry.get('event')}:{entry.get('outcome', '')}:{str(detail)[:70]}")
    rows = []
    for cid in ids:
        lines = [ln for ln in lab.containerd.log_lines_for(cid) if "level=error" in ln or "level=warn" in ln]
        error = lines[0].split("error=", 1)[-1][:150] if lines else "-"
        rows.append([cid[-12:], " ".join(ours[cid]) or "(no entry)", error])
    print_table("Tasks containerd never finished", ["task", "runc-guard", "containerd's error"], rows)


def paths_taken(settings: dict[str, str], ids: set[str]) -> str:
    """How each delete went, by runc-guard's own entries: its full path (a ``delete`` entry of
    the delete itself), stepped aside at start-up (``startup_overloaded``), or no entry at all
    (killed with containerd's shim before it could log or exec the runtime). The finisher's
    later ``delete`` entry (``finished_late``) is not the delete's path: a stepped-aside delete
    it completed counts as stepped aside."""
    full: set[str] = set()
    aside: set[str] = set()
    for entry in cl.guard_events(settings):
        cid = str(entry.get("container_id"))
        if entry.get("event") == "delete" and entry.get("outcome") != "finished_late":
            full.add(cid)
        elif entry.get("event") == "startup_overloaded":
            aside.add(cid)
    full &= ids
    aside = (aside & ids) - full
    return f"{len(full)} / {len(aside)} / {len(ids - full - aside)}"


def deadline_reasons(settings: dict[str, str], ids: set[str]) -> list[tuple[str, int]]:
    """The storm's deadline outcomes grouped by reason, from the canonical entries."""
    counts: dict[str, int] = {}
    for entry in cl.guard_events(settings, "delete"):
        if entry.get("outcome") == "deadline" and entry.get("container_id") in ids:
            reason = str(entry.get("reason", ""))
            words = ["N" if w.strip(",;()").isdigit() else w for w in reason.split()]
            shape = " ".join(w for w in words if entry["container_id"] not in w)
            counts[shape] = counts.get(shape, 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[1])


if __name__ == "__main__":
    sys.exit(main())
