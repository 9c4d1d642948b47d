"""Kernel cgroup gauges: recorded /proc/cgroups and cgroup.stat files, then the real kernel."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runc_guard.delete.cgroupfs import cgroup_mounts
from runc_guard.node.cgroupstats import (
    ControllerCount,
    count_descendants,
    families,
    parse_cgroup_stat,
    parse_proc_cgroups,
    read_kernel,
)

#: /proc/cgroups as recorded on the Debian 12 hybrid build host (2026-11-30).
PROC_CGROUPS = """#subsys_name\thierarchy\tnum_cgroups\tenabled
cpuset\t3\t10\t1
cpu\t1\t10\t1
cpuacct\t2\t10\t1
blkio\t7\t10\t1
memory\t4\t8252\t1
devices\t5\t10\t1
freezer\t6\t12\t1
net_cls\t0\t22\t1
perf_event\t0\t22\t1
net_prio\t0\t22\t1
hugetlb\t0\t22\t1
pids\t8\t10\t1
rdma\t0\t1\t0
"""
#: The hybrid unified tree's cgroup.stat, recorded the same day, plus dying cgroups.
CGROUP_STAT = """nr_descendants 21
nr_subsys_perf_event 22
nr_subsys_hugetlb 1
nr_dying_descendants 7
nr_dying_subsys_perf_event 0
"""


def test_parse_proc_cgroups() -> None:
    """Every controller line is read; the header and malformed lines are not; disabled is kept as such."""
    parsed = parse_proc_cgroups(PROC_CGROUPS + "garbage line\nmemory x 1 1\n")
    assert len(parsed) == 13
    assert parsed[4] == ControllerCount("memory", 4, 8252, True)
    assert parsed[-1] == ControllerCount("rdma", 0, 1, False)


def test_parse_cgroup_stat() -> None:
    """``key value`` pairs become integers."""
    stat = parse_cgroup_stat(CGROUP_STAT)
    assert (stat["nr_descendants"], stat["nr_dying_descendants"]) == (21, 7)


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[dict[str, str], str]:
    """A v1 memory hierarchy with a kubepods tree of directories, and a cgroup2 tree with stat files."""
    proc = tmp_path / "proc_cgroups"
    proc.write_text(PROC_CGROUPS)
    memory = tmp_path / "memory"
    for n in range(5):
        (memory / "kubepods" / "burstable" / "pod1" / f"{n:064x}").mkdir(parents=True)
    (memory / "kubepods" / "burstable" / "pod1" / f"{0:064x}" / "nested").mkdir()
    unified = tmp_path / "unified"
    (unified / "kubepods.slice").mkdir(parents=True)
    (unified / "cgroup.stat").write_text(CGROUP_STAT)
    (unified / "kubepods.slice" / "cgroup.stat").write_text("nr_descendants 12\nnr_dying_descendants 3\n")
    return {str(memory): "cgroup", str(unified): "cgroup2"}, str(proc)


def test_read_kernel_on_recorded_files(recorded: tuple[dict[str, str], str]) -> None:
    """v1 kubepods is walked, cgroup2 read from cgroup.stat; a v1 root is never walked."""
    mounts, proc = recorded
    memory, unified = sorted(mounts)
    facts = read_kernel(mounts, ["kubepods", "kubepods.slice"], proc)
    trees = {(t.hierarchy, t.scope): (t.cgroups, t.dying) for t in facts.trees}
    assert trees == {
        (memory, "kubepods"): (1 + 1 + 5 + 1, None),  # burstable, pod1, 5 containers, nested
        (unified, "root"): (21, 7),
        (unified, "kubepods.slice"): (12, 3),
    }
    by_name = {f.name: dict(f.samples) for f in families(facts)}
    assert by_name["runc_guard_kernel_cgroups"][(("controller", "memory"), ("hierarchy_id", "4"))] == 8252
    assert (("controller", "rdma"), ("hierarchy_id", "0")) not in by_name["runc_guard_kernel_cgroups"]
    assert by_name["runc_guard_kubepods_cgroups"] == {
        (("hierarchy", memory), ("kubepods", "kubepods")): 8,
        (("hierarchy", unified), ("kubepods", "kubepods.slice")): 12,
    }
    assert by_name["runc_guard_dying_cgroups"] == {
        (("hierarchy", unified), ("scope", "root")): 7,
        (("hierarchy", unified), ("scope", "kubepods.slice")): 3,
    }
    assert by_name["runc_guard_cgroup2_descendants"][(("hierarchy", unified), ("scope", "root"))] == 21


def test_read_kernel_without_files(tmp_path: Path) -> None:
    """No /proc/cgroups, no kubepods: no samples, no error."""
    facts = read_kernel({str(tmp_path): "cgroup"}, ["kubepods"], str(tmp_path / "absent"))
    assert facts.controllers == () and facts.trees == ()
    assert families(facts) == []


def test_count_descendants_stops_at_limit(tmp_path: Path) -> None:
    """The v1 walk is bounded."""
    for n in range(10):
        (tmp_path / f"c{n}").mkdir()
    assert count_descendants(str(tmp_path)) == 10
    assert count_descendants(str(tmp_path), limit=3) <= 10


# -- the real kernel -------------------------------------------------------------------


@pytest.fixture
def prefix() -> Iterator[tuple[str, dict[str, str]]]:
    """A unique kubepods-like tree of 50 container cgroups in every hierarchy; removed afterwards."""
    mounts = cgroup_mounts()
    name = f"rgstats-{uuid.uuid4().hex[:12]}"
    made: list[str] = []
    try:
        for mount in mounts:
            for n in range(50):
                path = os.path.join(mount, name, "kubepods", "burstable", "podabcdef12", f"{n:064x}")
                os.makedirs(path)
                made.append(path)
        yield name, mounts
    finally:
        for mount in mounts:
            top = os.path.join(mount, name)
            for dirpath, _d, _f in sorted(os.walk(top), key=lambda t: -t[0].count("/")):
                os.rmdir(dirpath)


@pytest.mark.kernel
def test_real_kernel_counts(prefix: tuple[str, dict[str, str]]) -> None:
    """On this kernel: /proc/cgroups counts at least our cgroups; kubepods counts are exact per hierarchy."""
    name, mounts = prefix
    facts = read_kernel(mounts, [f"{name}/kubepods"])
    enabled = {c.controller: c.num_cgroups for c in facts.controllers if c.enabled}
    assert enabled["memory"] >= 50 + 3 + 1  # ours, plus the root; other tests may add more
    kube = {t.hierarchy: t for t in facts.trees if t.scope != "root"}
    assert set(kube) == set(mounts)
    for mount, tree in kube.items():
        assert tree.cgroups == 2 + 50, mount  # burstable, pod, 50 containers
        assert (tree.dying is not None) == (mounts[mount] == "cgroup2")
    if "cgroup2" in mounts.values():
        roots = [t for t in facts.trees if t.scope == "root"]
        assert roots and all(t.cgroups is not None and t.cgroups >= 53 and t.dying is not None for t in roots)
