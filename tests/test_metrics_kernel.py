"""``runc-guardctl metrics`` on the real kernel: every gauge family from a real leak, record and orphan.

Leaks are real cgroup directories below a unique ``rgmetrics-<hex>`` parent in
every hierarchy; the orphan is a runc ``state.json`` naming real cgroups and a
pid we started and reaped; the fronted runtime is the real runc.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from labkit.kernel import RUNC, cgroup_mount_points, remove_tree
from runc_guard.delete.pending import PendingRecord, write_record
from tests.hermetic import own_env, own_roots

pytestmark = pytest.mark.kernel

CTL = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")
POD_UID = "7d1f3e2a-5b4c-4d3e-8f1a-2b3c4d5e6f70"


def new_id() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


@pytest.fixture
def parent() -> Iterator[str]:
    name = f"rgmetrics-{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        for mount in cgroup_mount_points():
            remove_tree(os.path.join(mount, name))


def make_everywhere(parent: str, relative: str) -> list[str]:
    then = time.time() - 3600
    made = []
    for mount in cgroup_mount_points():
        path = os.path.join(mount, parent, relative)
        os.makedirs(path)
        os.utime(path, (then, then))
        made.append(path)
    return made


def dead_pid() -> int:
    """A pid that was a real process and is now gone (reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_metrics_on_a_real_leak(parent: str, tmp_path: Path) -> None:
    """Leaks per pod, kubepods counts per hierarchy, kernel counts, pending age, orphan, runtime, settings."""
    mounts = cgroup_mount_points()
    pod = f"kubepods/burstable/pod{POD_UID}"
    for _ in range(30):
        make_everywhere(parent, f"{pod}/{new_id()}")
    orphan = new_id()
    orphan_dirs = make_everywhere(parent, f"kubepods/besteffort/podorphan0001/{orphan}")
    state_dir = tmp_path / "runc" / "k8s.io" / orphan
    state_dir.mkdir(parents=True)
    paths = {os.path.basename(d.split(f"/{parent}/")[0]): d for d in orphan_dirs}
    (state_dir / "state.json").write_text(
        json.dumps(
            {
                "id": orphan,
                "init_process_pid": dead_pid(),
                "init_process_start": 1,
                "cgroup_paths": paths,
            }
        )
    )
    then = time.time() - 3600
    os.utime(state_dir / "state.json", (then, then))
    os.utime(state_dir, (then, then))
    recorded = new_id()
    write_record(
        str(tmp_path / "run" / "pending"),
        PendingRecord(
            recorded,
            str(tmp_path / "runc" / "default"),
            make_everywhere(parent, f"default/{recorded}"),
            1,
            1,
            RUNC,  # the runtime as the delete resolved it
            time.time() - 600,
        ),
    )
    runc = shutil.which("runc") or "/usr/sbin/runc"
    env = own_env(tmp_path, RUNC_GUARD_RUNTIME=runc)
    out = tmp_path / "textfile" / "runc_guard.prom"
    done = subprocess.run(
        [
            CTL,
            "metrics",
            "--kubepods",
            f"{parent}/kubepods",
            *own_roots(tmp_path),
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(out.read_text())
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("runc_guard_pod_leaked_containers", pod=f"{parent}/{pod}", pod_uid=POD_UID) == 30
    assert value("runc_guard_pod_leaked_cgroup_dirs", pod=f"{parent}/{pod}", pod_uid=POD_UID) == 30 * len(
        mounts
    )
    assert value("runc_guard_leaked_containers") == 30 + 1 + 1  # the pod's, the orphan's, the record's
    assert value("runc_guard_orphaned_runtime_states") == 1
    assert value("runc_guard_runtime_states", verdict="orphan") == 1
    assert value("runc_guard_pending_records") == 1
    assert value("runc_guard_pending_oldest_age_seconds") >= 600
    assert value("runc_guard_config_valid") == 1
    version = subprocess.run([runc, "--version"], capture_output=True, text=True, check=True).stdout
    info = [k for k in samples if k[0] == "runc_guard_runtime_info"]
    assert len(info) == 1 and dict(info[0][1])["path"] == runc
    assert dict(info[0][1])["version"] in version.splitlines()[0]
    for mount in mounts:
        # besteffort, burstable, 2 pods, 31 containers
        assert value("runc_guard_kubepods_cgroups", hierarchy=mount, kubepods=f"{parent}/kubepods") == 35
    memory = [
        v
        for (n, labels), v in samples.items()
        if n == "runc_guard_kernel_cgroups" and ("controller", "memory") in labels
    ]
    assert memory and memory[0] >= 30 + 6
    dying = [k for k in samples if k[0] == "runc_guard_dying_cgroups"]
    assert bool(dying) == any(m.endswith("unified") or m == "/sys/fs/cgroup" for m in mounts)
    assert stat_mode(out) == 0o644 and os.listdir(out.parent) == ["runc_guard.prom"]


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777
