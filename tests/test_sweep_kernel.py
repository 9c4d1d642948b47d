"""The sweep on the real kernel: synthetic kubepods trees with thousands of leaked containers.

Each test builds its trees below a unique ``rgsweep-<uuid>`` parent in every
hierarchy and points ``runc-guardctl sweep --kubepods`` at it, so nothing but
what the test made can be touched. Survivors cover every reason to keep a
container; processes are ``sleep``s started here and killed by their pid.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from labkit import prereq
from labkit.kernel import RUNC, cgroup_mount_points, procs, remove_tree, wait_for
from runc_guard.cli.sweep import MAX_JOURNAL_IDS
from runc_guard.delete.pending import PendingRecord, write_record
from tests.hermetic import own_env, own_roots

pytestmark = pytest.mark.kernel

CTL = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")
UNIFIED = "/sys/fs/cgroup/unified"


def new_id() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


class Trees:
    """Synthetic cgroup trees below one unique parent per hierarchy; removable whatever happened."""

    def __init__(self, mounts: list[str]) -> None:
        self.parent = f"rgsweep-{uuid.uuid4().hex[:12]}"
        self.mounts = mounts
        self.sleepers: list[subprocess.Popen[bytes]] = []

    def top(self, mount: str) -> str:
        return os.path.join(mount, self.parent)

    def make(self, relative: str, old: bool = True) -> list[str]:
        """mkdir ``<mount>/<parent>/<relative>`` in every hierarchy; ``old`` backdates it an hour."""
        made = []
        then = time.time() - 3600
        for mount in self.mounts:
            path = os.path.join(self.top(mount), relative)
            os.makedirs(path, exist_ok=True)
            if old:
                os.utime(path, (then, then))
            made.append(path)
        return made

    def populate(self, path: str) -> int:
        """Start a sleep and move it into ``path`` (one hierarchy only)."""
        sleeper = subprocess.Popen(["sleep", "600"])
        self.sleepers.append(sleeper)
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(sleeper.pid))
        return sleeper.pid

    def snapshot(self) -> set[str]:
        found: set[str] = set()
        for mount in self.mounts:
            for dirpath, _dirs, _files in os.walk(self.top(mount)):
                found.add(dirpath)
        return found

    def destroy(self) -> None:
        for sleeper in self.sleepers:
            sleeper.kill()  # by the pid we started
            sleeper.wait()
        for mount in self.mounts:
            wait_for(lambda m=mount: not any(procs(d) for d, _, _ in os.walk(self.top(m))), 10)
            remove_tree(self.top(mount))


@pytest.fixture
def trees() -> Iterator[Trees]:
    made = Trees(cgroup_mount_points())
    try:
        yield made
    finally:
        made.destroy()


def one_hierarchy(mounts: list[str]) -> str:
    """A hierarchy any process can be moved into (v1 cpuset would need cpus/mems first)."""
    for candidate in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", UNIFIED, "/sys/fs/cgroup"):
        if candidate in mounts:
            return candidate
    raise AssertionError(f"no usable hierarchy in {mounts}")


def sweep(trees: Trees, tmp_path: Path, *args: str, prefix: tuple[str, ...] = (), **env: str) -> str:
    argv = [
        *prefix, CTL, "sweep",
        "--kubepods", f"{trees.parent}/kubepods", "--kubepods", f"{trees.parent}/kubepods.slice",
        *own_roots(tmp_path), *args,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, env=own_env(tmp_path, **env),
                          timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@dataclass
class Incident:
    """What build_incident made: the orphans by name, survivors by name -> parent, the record."""

    orphans: set[str]
    orphan_ids: set[str]
    survivors: dict[str, str]
    record: str
    levels: tuple[str, ...]


def build_incident(trees: Trees, tmp_path: Path, count: int) -> Incident:
    """``count`` leaked containers under one pod, three systemd-driver ones, and every kind of survivor."""
    pod = "kubepods/burstable/pod0c5e2a51-7e1e-4d5b-9a43-1b2c3d4e5f60"
    systemd_pod = ("kubepods.slice/kubepods-burstable.slice/"
                   "kubepods-burstable-pod0c5e2a51_7e1e_4d5b_9a43_1b2c3d4e5f61.slice")
    orphans = {cid: cid for cid in (new_id() for _ in range(count))}  # dir name -> container id
    for cid in orphans:
        trees.make(f"{pod}/{cid}")
    for kind in ("cri-containerd", "docker", "crio"):
        cid = new_id()
        orphans[f"{kind}-{cid}.scope"] = cid
        trees.make(f"{systemd_pod}/{kind}-{cid}.scope")
    hierarchy = trees.top(one_hierarchy(trees.mounts))
    populated, populated_child, stateful, bundled, young = (new_id() for _ in range(5))
    trees.make(f"{pod}/{populated}")
    trees.populate(os.path.join(hierarchy, pod, populated))
    trees.make(f"{pod}/{populated_child}/nested")
    trees.populate(os.path.join(hierarchy, pod, populated_child, "nested"))
    trees.make(f"{pod}/{stateful}")
    (tmp_path / "runc" / "k8s.io" / stateful).mkdir(parents=True)
    (tmp_path / "runc" / "k8s.io" / stateful / "state.json").write_text("{}")
    trees.make(f"{pod}/{bundled}")
    (tmp_path / "bundles" / "k8s.io" / bundled).mkdir(parents=True)
    trees.make(f"{pod}/{young}", old=False)
    conmon = f"crio-conmon-{new_id()}.scope"
    trees.make(f"{systemd_pod}/{conmon}")
    trees.make(f"{pod}/not-a-container")
    survivors = {populated: pod, populated_child: pod, stateful: pod, bundled: pod, young: pod,
                 conmon: systemd_pod, "not-a-container": pod}
    # A pending record of the shim, for a container outside kubepods.
    recorded = new_id()
    orphans[recorded] = recorded
    record = write_record(
        str(tmp_path / "run" / "pending"),
        PendingRecord(recorded, str(tmp_path / "runc" / "default"), trees.make(f"default/{recorded}"),
                      1, 1, RUNC, time.time() - 600),  # the runtime as the delete resolved it
    )
    levels = ("kubepods", "kubepods/burstable", pod, systemd_pod, "kubepods.slice", "default")
    return Incident(set(orphans), set(orphans.values()), survivors, record, levels)


def test_sweep_removes_exactly_the_orphans(trees: Trees, tmp_path: Path) -> None:
    """2000 leaked containers x every hierarchy go, every survivor stays everywhere; dry run: no change."""
    hierarchies = len(trees.mounts)
    incident = build_incident(trees, tmp_path, 2000)
    expected = len(incident.orphan_ids)
    before = trees.snapshot()
    text = sweep(trees, tmp_path, "--dry-run")
    assert trees.snapshot() == before
    assert os.path.exists(incident.record)
    would = [line.split()[2] for line in text.splitlines() if line.startswith("would remove ")]
    assert len(would) == expected
    assert set(would) == incident.orphan_ids

    no_journald = str(tmp_path / "no-journald.socket")  # the canonical entry goes to the fallback file
    report = json.loads(sweep(trees, tmp_path, "--pacing", "fixed", "--batch", "4000", "--pause", "0.2",
                              "--max-sys-percent", "100", "--format", "json",
                              RUNC_GUARD_JOURNAL_SOCKET=no_journald))
    after = trees.snapshot()
    gone = before - after
    assert all(os.path.basename(d) in incident.orphans for d in gone)
    assert len(gone) == expected * hierarchies
    for name, parent in incident.survivors.items():
        for mount in trees.mounts:
            assert os.path.isdir(os.path.join(trees.top(mount), parent, name)), (mount, name)
    for level in incident.levels:
        assert all(os.path.isdir(os.path.join(trees.top(m), level)) for m in trees.mounts)
    assert not os.path.exists(incident.record)
    assert (report["found"], report["removed"]) == (expected + 5, expected)
    assert report["records_cleared"] == 1
    assert report["dirs_removed"] == expected * hierarchies
    assert report["kept"] == {"populated": 2, "runtime_state": 1, "bundle": 1, "too_young": 1}
    assert report["errors"] == []

    batches = report["batches"]
    units_per_batch = -(-4000 // hierarchies)  # a batch closes once it holds >= 4000 dirs
    assert len(batches) == -(-expected // units_per_batch)
    assert sum(b["dirs_removed"] for b in batches) == expected * hierarchies
    for batch in batches[:-1]:
        assert 4000 <= batch["dirs_removed"] < 4000 + hierarchies
        assert batch["pause"] == 0.2
    for earlier, later in itertools.pairwise(batches):
        assert later["started"] >= earlier["finished"] + 0.2 - 0.001  # timings are rounded to ms
    state = json.loads((tmp_path / "run" / "metrics-state.json").read_text())
    assert (state["sweep"]["runs"], state["sweep"]["dirs_removed"]) == (1, expected * hierarchies)
    entries = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    [entry] = [e for e in entries if e["event"] == "sweep"]  # the dry run logs none
    assert (entry["level"], entry["removed"]) == ("info", expected)
    assert entry["dirs_removed"] == expected * hierarchies
    assert entry["kept"] == report["kept"] and entry["removed_ids_truncated"] is True
    assert len(entry["removed_ids"]) == MAX_JOURNAL_IDS and set(entry["removed_ids"]) <= incident.orphan_ids


def test_sweep_slows_down_while_sys_percent_is_high(trees: Trees, tmp_path: Path) -> None:
    """With a 0% limit a batch that used measurable system CPU is followed by a slowdown, within the cap."""
    for _ in range(200):
        trees.make(f"kubepods/besteffort/pod1a2b3c4d/{new_id()}")
    report = json.loads(sweep(trees, tmp_path, "--pacing", "fixed", "--batch", "500", "--pause", "0",
                              "--max-sys-percent", "0", "--max-slowdown", "0.2", "--format", "json"))
    assert report["removed"] == 200
    batches: list[dict[str, Any]] = report["batches"]
    assert len(batches) > 1
    for batch in batches[:-1]:
        # sys_percent is rounded for the report; the decision used the exact value.
        if batch["sys_percent"] is not None and batch["sys_percent"] > 0:
            assert batch["slowed"] > 0
        if batch["slowed"] == 0:
            assert batch["sys_percent"] in (None, 0)
        assert batch["slowed"] <= 0.2
    assert any(b["slowed"] > 0 for b in batches)  # rmdir is system time: some batch measured it
    assert batches[-1]["slowed"] == 0 and batches[-1]["sys_percent"] is None


@pytest.fixture
def v2_trees() -> Iterator[Trees]:
    prereq.require(UNIFIED in cgroup_mount_points(), f"the hybrid layout's cgroup2 at {UNIFIED}")
    made = Trees([UNIFIED])
    try:
        yield made
    finally:
        made.destroy()


PURE_V2 = (
    "unshare", "-m", "sh", "-c",
    "mount --make-rprivate / && umount -l /sys/fs/cgroup && "
    'mount -t cgroup2 none /sys/fs/cgroup && exec "$0" "$@"',
)


def test_pure_v2_in_a_private_mount_namespace(v2_trees: Trees, tmp_path: Path) -> None:
    """With only cgroup2 at /sys/fs/cgroup the sweep sees one hierarchy and removes the orphans there."""
    orphans = [new_id() for _ in range(300)]
    for cid in orphans:
        v2_trees.make(f"kubepods/burstable/pod5e6f7a8b/{cid}")
    survivor, young = new_id(), new_id()
    v2_trees.make(f"kubepods/burstable/pod5e6f7a8b/{survivor}")
    v2_trees.populate(os.path.join(v2_trees.top(UNIFIED), "kubepods/burstable/pod5e6f7a8b", survivor))
    v2_trees.make(f"kubepods/burstable/pod5e6f7a8b/{young}", old=False)
    report = json.loads(sweep(v2_trees, tmp_path, "--pacing", "fixed", "--pause", "0", "--format", "json",
                              prefix=PURE_V2))
    assert report["hierarchies"] == ["/sys/fs/cgroup"]
    assert (report["removed"], report["dirs_removed"]) == (300, 300)
    assert report["kept"] == {"populated": 1, "too_young": 1}
    pod_dir = os.path.join(v2_trees.top(UNIFIED), "kubepods/burstable/pod5e6f7a8b")
    assert sorted(os.path.basename(d) for d in os.scandir(pod_dir) if d.is_dir()) == sorted(
        [survivor, young]
    )


def test_process_that_moves_in_after_the_look_is_refused_by_the_kernel(trees: Trees, tmp_path: Path) -> None:
    """The sweep reads each dir once: a process moved in after that look is kept by the kernel (EBUSY)."""
    from runc_guard.delete.cgroupfs import RealCgroupFs
    from runc_guard.node.discovery import ContainerUnit, Discovery, Hierarchy
    from runc_guard.node.sweep import RuntimeDirs, Sweeper, SweepOptions

    hierarchy = one_hierarchy(trees.mounts)
    pod = "kubepods/besteffort/pod5e6f7a8b"
    late, early, clean = new_id(), new_id(), new_id()
    units = [ContainerUnit(cid, dirs=trees.make(f"{pod}/{cid}"), pod=pod) for cid in (late, early, clean)]
    trees.make(f"{pod}/{early}/nested")
    trees.populate(os.path.join(trees.top(hierarchy), pod, early, "nested"))
    target = os.path.join(trees.top(hierarchy), pod, late)

    class MovesInLate(RealCgroupFs):
        """The real kernel; before the first rmdir of ``late``'s unit a process moves into its dir."""

        moved = False

        def rmdir(self, path: str) -> None:
            if not self.moved and os.path.basename(path) == late:
                self.moved = True
                trees.populate(target)
            super().rmdir(path)

    fs = MovesInLate()
    discovery = Discovery([Hierarchy(m, "cgroup") for m in trees.mounts], {u.container_id: u for u in units})
    runtime = RuntimeDirs(str(tmp_path / "runc"), str(tmp_path / "bundles"))
    report = Sweeper(fs, runtime, SweepOptions(min_age=0, pause=0, pacing="fixed")).run(discovery)
    assert fs.moved
    assert report.kept == {"populated": 1, "busy": 1}
    actions = {c["id"]: c["action"] for c in report.containers}
    assert actions == {late: "kept:busy", early: "kept:populated", clean: "removed"}
    assert os.path.isdir(target) and procs(target)  # the kernel refused: the process is still inside
    assert all(os.path.isdir(d) for d in units[1].dirs)  # the populated unit is kept whole
    assert not any(os.path.isdir(d) for d in units[2].dirs)
    for path in units[1].dirs:  # and a kept unit's cpuset is not touched
        flag = os.path.join(path, "cpuset.sched_load_balance")
        if os.path.exists(flag):
            with open(flag) as f:
                assert f.read().strip() == "1"


def test_stop_load_balance_clears_a_v1_cpuset_only(trees: Trees) -> None:
    """0 lands in a v1 cpuset's sched_load_balance; a dir of another hierarchy has no such file."""
    from runc_guard.delete.cgroupfs import RealCgroupFs

    cpuset = "/sys/fs/cgroup/cpuset"
    prereq.require(cpuset in trees.mounts, f"the v1 cpuset hierarchy at {cpuset}")
    made = dict(zip(trees.mounts, trees.make(f"kubepods/pod1/{new_id()}"), strict=True))
    fs = RealCgroupFs()
    flag = os.path.join(made[cpuset], "cpuset.sched_load_balance")
    with open(flag) as f:
        assert f.read().strip() == "1"  # the kernel's default for a new v1 cpuset
    fs.stop_load_balance(made[cpuset])
    with open(flag) as f:
        assert f.read().strip() == "0"
    other = made[one_hierarchy(trees.mounts)]
    with pytest.raises(FileNotFoundError):
        fs.stop_load_balance(other)
    fs.rmdir(made[cpuset])
    assert not os.path.exists(made[cpuset])


def test_sweep_reclaims_a_leaked_memcg_before_its_rmdir(trees: Trees, tmp_path: Path) -> None:
    """A leaked container whose memory cgroup still has 1 MiB of a volume's page cache charged (the
    runtime's rmdir never came; the file it read outlives it): the sweep reclaims it before the rmdir,
    so the kernel frees the memcg instead of keeping it dying. The charge stays below the pod until then."""
    memory = "/sys/fs/cgroup/memory"
    if memory not in trees.mounts:
        pytest.skip("no cgroup v1 memory hierarchy (pure v2: the VM lab covers memory.reclaim)")
    pod = "kubepods/burstable/pod0c5e2a51-7e1e-4d5b-9a43-1b2c3d4e5f70"
    cid = new_id()
    trees.make(f"{pod}/{cid}")
    leaked = os.path.join(trees.top(memory), pod, cid)
    # The memcg is charged the file's clean data pages and nothing else the sweep cannot decide on:
    # written and dropped from the page cache before, so that no ext4 metadata its allocation dirtied
    # (the journal's to clean, when it likes) is charged here; read by a fork of this process, so that
    # no program or library page a fresh exec would fault in (mapped by every live process, which the
    # kernel rightly keeps) is charged here either.
    volume = tmp_path / "volume.log"
    with open(volume, "wb") as f:
        f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    procs = os.open(os.path.join(leaked, "cgroup.procs"), os.O_WRONLY)
    data = os.open(volume, os.O_RDONLY)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only moves itself and reads
        try:
            os.write(procs, b"0")
            while os.read(data, 1 << 16):
                pass
        finally:
            os._exit(0)
    os.close(procs)
    os.close(data)
    assert os.waitpid(child, 0)[1] == 0
    os.utime(leaked, (time.time() - 3600, time.time() - 3600))
    pod_dir = os.path.join(trees.top(memory), pod)

    def charged() -> int:
        with open(os.path.join(pod_dir, "memory.usage_in_bytes")) as f:
            return int(f.read())

    before = charged()
    assert before >= 1 << 20, "the control: the leftover keeps the file's pages charged"
    report = json.loads(sweep(trees, tmp_path, "--max-sys-percent", "100", "--format", "json"))
    assert not os.path.exists(leaked) and report["removed"] == 1
    # What the sweep decides: nothing left charged when it removed the memcg, and the pages gone
    # from the pod. How much of the 1 MiB it reclaimed itself is not its call alone: a node-wide
    # reclaimer (DAMON's kdamond pages cold cache out here) may have taken part of it first.
    assert report["memcg_left"] == 0 and report["memcg_reclaimed_kb"] <= before >> 10, json.dumps(report)
    assert charged() < before - (900 << 10), (before, charged())
