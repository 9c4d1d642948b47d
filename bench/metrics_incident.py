"""The incident's leak on this node, as the metrics file shows it before and after a sweep.

Makes 8147 leaked container cgroups (64-hex ids, one pod) in every hierarchy
below a unique ``rgmetrics-<hex>`` parent, writes the metrics textfile with
``runc-guardctl metrics`` (timed), sweeps, writes it again, prints the lines
that matter and removes everything it made, whatever happened.

    sudo .venv/bin/python -m bench.metrics_incident [--count 8147] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid

from labkit.kernel import cgroup_mount_points, remove_tree
from runc_guard.delete.cgroupfs import cgroup_mounts
from runc_guard.node.cgroupstats import read_kernel

CTL = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")
POD = "kubepods/burstable/pod0c5e2a51-7e1e-4d5b-9a43-1b2c3d4e5f60"
SHOWN = (
    "runc_guard_leaked_containers ",
    "runc_guard_leaked_cgroup_dirs ",
    "runc_guard_pod_leaked_containers{",
    "runc_guard_kubepods_cgroups{",
    'runc_guard_kernel_cgroups{controller="memory"',
    'runc_guard_kernel_cgroups{controller="pids"',
    "runc_guard_dying_cgroups{",
    "runc_guard_cgroup2_descendants{",
    "runc_guard_sweep_dirs_removed_total ",
    "runc_guard_sweep_containers_removed_total ",
    "runc_guard_orphaned_runtime_states ",
    "runc_guard_config_valid ",
    "runc_guard_audit_ok ",
)


def run(argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=1800)
    return time.monotonic() - started, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=8147)
    parser.add_argument("--out", default=tempfile.mkdtemp(prefix="rgmetrics-"))
    args = parser.parse_args()
    mounts = cgroup_mount_points()
    parent = f"rgmetrics-{uuid.uuid4().hex[:12]}"
    work = args.out
    env = dict(
        os.environ,
        RUNC_GUARD_CONFIG=os.path.join(work, "absent.toml"),
        RUNC_GUARD_PENDING_DIR=os.path.join(work, "run", "pending"),
        RUNC_GUARD_STATS_FILE=os.path.join(work, "run", "deletes.jsonl"),
    )
    scan = [
        "--kubepods",
        f"{parent}/kubepods",
        "--runtime-root",
        os.path.join(work, "runc"),
        "--bundle-root",
        os.path.join(work, "bundles"),
        "--state-root",
        os.path.join(work, "flat"),
    ]
    try:
        started = time.monotonic()
        then = time.time() - 3600
        for _ in range(args.count):
            cid = uuid.uuid4().hex + uuid.uuid4().hex
            for mount in mounts:
                path = os.path.join(mount, parent, POD, cid)
                os.makedirs(path)
                os.utime(path, (then, then))
        print(f"made {args.count} x {len(mounts)} leaked cgroups in {time.monotonic() - started:.1f}s")
        results = {}
        for phase in ("before", "after"):
            if phase == "after":
                took, done = run([CTL, "sweep", *scan, "--format", "json"], env)
                report = json.loads(done.stdout)
                print(
                    f"sweep: removed {report['removed']} containers, {report['dirs_removed']} dirs, "
                    f"{len(report['batches'])} batches, {took:.1f}s wall"
                )
            started = time.monotonic()
            facts = read_kernel({m: t for m, t in cgroup_mounts().items()}, [f"{parent}/kubepods"])
            print(f"read_kernel ({phase}): {time.monotonic() - started:.3f}s for {len(facts.trees)} trees")
            prom = os.path.join(work, f"{phase}.prom")
            took, done = run([CTL, "metrics", *scan, "-o", prom], env)
            if done.returncode != 0:
                raise SystemExit(done.stderr)
            with open(prom) as f:
                text = f.read()
            results[phase] = took
            print(f"\n# {phase} the sweep: runc-guardctl metrics took {took:.2f}s, {len(text)} bytes")
            for line in text.splitlines():
                if line.startswith(SHOWN):
                    print(line.replace(parent, "<prefix>"))
        print(f"\nfiles: {work}/before.prom {work}/after.prom")
    finally:
        for mount in mounts:
            remove_tree(os.path.join(mount, parent))


if __name__ == "__main__":
    main()
