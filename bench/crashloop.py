"""Fast crash loops through the CRI: pods whose container crashes and is restarted every second.

KEP-5593 (beta in Kubernetes 1.35) lets kubelet restart a crashing container after
1 s instead of backing off to 5 minutes: one OOM-looping pod is then a delete per
second, for hours. This bench plays kubelet against the CRI lab (``labkit.cri``: a
private containerd, our CRI client, a ``stock`` and a ``runc-guard`` handler over the
same runc), both handlers at once, same seed, so both see the same noise:

- per handler, ``--pods`` host-PID pods; in each, a container whose init has 3
  children (``labkit.containerd.sleepers_command``);
- a crash: 2 children moved to a frozen freezer hold of their own, init and the
  third child SIGKILLed (the shim stays: containerd's exit handling deletes the
  task), the hold thawed and its processes killed after a delay drawn from
  0.3-3 s (one seeded sequence per pod index, the same for both handlers);
- kubelet's loop at the back-off floor: wait until CRI reports the container
  EXITED, sleep 1 s, ``create`` + ``start`` the next attempt, then
  ``rm`` the previous one; for ``--minutes``.

Every ``--sample`` seconds: per handler the container cgroup directories, runtime
states and runc-guard pending records left by removed attempts; runc-guard's own
background processes (reporter, finisher: count and resident memory) and the
sizes of its pending and spool directories. Reported at the end (the last
attempt removed) and ``--settle`` s later: what is left, restarts done, how long
CRI reported a crashed container RUNNING, and runc-guard's CPU per delete (its
own, from its stats lines). ``--plot PATH`` draws the samples (bench.plots,
matplotlib: ``pip install '.[bench]'``); ``--json PATH`` keeps them.

Run as root: ``python -m bench.crashloop [--pods 10] [--minutes 10] [--containerd 2.1]``
(1.7.24 and 2.1.9 come with sid's runc 1.3.6 from Debian's archive, ``labkit.runtimes``;
``--containerd 1.6`` is Debian 12's 1.6.20 + runc 1.1.5).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bench.common import print_table
from labkit import containerd as cl
from labkit import cri as cr
from labkit import images
from labkit.kernel import CGROUP_ROOT, FreezerHold, dirs_named, procs, wait_for
from runc_guard.settings import Settings
from runc_guard.spool import pending_files, spool_dir

PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
#: kubelet's restart back-off floor under KEP-5593.
BACKOFF = 1.0
#: Processes per container besides init, and how many of them die late (the freezer hold).
CHILDREN, HELD = 3, 2
#: The crash's teardown: the held children die this long after init (uniform, seconds).
TEARDOWN = (0.3, 3.0)
#: A crashed container CRI still reports RUNNING after this long is given up on (noted as stuck).
EXIT_TIMEOUT = 60.0
#: What runc-guard runs in the background, by a word of its command line (runc_guard.delete.report).
HELPERS = {"reporter": b"reporter_main", "finisher": b"finisher_main"}
HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass
class PodLoop:
    """One pod's crash loop: its attempts (container ids, oldest first) and what was seen."""

    handler: str
    pod: cr.Pod
    delays: list[float]
    attempts: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    exit_s: list[float] = field(default_factory=list)  # init killed -> CRI reports EXITED
    #: CRI reported EXITED this long after the container's last process died (the hold's
    #: delay; negative: before, while held processes still pinned its cgroups).
    after_last_s: list[float] = field(default_factory=list)
    stuck: int = 0  # crashed containers CRI never reported EXITED within EXIT_TIMEOUT
    errors: list[str] = field(default_factory=list)
    #: What each attempt runs (its init must fork CHILDREN processes: :func:`crash` waits for them).
    command: list[str] = field(default_factory=lambda: cl.sleepers_command(CHILDREN))
    #: CRI mounts of each attempt (e.g. the pod's emptyDir, bench.memcg_crashloop).
    mounts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def restarts(self) -> int:
        return max(0, len(self.attempts) - 1)


class CriStates(threading.Thread):
    """Every container's CRI state from one ``ps -a`` (ListContainers) every ``interval`` s.

    kubelet's PLEG relists the same way; one poller for all pods keeps the
    bench's own CRI calls from becoming the load it measures.
    """

    def __init__(self, lab: cr.CriLab, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.lab, self.interval = lab, interval
        self.states: dict[str, str] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            # A relist that times out or prints no JSON (containerd busy) is skipped, not fatal.
            with contextlib.suppress(ValueError):
                proc = self.lab.cri("ps", "-a", "-o", "json", check=False, timeout=60)
                listed = json.loads(proc.stdout).get("containers", [])
                self.states = {c["id"]: c["state"] for c in listed}
            self.stop.wait(self.interval)

    def wait_exited(self, cid: str, timeout: float) -> bool:
        return wait_for(lambda: self.states.get(cid) == "CONTAINER_EXITED", timeout, 0.05)


def runc_state_dir(lab: cr.CriLab) -> str:
    """The shim's runc root for the CRI namespace, host view (inside the lab's private /run)."""
    return os.path.dirname(lab.containerd.runc_state(cr.K8S_NS, "x"))


def init_pid(lab: cr.CriLab, cid: str) -> int:
    """The container's init from runc's state.json: no CRI call per crash."""
    with open(os.path.join(lab.containerd.runc_state(cr.K8S_NS, cid), "state.json")) as f:
        return int(json.load(f)["init_process_pid"])


def container_procs(pod: cr.Pod, cid: str) -> list[int]:
    return procs(f"{CGROUP_ROOT}/memory{pod.cgroup_parent}/{cid}")


def create_attempt(lab: cr.CriLab, loop: PodLoop, attempt: int) -> tuple[str, str | None]:
    """``create`` + ``start`` of attempt ``attempt`` (same name, as kubelet restarts).

    Returns the container's id and why its start failed (None: it runs). Raises
    RuntimeError when even the create failed.
    """
    config = lab.write_json(
        f"{loop.pod.name}-{attempt}.json",
        {
            "metadata": {"name": "crash", "attempt": attempt},
            "image": {"image": images.BUSYBOX_IMAGE},
            "command": loop.command,
            "mounts": loop.mounts,
            "log_path": f"crash-{attempt}.log",
            "linux": {
                "security_context": {"namespace_options": {"network": cr.NODE, "pid": loop.pod.pid_mode}}
            },
        },
    )
    cid = lab.cri("create", loop.pod.id, config, loop.pod.config_path).stdout.strip()
    loop.attempts.append(cid)
    start = lab.cri("start", cid, check=False)
    return cid, None if start.returncode == 0 else f"start failed: {start.stderr.strip()[-300:]}"


def crash(lab: cr.CriLab, loop: PodLoop, cid: str, delay: float, holds: list[FreezerHold]) -> float:
    """Hold 2 children, SIGKILL init and the rest; the held ones die ``delay`` s later.

    Returns when init was killed (monotonic). The hold's thaw-and-kill runs on a timer,
    so the last processes die on time whatever the runtime under test is doing.
    """
    if not wait_for(lambda: len(container_procs(loop.pod, cid)) >= CHILDREN + 1, 15, 0.02):
        raise RuntimeError(f"{cid[:12]} did not start {CHILDREN} children")
    init = init_pid(lab, cid)
    pids = container_procs(loop.pod, cid)
    hold = FreezerHold.create()
    holds.append(hold)
    hold.hold([p for p in pids if p != init][:HELD])
    killed = time.monotonic()
    for pid in [init, *(p for p in pids if p != init and p not in hold.pids)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    timer = threading.Timer(delay, hold.destroy)
    timer.daemon = True
    timer.start()
    return killed


def run_loop(lab: cr.CriLab, loop: PodLoop, states: CriStates, until: float,
             holds: list[FreezerHold]) -> None:
    """kubelet at the back-off floor: next attempt, rm the previous, crash, wait for EXITED, 1 s.

    An attempt that fails to start counts as a crash (noted in ``errors``): kubelet, too,
    tries again after its back-off.
    """
    attempt = 0
    cid: str | None = None
    while True:
        previous = cid
        try:
            cid, failed = create_attempt(lab, loop, attempt)
        except RuntimeError as exc:
            cid, failed = None, str(exc)
        if previous is not None:
            remove(lab, loop, previous)
        if failed is not None:
            loop.errors.append(f"attempt {attempt}: {failed}")
        elif cid is not None:
            delay = loop.delays[attempt % len(loop.delays)]
            try:
                killed = crash(lab, loop, cid, delay, holds)
            except (RuntimeError, OSError, ValueError, KeyError) as exc:
                loop.errors.append(f"attempt {attempt}: {exc!r}")
                killed = time.monotonic()
            if states.wait_exited(cid, EXIT_TIMEOUT):
                loop.exit_s.append(time.monotonic() - killed)
                loop.after_last_s.append(loop.exit_s[-1] - delay)
            else:
                loop.stuck += 1
        if time.monotonic() >= until:
            break
        time.sleep(BACKOFF)
        attempt += 1
    if cid is not None:
        remove(lab, loop, cid)


def remove(lab: cr.CriLab, loop: PodLoop, cid: str) -> None:
    """kubelet's garbage collection of a dead attempt: ``rm`` (``-f`` if it still runs)."""
    proc = lab.cri("rm", "-f", cid, check=False, timeout=60)
    if proc.returncode == 0:
        loop.removed.append(cid)
    else:
        loop.errors.append(f"rm {cid[:12]}: {proc.stderr.strip()[-200:]}")


@dataclass
class Left:
    """What removed attempts left, for one handler, at one moment."""

    dirs: int = 0
    containers: int = 0
    states: int = 0
    records: int = 0


def leftovers(lab: cr.CriLab, loops: list[PodLoop], states_now: set[str], records: list[str]) -> Left:
    """Cgroup dirs, runtime states and pending records of the attempts already removed."""
    left = Left()
    removed = {cid for loop in loops for cid in loop.removed}
    by_id = {r.split("@")[0] for r in records}
    for loop in loops:
        for cid in loop.removed:
            dirs = dirs_named(f"{loop.pod.cgroup_parent}/{cid}")
            left.dirs += len(dirs)
            left.containers += bool(dirs)
    left.states = len(removed & states_now)
    left.records = len(removed & by_id)
    return left


def helper_processes(cache_dir: str) -> dict[str, tuple[int, int]]:
    """This lab's runc-guard background processes alive now: kind -> (count, resident KiB summed).

    Told apart from other labs' (and other sessions') by the cache directory in their
    environment: a helper inherits the delete's, which is containerd's.
    """
    mine = f"RUNC_GUARD_CACHE_DIR={cache_dir}\0".encode()
    found = {kind: (0, 0) for kind in HELPERS}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
            kind = next((k for k, word in HELPERS.items() if word in cmdline), None)
            if kind is None:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if mine not in f.read():
                    continue
            with open(f"/proc/{name}/statm") as f:
                resident = int(f.read().split()[1]) * PAGE_KB
        except (OSError, IndexError, ValueError):
            continue
        count, kb = found[kind]
        found[kind] = (count + 1, kb + resident)
    return found


def dir_size(path: str, names: list[str] | None = None) -> tuple[int, int]:
    """(files, bytes) of a directory's entries (or of ``names`` in it); (0, 0) when absent."""
    files = total = 0
    try:
        listed = names if names is not None else os.listdir(path)
    except OSError:
        return 0, 0
    for name in listed:
        with contextlib.suppress(OSError):
            total += os.stat(os.path.join(path, name)).st_size
            files += 1
    return files, total


#: A bench's own figures, read with every sample: the loops per handler -> more keys of the row.
Probe = Callable[[dict[str, list[PodLoop]]], dict[str, Any]]


class Sampler(threading.Thread):
    """Every ``interval`` s: leftovers per handler, runc-guard's helpers, pending and spool sizes."""

    def __init__(self, lab: cr.CriLab, loops: dict[str, list[PodLoop]], interval: float,
                 probe: Probe | None = None) -> None:
        super().__init__(daemon=True)
        self.lab, self.loops, self.interval, self.probe = lab, loops, interval, probe
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.start_time = time.monotonic()

    def sample(self) -> dict[str, Any]:
        try:
            states_now = set(os.listdir(runc_state_dir(self.lab)))
        except OSError:
            states_now = set()
        pending = self.lab.settings["RUNC_GUARD_PENDING_DIR"]
        records = cl.pending_records(self.lab.settings)
        spool = spool_dir(self.lab.settings["RUNC_GUARD_CACHE_DIR"])
        row: dict[str, Any] = {"t": round(time.monotonic() - self.start_time, 2)}
        for handler, loops in self.loops.items():
            row[handler] = vars(leftovers(self.lab, loops, states_now, records))
            row[handler]["restarts"] = sum(loop.restarts for loop in loops)
        row["helpers"] = helper_processes(self.lab.settings["RUNC_GUARD_CACHE_DIR"])
        row["pending"] = dir_size(pending, records)
        row["spool"] = dir_size(spool, [os.path.basename(p) for p in pending_files(spool)])
        if self.probe is not None:
            row.update(self.probe(self.loops))
        return row

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append(self.sample())
            self.stop.wait(self.interval)

    def finish(self) -> dict[str, Any]:
        """Stop sampling; one last sample, returned."""
        self.stop.set()
        self.join(self.interval + 30)
        last = self.sample()
        self.samples.append(last)
        return last


@dataclass
class Result:
    """A whole run: the loops per handler, the samples, and the two counts of what was left."""

    loops: dict[str, list[PodLoop]]
    samples: list[dict[str, Any]]
    at_end: dict[str, Any]
    settled: dict[str, Any]
    stats: list[dict[str, object]]
    seconds: float
    #: containerd's errors handling an attempt's exit (its task delete failed: CRI re-queues
    #: the exit event, 1 s doubling), per handler.
    requeued: dict[str, int] = field(default_factory=dict)


def exit_errors(log: str, loops: dict[str, list[PodLoop]]) -> dict[str, int]:
    """Per handler, containerd's error lines about an attempt's TaskExit (a failed task delete)."""
    owner = {cid: h for h, pod_loops in loops.items() for loop in pod_loops for cid in loop.attempts}
    counts = dict.fromkeys(loops, 0)
    for line in log.splitlines():
        if "level=error" in line and "TaskExit" in line:
            for cid in HEX64.findall(line):
                if cid in owner:
                    counts[owner[cid]] += 1
                    break
    return counts


def seeded_delays(seed: int, pods: int, count: int = 4096) -> list[list[float]]:
    """Per pod index, its sequence of teardown delays: the same for both handlers."""
    rng = random.Random(seed)
    return [[round(rng.uniform(*TEARDOWN), 2) for _ in range(count)] for _ in range(pods)]


#: A pod -> what its attempts run and the CRI mounts they get.
Workload = Callable[[cr.Pod], tuple[list[str], list[dict[str, Any]]]]


def crash_loops(lab: cr.CriLab, pods: int, seconds: float, seed: int, settle: float,
                interval: float = 2.0, handlers: tuple[str, ...] = (cr.STOCK_HANDLER, cr.GUARD_HANDLER),
                pid_mode: int = cr.NODE, progress: bool = False, workload: Workload | None = None,
                probe: Probe | None = None) -> Result:
    """Run ``pods`` crash loops per handler at once for ``seconds``; count what is left twice.

    ``workload``: what each pod's attempts run and mount (default: the sleepers alone);
    ``probe``: more figures for every sample.
    """
    delays = seeded_delays(seed, pods)
    loops = {h: [PodLoop(h, lab.run_pod(h, pid_mode, "rgloop"), delays[i]) for i in range(pods)]
             for h in handlers}
    for loop in (loop for h in handlers for loop in loops[h]) if workload is not None else ():
        loop.command, loop.mounts = workload(loop.pod)
    states = CriStates(lab)
    sampler = Sampler(lab, loops, interval, probe)
    holds: list[FreezerHold] = []
    started = time.monotonic()
    states.start()
    sampler.start()
    try:
        threads = [
            threading.Thread(target=run_loop, args=(lab, loop, states, started + seconds, holds), daemon=True)
            for h in handlers for loop in loops[h]
        ]
        for thread in threads:
            thread.start()
        next_report = started + 30
        while any(t.is_alive() for t in threads):
            time.sleep(0.2)
            if progress and time.monotonic() >= next_report:
                next_report += 30
                done = {h: sum(loop.restarts for loop in loops[h]) for h in handlers}
                print(f"  {time.monotonic() - started:5.0f} s restarts {done}", file=sys.stderr)
        # Each hold's timer thaws and kills it within TEARDOWN[1] s of its crash.
        wait_for(lambda: not any(os.path.isdir(h.path) for h in holds), TEARDOWN[1] + 15, 0.1)
        # The last attempts' processes are dead and their containers removed: what is left now
        # is what the node keeps; then a while with no sweep (runc-guard's finisher may work).
        wait_for(lambda: not any(container_procs(loop.pod, cid) for h in handlers
                                 for loop in loops[h] for cid in loop.attempts[-1:]), 30, 0.1)
        at_end = sampler.sample()
        time.sleep(settle)
        settled = sampler.finish()
    finally:
        sampler.stop.set()
        states.stop.set()
        for hold in holds:  # a timer not yet run (the bench interrupted): thaw and kill now
            hold.destroy()
    guard_ids = {cid for loop in loops.get(cr.GUARD_HANDLER, []) for cid in loop.attempts}
    return Result(loops, sampler.samples, at_end, settled, cl.delete_stats(lab.settings, guard_ids),
                  time.monotonic() - started, exit_errors(lab.containerd.log(), loops))


def _pct(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.2f}"


def helper_summary(samples: list[dict[str, Any]], kind: str) -> str:
    """'max N alive / max X MiB; at the end N / X MiB' for one kind of helper."""
    counts = [s["helpers"][kind][0] for s in samples]
    kbs = [s["helpers"][kind][1] for s in samples]
    end = samples[-1]["helpers"][kind]
    return (f"max {max(counts)} / {max(kbs) / 1024:.1f} MiB; end {end[0]} / {end[1] / 1024:.1f} MiB"
            if samples else "-")


def report(result: Result, title: str) -> None:
    """The bench's markdown tables."""
    rows = []
    for handler, loops in result.loops.items():
        exit_s = [x for loop in loops for x in loop.exit_s]
        after = [x for loop in loops for x in loop.after_last_s]
        end, settled = result.at_end[handler], result.settled[handler]
        is_guard = handler == cr.GUARD_HANDLER
        cpu = [int(str(s.get("cpu_ms", 0))) for s in result.stats] if is_guard else []
        timed = [s for s in result.stats if "total_ms" in s] if is_guard else []
        wall = [int(str(s["total_ms"])) / 1000 for s in timed]
        runtime = [int(str(s.get("runtime_ms", 0))) / 1000 for s in timed]
        outcomes: dict[str, int] = {}
        for s in result.stats if is_guard else []:
            outcomes[str(s.get("outcome"))] = outcomes.get(str(s.get("outcome")), 0) + 1
        rows.append([
            handler,
            str(sum(loop.restarts for loop in loops)),
            f"{end['dirs']} / {end['containers']} / {end['states']} / {end['records']}",
            f"{settled['dirs']} / {settled['containers']} / {settled['states']} / {settled['records']}",
            f"{_pct(exit_s, 0.5)} / {_pct(exit_s, 0.99)}",
            f"{_pct(after, 0.0)} / {_pct(after, 0.5)} / {_pct(after, 0.99)}",
            str(sum(loop.stuck for loop in loops)),
            f"{statistics.median(cpu):.0f}" if cpu else "-",
            f"{_pct(wall, 0.5)} / {_pct(wall, 0.99)}; {_pct(runtime, 0.5)}" if wall else "-",
            " ".join(f"{k}={v}" for k, v in sorted(outcomes.items())) or "-",
            str(result.requeued.get(handler, 0)),
            str(sum(len(loop.errors) for loop in loops)),
        ])
    print_table(title, [
        "handler", "restarts", "at the end: dirs / containers / states / records",
        "settled: dirs / containers / states / records", "crash -> EXITED s p50 / p99",
        "last process died -> EXITED s min / p50 / p99",
        "stuck", "CPU/delete ms (median, runc-guard's own)",
        "runc-guard's delete, exec to verdict s p50 / p99; its runtime's p50", "runc-guard outcomes",
        "containerd TaskExit errors", "bench errors"], rows)
    samples = result.samples
    pending = [s["pending"] for s in samples]
    spool = [s["spool"] for s in samples]

    def sizes(values: list[tuple[int, int]]) -> str:
        return f"max {max(v[0] for v in values)} / {max(v[1] for v in values) / 1024:.1f}"

    print_table("runc-guard's own background processes and directories, sampled", [
        "what", "over the run", "at the end (settled)"], [
        ["reporter: alive / resident", helper_summary(samples, "reporter"), ""],
        ["finisher: alive / resident", helper_summary(samples, "finisher"), ""],
        ["pending dir: files / KiB", sizes(pending),
         f"{pending[-1][0]} / {pending[-1][1] / 1024:.1f}"],
        ["spool: files / KiB", sizes(spool),
         f"{spool[-1][0]} / {spool[-1][1] / 1024:.1f}"],
    ])
    errors = [e for loops in result.loops.values() for loop in loops for e in loop.errors]
    for line in errors[:10]:
        print(f"error: {line}", file=sys.stderr)


def plot(doc: dict[str, Any], path: str) -> None:
    """Leftovers over time per handler, and runc-guard's helpers and directories (bench.plots).

    ``doc`` is what ``--json`` writes (:func:`dump`), so a run can be drawn again later.
    """
    from bench import plots

    samples, labels = doc["samples"], doc["labels"]
    t = [s["t"] for s in samples]

    def line(get: Any) -> list[tuple[float, float]]:
        return list(zip(t, [get(s) for s in samples], strict=True))

    handlers = list(labels)
    panels: list[tuple[str, dict[str, list[tuple[float, float]]]]] = [
        ("restarts done", {labels[h]: line(lambda s, h=h: s[h]["restarts"]) for h in handlers}),
        ("cgroup dirs left", {labels[h]: line(lambda s, h=h: s[h]["dirs"]) for h in handlers}),
        ("states / records left", {
            f"{labels[h]}: {key}": line(lambda s, h=h, key=key: s[h][key])
            for h in handlers for key in ("states", "records")}),
        ("helpers alive", {kind: line(lambda s, k=kind: s["helpers"][k][0]) for kind in HELPERS}),
        ("helpers RSS MiB", {kind: line(lambda s, k=kind: s["helpers"][k][1] / 1024) for kind in HELPERS}),
        ("files", {"pending records": line(lambda s: s["pending"][0]),
                   "spool files": line(lambda s: s["spool"][0])}),
    ]
    plots.plot_panels(path, panels, doc["title"], xlabel="seconds since the loops started",
                      marks={"loops stop": doc["loop_seconds"]})


def dump(result: Result, title: str, labels: dict[str, str], loop_seconds: float) -> dict[str, Any]:
    """A run as plain data: the ``--json`` file, and what :func:`plot` draws."""
    return {
        "title": title, "labels": labels, "loop_seconds": loop_seconds, "samples": result.samples,
        "at_end": result.at_end, "settled": result.settled, "seconds": result.seconds,
        "requeued": result.requeued,
        "restarts": {h: sum(loop.restarts for loop in loops) for h, loops in result.loops.items()},
        "exit_s": {h: [x for loop in loops for x in loop.exit_s] for h, loops in result.loops.items()},
        "after_last_s": {h: [x for loop in loops for x in loop.after_last_s]
                         for h, loops in result.loops.items()},
    }


def node_overrides(finish_window: str | None = None) -> dict[str, str]:
    """runc-guard's settings as a node runs them, not as the labs' tests do.

    The node's reporter linger (the labs use 0 so that tests see each entry at once) and
    the shipped finish window (the labs turn the finisher off), or ``finish_window``.
    """
    return {"RUNC_GUARD_REPORTER_LINGER": str(Settings().reporter_linger),
            "RUNC_GUARD_FINISH_WINDOW": finish_window or str(Settings().finish_window)}


@contextlib.contextmanager
def lab_in(workdir: str, containerd: str, runc: str | None, **overrides: str) -> Iterator[cr.CriLab]:
    """A CRI lab for containerd ``containerd`` (runc ``runc``, default its own) in ``workdir``."""
    build = cl.find_build(containerd)
    if build is None:
        raise SystemExit(f"containerd {containerd}: not fetched from Debian's archive (labkit.runtimes)")
    if runc is not None:
        path = cl.runc_binary(runc)
        if path is None:
            raise SystemExit(f"runc {runc}: not fetched from Debian's archive (labkit.runtimes)")
        build = cl.Build(build.name, build.containerd, build.ctr, build.config_version, build.bin_dir, path)
    stubs = cr.find_stubs()
    why = cr.missing_prerequisites(build)
    if why:
        raise SystemExit(why)
    with cr.cri_lab(workdir, build, stubs, **overrides) as lab:
        yield lab


#: What ``--containerd`` and ``--runc`` take (labkit.containerd's builds and runc series).
CONTAINERDS = (cl.CONTAINERD_16, cl.CONTAINERD_17, cl.CONTAINERD_21)
RUNCS = (cl.RUNC_1_1, cl.RUNC_1_3)


def runc_version(runc: str) -> str:
    """``runc --version``'s version (``1.3.6``), for the report's labels; ``?`` when it does not say."""
    out = subprocess.run([runc, "--version"], capture_output=True, text=True, check=False, timeout=30).stdout
    found = re.search(r"runc version (\S+)", out)
    return found.group(1) if found else "?"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=10, help="crash-looping pods per handler")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--containerd", choices=CONTAINERDS, default=cl.CONTAINERD_21)
    parser.add_argument("--runc", choices=RUNCS, default=None,
                        help="default: the containerd build's own (1.6: 1.1.5, 1.7 and 2.1: 1.3.6)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--settle", type=float, default=60.0, help="seconds to wait, then count again")
    parser.add_argument("--sample", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--finish-window", default=None, metavar="SECONDS",
                        help="runc-guard's finish_window (default: as shipped)")
    parser.add_argument("--pid-mode", choices=list(cr.PID_MODES), default="node")
    parser.add_argument("--plot", default=None, metavar="PNG")
    parser.add_argument("--json", default=None, metavar="PATH", help="the samples and totals")
    parser.add_argument("--workdir", default=None, help="the lab's directory, kept afterwards (default: a "
                        "temporary one, removed)")
    parser.add_argument("--replot", default=None, metavar="JSON",
                        help="only draw --plot from an earlier run's --json file")
    args = parser.parse_args()
    if args.replot:
        with open(args.replot) as f:
            plot(json.load(f), args.plot or parser.error("--replot needs --plot"))
        return 0
    # SIGTERM unwinds like Ctrl-C, so the lab (containerd, shims, pods, holds) is always stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    overrides = node_overrides(args.finish_window)
    workdir = args.workdir or tempfile.mkdtemp(prefix="rgloop-")
    try:
        with lab_in(workdir, args.containerd, args.runc, **overrides) as lab:
            runc = runc_version(lab.runc)
            result = crash_loops(lab, args.pods, args.minutes * 60, seed, args.settle, args.sample,
                                 pid_mode=cr.PID_MODES[args.pid_mode], progress=True)
            title = (f"Crash loop: {args.pods} pods per handler, {args.minutes:g} min, containerd "
                     f"{args.containerd} + runc {runc}, teardowns {TEARDOWN[0]}-{TEARDOWN[1]} s, "
                     f"finish_window {args.finish_window or 'default'} (seed {seed})")
            report(result, title)
            labels = {cr.STOCK_HANDLER: f"stock runc {runc}", cr.GUARD_HANDLER: "runc-guard"}
            doc = dump(result, title, labels, args.minutes * 60)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(doc, f)
            if args.plot:
                plot(doc, args.plot)
                print(f"\nwrote {args.plot}")
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
