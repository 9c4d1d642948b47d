"""The adaptive sweep on the real kernel: real leaked cgroups, the real canary and PSI.

The tree sits below a unique ``rgpace-<uuid>`` parent in every hierarchy and
``--kubepods`` points at it, so nothing but what the test made can be touched;
it is removed in a ``finally`` whatever happened. No timing is asserted: the
pace's figures are the benchmark's job (bench/sweep_gentleness.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.kernel import cgroup_mount_points, remove_tree
from runc_guard.node.pacing import CgroupCanary
from tests.hermetic import own_env, own_roots

pytestmark = pytest.mark.kernel

CTL = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")
CONTAINERS = 40


@pytest.fixture
def parent() -> Iterator[str]:
    """A unique top-level name, removed from every hierarchy afterwards."""
    name = f"rgpace-{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        for mount in cgroup_mount_points():
            remove_tree(os.path.join(mount, name))


def test_adaptive_sweep_removes_every_leaked_dir(parent: str, tmp_path: Path) -> None:
    """40 leaked containers x every hierarchy: all gone in several paced batches; pods stay; no canary."""
    mounts = cgroup_mount_points()
    pod = "kubepods/burstable/pod3d0f1c2b-aaaa-4bbb-8ccc-0123456789ab"
    ids = [uuid.uuid4().hex + uuid.uuid4().hex for _ in range(CONTAINERS)]
    for mount in mounts:
        for cid in ids:
            os.makedirs(os.path.join(mount, parent, pod, cid))
    with subprocess.Popen(
        [CTL, "sweep", "--kubepods", f"{parent}/kubepods", "--min-age", "0", *own_roots(tmp_path),
         "--pacing", "adaptive", "--max-batch", "60", "--format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=own_env(tmp_path),
    ) as sweep:  # fmt: skip
        try:
            out, err = sweep.communicate(timeout=240)
        finally:
            if sweep.poll() is None:
                sweep.kill()  # by the pid we started
    assert sweep.returncode == 0, err
    # Its own canary (named by its pid): another worker's sweep may be timing one right now.
    canary = f"{CgroupCanary.PREFIX}{sweep.pid}"
    report = json.loads(out)
    dirs = CONTAINERS * len(mounts)
    assert (report["removed"], report["dirs_removed"], report["errors"]) == (CONTAINERS, dirs, [])
    for mount in mounts:
        assert not [cid for cid in ids if os.path.isdir(os.path.join(mount, parent, pod, cid))]
        assert os.path.isdir(os.path.join(mount, parent, pod))  # the pod level is never touched
        assert not os.path.exists(os.path.join(mount, canary))
    assert report["pacing"] == "adaptive"
    assert report["baseline"]["canary_p90_ms"] is not None  # root can make the canary here
    batches = report["batches"]
    assert len(batches) >= 2
    assert sum(b["dirs_removed"] for b in batches) == dirs
    assert all(b["target"] <= 60 for b in batches)
    assert all(b["decision"] in ("grow", "hold", "shrink", "back_off") for b in batches[:-1])
    assert all(b["canary_ms"] is not None for b in batches[:-1])
