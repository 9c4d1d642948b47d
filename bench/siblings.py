"""The sandbox delete's sibling scan on a node with hundreds of containers in the runtime root.

A CRI sandbox's delete looks for the pod's dead siblings among every state in
the namespace's root (containerd's dead-shim cleanup deletes only the sandbox).
Each state is parsed only when its bytes name the sandbox; this bench times that
scan against parsing every state (what the delete did before), side by side in
one run, on a root of ``--containers`` runc-shaped state.json files (~15 KiB
each, CRI labels, 3 of them the sandbox's siblings), in the page cache.

Run: ``python -m bench.siblings [--containers 500] [--rounds 30]``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import tempfile
import time

from bench.common import median_ms, percentile_ms, print_table
from runc_guard.delete.siblings import mentions
from runc_guard.delete.state import StateMissing, StateUnreadable, read_state

SANDBOX_LABEL = "io.kubernetes.cri.sandbox-id"
TYPE_LABEL = "io.kubernetes.cri.container-type"


def _state(cid: str, sandbox: str, kind: str) -> dict[str, object]:
    """A state.json shaped like runc 1.1's for a CRI container (mounts and env make up its size)."""
    hierarchies = ("blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "pids", "systemd")
    relative = f"/kubepods/burstable/pod{sandbox[:8]}/{cid}"
    return {
        "id": cid,
        "init_process_pid": 4_000_000,
        "init_process_start": 1,
        "created": "2026-12-01T10:00:00.000000000Z",
        "cgroup_paths": {h: f"/sys/fs/cgroup/{h}{relative}" for h in hierarchies},
        "config": {
            "cgroups": {"path": relative},
            "namespaces": [{"type": "NEWNS", "path": ""}, {"type": "NEWPID", "path": ""}],
            "labels": [f"bundle=/run/containerd/io.containerd.runtime.v2.task/k8s.io/{cid}",
                       f"{TYPE_LABEL}={kind}", f"{SANDBOX_LABEL}={sandbox}"],
            "mounts": [
                {"source": f"/var/lib/kubelet/pods/{sandbox}/volumes/v{i}", "destination": f"/data/{i}",
                 "device": "bind", "flags": 20480}
                for i in range(60)
            ],
            "env": [f"SERVICE_{i}_PORT=tcp://10.0.0.{i}:8080" for i in range(120)],
        },
    }


def make_root(directory: str, containers: int) -> tuple[str, str]:
    """``containers`` states in ``directory``: one sandbox with 3 siblings, the rest in other pods."""
    sandbox = secrets.token_hex(32)
    for i in range(containers):
        cid = sandbox if i == 0 else secrets.token_hex(32)
        owner, kind = (sandbox, "sandbox") if i == 0 else (sandbox, "container") if i <= 3 else \
            (secrets.token_hex(32), "container")
        os.makedirs(os.path.join(directory, cid))
        with open(os.path.join(directory, cid, "state.json"), "w") as f:
            json.dump(_state(cid, owner, kind), f)
    return sandbox, directory


def siblings_of(root: str, sandbox: str, prefilter: bool) -> list[str]:
    """The sandbox's containers in ``root``: every state parsed (before), or only those naming it (now)."""
    needle = sandbox.encode()
    found = []
    for cid in sorted(os.listdir(root)):
        if cid == sandbox or (prefilter and not mentions(root, cid, needle)):
            continue
        try:
            state = read_state(root, cid)
        except (StateUnreadable, StateMissing):
            continue
        if state.sandbox_id == sandbox:
            found.append(cid)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="rg-bench-siblings-")
    try:
        sandbox, root = make_root(directory, args.containers)
        size = os.path.getsize(os.path.join(root, sandbox, "state.json"))
        modes = {"parse every state": False, "prefilter by bytes": True}
        times: dict[str, list[float]] = {name: [] for name in modes}
        assert [len(siblings_of(root, sandbox, p)) for p in modes.values()] == [3, 3]
        for _ in range(args.rounds):  # interleaved, so drift hits both alike
            for name, prefilter in modes.items():
                started = time.perf_counter()
                siblings_of(root, sandbox, prefilter)
                times[name].append(time.perf_counter() - started)
        base = median_ms(times["parse every state"])
        rows = [[name, f"{median_ms(v):.1f}", f"{percentile_ms(v, 90):.1f}", f"{median_ms(v) / base:.2f}"]
                for name, v in times.items()]
        print_table(f"sibling scan, {args.containers} states of {size} bytes, {args.rounds} rounds",
                    ["scan", "p50 ms", "p90 ms", "ratio"], rows)
    finally:
        shutil.rmtree(directory)


if __name__ == "__main__":
    main()
