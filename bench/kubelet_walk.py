"""What kubelet would pay: destroying a pod cgroup that still has N leaked container children.

kubelet's ``PodContainerManager.Destroy`` (docs/background.md, the failure) first looks for
processes to kill: ``cgroupManager.Pids`` runs, for every hierarchy, a Go
``filepath.Walk`` over the pod directory (``lstat`` of every entry, control
files included) reading ``cgroup.procs`` of every directory; when processes are
found it kills and walks again, up to 5 times. Then libcontainer's
``RemovePath`` removes the tree (rmdir, on EBUSY read the directory, recurse,
rmdir again). Both are emulated here syscall for syscall (in Python, so user
time is higher than Go's; the kernel's share, the system CPU, is the same).

For N = 0, 1000 and 8147 leaked children in every hierarchy we report one walk,
five walks, the removal, the syscalls each issued, the walker's own system CPU
and a probe's latency (mkdir+rmdir of another cgroup every 5 ms, as every
other pod's runtime does meanwhile). N = 0 is what kubelet pays after the
sweep removed the leftovers: the difference is what the sweep saves at the worst
moment (pod deletion on a node already in trouble).

Run as root: ``python -m bench.kubelet_walk [--children 0,1000,8147] [--passes 5]``.
"""

from __future__ import annotations

import argparse
import errno
import os
import resource
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

from bench.common import (
    PREFIX,
    Probe,
    build_pod_tree,
    cgroup_mounts,
    phase_stats,
    print_table,
    remove_everywhere,
    sys_percent,
)
from runc_guard.node.sweep import cpu_sample


@dataclass
class Syscalls:
    """What the emulation asked the kernel for."""

    lstat: int = 0
    readdir: int = 0
    procs_reads: int = 0
    rmdir: int = 0


def walk_pids(root: str, calls: Syscalls) -> list[int]:
    """Go's filepath.Walk(root, visitor) with kubelet's visitor: cgroup.procs of every directory."""
    pids: list[int] = []

    def visit(path: str, is_dir: bool) -> None:
        if not is_dir:
            return
        calls.procs_reads += 1
        try:
            with open(os.path.join(path, "cgroup.procs"), "rb") as f:
                pids.extend(int(x) for x in f.read().split())
        except OSError:
            return
        calls.readdir += 1
        try:
            names = sorted(os.listdir(path))  # readDirNames: getdents, then sort
        except OSError:
            return
        for name in names:
            child = os.path.join(path, name)
            calls.lstat += 1
            try:
                st = os.lstat(child)
            except OSError:
                continue
            visit(child, (st.st_mode & 0o170000) == 0o040000)

    calls.lstat += 1
    os.lstat(root)
    visit(root, True)
    return pids


def remove_path(path: str, calls: Syscalls) -> None:
    """libcontainer (runc 1.1) cgroups.RemovePath: try rmdir, else remove subdirectories first."""
    calls.rmdir += 1
    try:
        os.rmdir(path)
        return
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
            raise
    calls.readdir += 1
    with os.scandir(path) as it:  # os.ReadDir: the type comes from getdents, no lstat
        subdirs = [e.path for e in it if e.is_dir(follow_symlinks=False)]
    for sub in subdirs:
        remove_path(sub, calls)
    calls.rmdir += 1
    os.rmdir(path)


def thread_cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime, usage.ru_stime


def destroy(pods: list[str], passes: int, probe: Probe, labels: list[str]) -> dict[str, Any]:
    """kubelet's Destroy on ``pods`` (one directory per hierarchy): walks, then removal."""
    result: dict[str, Any] = {}
    walk_calls = Syscalls()
    probe.mark()
    labels.append("walk")
    cpu0, node0, t0 = thread_cpu(), cpu_sample(), time.monotonic()
    first = 0.0
    for i in range(passes):
        for pod in pods:
            walk_pids(pod, walk_calls)
        if i == 0:
            first = time.monotonic() - t0
    cpu1, node1, t1 = thread_cpu(), cpu_sample(), time.monotonic()
    result["walk1"] = first
    result["walks"] = t1 - t0
    result["walk_sys"] = cpu1[1] - cpu0[1]
    result["walk_user"] = cpu1[0] - cpu0[0]
    result["walk_node_sys"] = sys_percent(node0, node1)
    result["walk_calls"] = walk_calls
    remove_calls = Syscalls()
    probe.mark()
    labels.append("remove")
    for pod in pods:
        remove_path(pod, remove_calls)
    cpu2, node2, t2 = thread_cpu(), cpu_sample(), time.monotonic()
    result["remove"] = t2 - t1
    result["remove_sys"] = cpu2[1] - cpu1[1]
    result["remove_node_sys"] = sys_percent(node1, node2)
    result["remove_calls"] = remove_calls
    probe.mark()
    labels.append("(after)")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--children", default="0,1000,8147")
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    mounts = cgroup_mounts()
    top = f"{PREFIX}-kube-{uuid.uuid4().hex[:8]}"
    probe_mount = next((m for m in mounts if m.endswith("/memory")), mounts[0])
    probe_name = f"{PREFIX}-probe-{uuid.uuid4().hex[:8]}"
    results: list[tuple[int, dict[str, Any]]] = []
    labels: list[str] = []
    started = time.monotonic()
    os.mkdir(os.path.join(probe_mount, probe_name))
    try:
        with Probe(os.path.join(probe_mount, probe_name)) as probe:
            for n in (int(x) for x in args.children.split(",")):
                probe.mark()
                labels.append("(setup)")
                pods = build_pod_tree(top, f"kubepods/burstable/pod{uuid.uuid4()}", n, mounts)
                time.sleep(1)
                results.append((n, destroy(pods, args.passes, probe, labels)))
                print(f"  N={n}: walks {results[-1][1]['walks']:.1f} s, "
                      f"remove {results[-1][1]['remove']:.1f} s", file=sys.stderr)
            samples = probe.phases()
    finally:
        remove_everywhere(top)
        remove_everywhere(probe_name)
    by_phase: dict[str, list[list[float]]] = {}
    for i, label in enumerate(labels):
        by_phase.setdefault(label, []).append(samples[i + 1] if i + 1 < len(samples) else [])
    rows = []
    for k, (n, r) in enumerate(results):
        wc, rc = r["walk_calls"], r["remove_calls"]
        _, _, walk_p99, walk_max = phase_stats(by_phase["walk"][k])
        _, _, rm_p99, rm_max = phase_stats(by_phase["remove"][k])
        rows.append((
            n, n * len(mounts), r["walk1"], r["walks"], wc.lstat + wc.procs_reads + wc.readdir,
            r["walk_sys"], r["walk_node_sys"], walk_p99, walk_max,
            r["remove"], rc.rmdir, r["remove_sys"], r["remove_node_sys"], rm_p99, rm_max,
        ))
    print_table(
        f"kubelet Destroy of a pod with N leaked children, {len(mounts)} hierarchies "
        f"({args.passes} walks, then RemovePath)",
        ["N", "dirs", "1 walk s", f"{args.passes} walks s", "walk file ops (lstat+readdir+procs read)",
         "walk sys CPU s",
         "walk node sys %", "walk probe p99 ms", "walk probe max ms", "remove s", "rmdir calls",
         "remove sys CPU s", "remove node sys %", "remove probe p99 ms", "remove probe max ms"],
        rows,
    )
    idle = [s for phase in by_phase.get("(setup)", []) for s in phase[-100:]]
    print(f"\nprobe between phases (last 100 samples of each setup pause): "
          f"p99 {phase_stats(idle)[2]:.2f} ms; whole run {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
