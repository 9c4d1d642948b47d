"""The memcg reparenting probe on the real kernel, and doctor's line (issue 42 case 3, target d)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from runc_guard.delete import reclaim
from runc_guard.delete.cgroupfs import cgroup_mounts
from runc_guard.node import memcg_probe

pytestmark = pytest.mark.kernel


def _probe_dirs() -> list[str]:
    """This process's probe cgroups: a finisher of another test may be probing at the same time."""
    own = f"runc-guard-probe.{os.getpid()}"
    return [os.path.join(m, n) for m in cgroup_mounts() if os.path.isdir(m)
            for n in os.listdir(m) if n.startswith(own)]  # fmt: skip


def test_this_kernel_pins_a_removed_memcg_and_doctor_says_so(tmp_path: Path) -> None:
    """Linux 6.18 (this host) keeps a memcg removed with page cache charged dying: the probe says
    False, from the kernel's behaviour (the parent's own cache stays empty while its total counts the
    child's 1 MiB), leaves no cgroup and no scratch file, and doctor names it and what runc-guard
    does there; its answer is cached for the deletes. A 7.x kernel that reparents would say True
    (not shown here: no such kernel on this host)."""
    if os.uname().release.split(".")[0] >= "7":
        pytest.skip("a 7.x kernel: the reparenting side, not this host's")
    before = _probe_dirs()
    answer, how = memcg_probe.probe(cgroup_mounts())
    print(f"\nprobe on {os.uname().release}: {answer} ({how})")
    assert answer is False, how
    assert _probe_dirs() == before
    scratch = f".runc-guard-probe.{os.getpid()}."
    assert not [n for n in os.listdir(memcg_probe.SCRATCH) if n.startswith(scratch)]
    from runc_guard.cli import cli

    cache = tmp_path / "cache"
    result = CliRunner().invoke(cli, ["doctor", "--format", "json"], env={"RUNC_GUARD_CACHE_DIR": str(cache)})
    report = json.loads(result.output)["memcg_reparenting"]
    assert report["reparents"] is False and "reclaims its cold page cache" in report["meaning"], report
    assert reclaim.kernel_reparents(str(cache / reclaim.PROBE_FILE)) is False
    text = CliRunner().invoke(cli, ["doctor"], env={"RUNC_GUARD_CACHE_DIR": str(cache)}).output
    assert f"kernel {os.uname().release}: memcg reparenting no -> " in text, text


def test_a_probe_killed_midway_leaves_nothing_for_long(tmp_path: Path) -> None:
    """A finisher SIGKILLed while it probed leaves ``runc-guard-probe.<pid>/probe`` under the memory
    root and its scratch directory. The next probe removes those of a dead pid (rmdir only: never
    a populated cgroup) and keeps a live prober's."""
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid is free now: nothing of ours runs under it
    mounts = cgroup_mounts()
    root = next(m for m, t in sorted(mounts.items())
                if t == "cgroup" and os.path.exists(os.path.join(m, "memory.force_empty")))  # fmt: skip
    stale, live = os.path.join(root, f"runc-guard-probe.{dead.pid}"), os.path.join(root, "runc-guard-probe.1")
    scratch = tmp_path / f".runc-guard-probe.{dead.pid}.x"
    try:
        os.makedirs(os.path.join(stale, "probe"))
        os.mkdir(live)  # pid 1 is alive: a prober's, never ours to remove
        scratch.mkdir()
        (scratch / "probe").write_bytes(b"x")
        _answer, how = memcg_probe.probe(mounts, scratch=str(tmp_path))
        assert not os.path.exists(stale) and not scratch.exists(), how
        assert os.path.isdir(live)
    finally:
        for path in (os.path.join(stale, "probe"), stale, live):
            with contextlib.suppress(OSError):
                os.rmdir(path)
