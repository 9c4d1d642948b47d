"""Shared benchmark helpers: interleaved timing of whole commands and a table printer.

These machines are noisy, so every benchmark runs its candidates round-robin in
one process (each round runs every candidate once, in rotating order) and
reports medians and ratios measured side by side, never one absolute time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from labkit.kernel import cgroup_mount_points


def spawn_time(argv: Sequence[str], env: dict[str, str] | None = None) -> float:
    """Wall time of one run of ``argv`` (posix_spawn + waitpid), stdout/stderr to /dev/null."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        actions = [
            (os.POSIX_SPAWN_DUP2, devnull, 1),
            (os.POSIX_SPAWN_DUP2, devnull, 2),
        ]
        start = time.perf_counter()
        pid = os.posix_spawn(argv[0], list(argv), env if env is not None else dict(os.environ),
                             file_actions=actions)
        _, status = os.waitpid(pid, 0)
        elapsed = time.perf_counter() - start
    finally:
        os.close(devnull)
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise RuntimeError(f"{argv} exited with {os.waitstatus_to_exitcode(status)}")
    return elapsed


def balanced_order(names: Sequence[str], per_name: int) -> list[str]:
    """A run order in which every candidate follows every candidate (itself included) equally often.

    A call's time depends on the call before it: a ``runc exec`` leaves up to ~1 ms of
    teardown (its Go threads, the exec'd process) that the next call pays, a long
    Python start leaves the CPUs idle and warm. A plain rotation (a b c, b c a,
    c a b) has ``a`` after ``c`` in two rounds of three and after ``b`` never,
    so one candidate systematically inherits another's tail. This order is a
    de Bruijn cycle of pairs (the Lyndon words of length 1 and 2 in
    lexicographic order), repeated: each ordered pair once per cycle, across
    cycle boundaries too. ``per_name`` is rounded up to a multiple of ``len(names)``.
    """
    k = len(names)
    cycle: list[int] = []
    for first in range(k):
        cycle.append(first)
        for later in range(first + 1, k):
            cycle += (first, later)
    return [names[i] for i in cycle * -(-per_name // k)]


def interleaved(candidates: dict[str, Sequence[str]], rounds: int,
                env: dict[str, str] | None = None,
                envs: dict[str, dict[str, str]] | None = None) -> dict[str, list[float]]:
    """Run every candidate ``rounds`` times in a carryover-balanced order; return all samples.

    ``envs``: a candidate's own environment instead of ``env`` (a build's own cache directory).
    """
    names = list(candidates)
    samples: dict[str, list[float]] = {n: [] for n in names}
    own = envs or {}
    for name in names:  # warm caches (page cache, settings cache, bytecode)
        for _ in range(3):
            spawn_time(candidates[name], own.get(name, env))
    for name in balanced_order(names, rounds):
        samples[name].append(spawn_time(candidates[name], own.get(name, env)))
    return samples


def own_cache(env: dict[str, str], workdir: str, build: str) -> dict[str, str]:
    """``env`` with a cache directory of ``build``'s own.

    Builds measured side by side must not share one: each rewrites the routing cache (the
    settings cache too) in its own format, so with one directory every call of either build
    misses its cache and parses the settings file again (measured: +10 ms per clean delete).
    """
    return {**env, "RUNC_GUARD_CACHE_DIR": os.path.join(workdir, f"cache-{build}")}


def median_ms(values: Sequence[float]) -> float:
    return statistics.median(values) * 1000


def percentile_ms(values: Sequence[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))] * 1000


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A GitHub-markdown table, so it can be pasted into docs/benchmarks.md as printed."""
    out = sys.stdout
    out.write(f"\n### {title}\n\n")
    out.write("| " + " | ".join(headers) + " |\n")
    out.write("|" + "|".join("---" for _ in headers) + "|\n")
    for row in rows:
        out.write("| " + " | ".join(f"{c:.2f}" if isinstance(c, float) else str(c) for c in row) + " |\n")
    out.flush()


# -- additions for the delete, wake-up, concurrency and sweep benchmarks ---------

#: Every cgroup a benchmark creates has a name starting with this, so a crashed
#: run's leftovers are easy to find (and never confused with anyone else's).
PREFIX = "rgbench"


class Measured:
    """One finished run: wall time, exit status and the child's rusage (self + its children)."""

    __slots__ = ("elapsed", "maxrss_kb", "status", "stime", "utime")

    def __init__(self, elapsed: float, status: int, utime: float, stime: float, maxrss_kb: int) -> None:
        self.elapsed = elapsed
        self.status = status
        self.utime = utime
        self.stime = stime
        self.maxrss_kb = maxrss_kb

    @property
    def cpu(self) -> float:
        return self.utime + self.stime


def run_measured(argv: Sequence[str], env: dict[str, str] | None = None,
                 stdout_path: str | None = None) -> Measured:
    """Like spawn_time, but returns the exit status and wait4's rusage and never raises on status.

    stdout goes to ``stdout_path`` when given (e.g. a JSON report), else to /dev/null.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    out = os.open(stdout_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) if stdout_path else devnull
    try:
        actions = [(os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)]
        start = time.perf_counter()
        pid = os.posix_spawn(argv[0], list(argv), env if env is not None else dict(os.environ),
                             file_actions=actions)
        _, status, usage = os.wait4(pid, 0)
        elapsed = time.perf_counter() - start
    finally:
        os.close(devnull)
        if out != devnull:
            os.close(out)
    return Measured(elapsed, os.waitstatus_to_exitcode(status), usage.ru_utime, usage.ru_stime,
                    usage.ru_maxrss)


def run_like_go_runc(argv: Sequence[str], env: dict[str, str] | None = None) -> Measured:
    """Like run_measured, with stdout/stderr on pipes read to EOF, as go-runc runs a runtime.

    Go's cmd.Wait returns only when the process exited *and* its output pipes
    closed, so a child that kept them open (a reporter) would delay containerd:
    the elapsed time covers both.
    """
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        actions = [(os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)]
        start = time.perf_counter()
        pid = os.posix_spawn(argv[0], list(argv), env if env is not None else dict(os.environ),
                             file_actions=actions)
        os.close(out_w)
        os.close(err_w)
        out_w = err_w = -1
        for fd in (out_r, err_r):
            while os.read(fd, 65536):
                pass
        _, status, usage = os.wait4(pid, 0)
        elapsed = time.perf_counter() - start
    finally:
        for fd in (out_r, err_r, out_w, err_w):
            if fd >= 0:
                os.close(fd)
    return Measured(elapsed, os.waitstatus_to_exitcode(status), usage.ru_utime, usage.ru_stime,
                    usage.ru_maxrss)


def subreaper(on: bool) -> None:
    """While on, orphans of our children (runc-guard's detached reporters) become ours, so that
    their CPU can be counted (reap_orphans) like the delete's own: prctl(PR_SET_CHILD_SUBREAPER).
    Off while containers start: their inits must not become ours."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(36, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap_orphans() -> tuple[int, float]:
    """Wait for every remaining child (reporters that outlived their delete): (count, CPU seconds)."""
    count, cpu = 0, 0.0
    while True:
        try:
            _, _, usage = os.wait4(-1, 0)
        except ChildProcessError:
            return count, cpu
        count += 1
        cpu += usage.ru_utime + usage.ru_stime


def sys_percent(before: tuple[float, float], after: tuple[float, float]) -> float:
    """Node-wide system CPU % (of all cores) between two readings of the sweep's own
    ``cpu_sample`` (runc_guard.node.sweep), so the bench sees what the sweep sees."""
    total = after[1] - before[1]
    return 100.0 * (after[0] - before[0]) / total if total > 0 else 0.0


def cgroup_mounts() -> list[str]:
    """Every cgroup hierarchy mounted in this mount namespace (v1 and v2), sorted."""
    return cgroup_mount_points()


def remove_subtree(path: str) -> int:
    """rmdir a cgroup subtree leaf-first, tolerating what is gone; returns directories removed."""
    removed = 0
    stack = [(path, False)]
    while stack:
        current, expanded = stack.pop()
        if expanded:
            try:
                os.rmdir(current)
                removed += 1
            except FileNotFoundError:
                pass
            continue
        stack.append((current, True))
        try:
            with os.scandir(current) as it:
                stack.extend((e.path, False) for e in it if e.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            pass
    return removed


def remove_everywhere(relative: str) -> int:
    """remove_subtree(<mount>/<relative>) in every hierarchy."""
    return sum(remove_subtree(os.path.join(m, relative.strip("/"))) for m in cgroup_mounts())


def make_cpuset_usable(path: str) -> None:
    """A v1 cpuset cgroup needs cpus and mems before a task may join it: copy the parent's."""
    if not os.path.exists(os.path.join(path, "cpuset.cpus")):
        return
    parent = os.path.dirname(path)
    for name in ("cpuset.cpus", "cpuset.mems"):
        with open(os.path.join(parent, name)) as f:
            value = f.read().strip()
        with open(os.path.join(path, name), "w") as f:
            f.write(value)


class Probe:
    """A separate process that creates and removes one cgroup in a loop, timing each pair.

    This is what every other pod's runtime does on a busy node (a container start
    creates cgroups): its latency shows how much a sweep or a kubelet-style walk
    holds everybody else up (cgroup v1's global ``cgroup_mutex``). It runs as its
    own interpreter so the measured work and the probe do not share a GIL.
    """

    def __init__(self, parent: str, interval: float = 0.005) -> None:
        self.parent = parent
        self.interval = interval
        self.proc: subprocess.Popen[bytes] | None = None
        self.out = ""

    def __enter__(self) -> Probe:
        fd, self.out = tempfile.mkstemp(prefix=f"{PREFIX}-probe-", suffix=".txt")
        os.close(fd)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PROBE_SOURCE, self.parent, str(self.interval), self.out],
            stdin=subprocess.PIPE,
        )
        return self

    def mark(self) -> None:
        """Start a new phase: the probe's samples are split at each mark."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(b"m\n")
        self.proc.stdin.flush()

    def phases(self) -> list[list[float]]:
        """Stop the probe; its samples (seconds) per phase, in the order of the marks."""
        return [[latency for _at, latency in phase] for phase in self.timed_phases()]

    def timed_phases(self) -> list[list[tuple[float, float]]]:
        """Stop the probe; (monotonic start, latency) of every sample, per phase."""
        assert self.proc is not None and self.proc.stdin is not None
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(30)
        phases: list[list[tuple[float, float]]] = [[]]
        with open(self.out) as f:
            for line in f:
                if line.startswith("m"):
                    phases.append([])
                elif line.strip():
                    at, latency = line.split()
                    phases[-1].append((float(at), float(latency)))
        return phases

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.out)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(self.parent, "probe"))


# The probe loop: mkdir + rmdir of <parent>/probe every `interval`; a line "m" on
# stdin starts a new phase; EOF stops it. Samples go to a file (not a pipe, so a
# slow reader cannot stall the probe).
_PROBE_SOURCE = """
import os, select, sys, time
parent, interval, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
path = os.path.join(parent, "probe")
lines = []
poller = select.poll()
poller.register(0, select.POLLIN)
buf = b""
try:
    while True:
        at = time.monotonic()
        t = time.perf_counter()
        os.mkdir(path)
        os.rmdir(path)
        lines.append(f"{at!r} {time.perf_counter() - t!r}")
        if poller.poll(interval * 1000):
            data = os.read(0, 64)
            if not data:
                break
            lines.extend("m" for _ in range(data.count(b"m")))
finally:
    with open(out, "w") as f:
        f.write("\\n".join(lines) + "\\n")
"""


def build_pod_tree(top: str, pod: str, children: int, mounts: Sequence[str]) -> list[str]:
    """``<mount>/<top>/<pod>/<child>`` for ``children`` 64-hex container ids in every hierarchy.

    The incident's shape (docs/background.md, the failure): thousands of empty leftover container
    cgroups under one pod, in every hierarchy. Returns the pod directories.
    """
    import uuid

    ids = [uuid.uuid4().hex + uuid.uuid4().hex for _ in range(children)]
    pods = []
    for mount in mounts:
        path = os.path.join(mount, top, pod)
        os.makedirs(path, exist_ok=True)
        pods.append(path)
        for cid in ids:
            os.mkdir(os.path.join(path, cid))
    return pods


def phase_stats(samples: Sequence[float]) -> tuple[int, float, float, float]:
    """(count, p50 ms, p99 ms, max ms) of probe samples in seconds."""
    if not samples:
        return 0, float("nan"), float("nan"), float("nan")
    return len(samples), percentile_ms(samples, 50), percentile_ms(samples, 99), max(samples) * 1000


def vm_bench_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The VM benches' shared options (--pid, --json), parsed; exits naming why the VM lab cannot run."""
    from labkit import vm

    parser.add_argument("--pid", choices=("container", "pod", "node"), default="container")
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args()
    reason = vm.missing()
    if reason:
        raise SystemExit(reason)
    return args
