"""Issue 21 on the node tools: three-valued liveness, ownership, the PID namespace, scopes, doctor.

Pure functions are tested over their tables; /proc is a temp dir (hard links
give two "namespace" files the same inode); systemd is a recording fake.
The same behaviours on the real kernel: tests/test_node_safety_kernel.py.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from runc_guard.delete import systemd_scope
from runc_guard.errors import ForeignPidNamespace
from runc_guard.node import liveness, ownership, pidns
from runc_guard.node.audit import NPD_OK, audit, judge
from runc_guard.node.discovery import ContainerUnit, Discovery
from runc_guard.node.sweep import RuntimeDirs, ScopeOps, scope_units
from tests.test_orphans import DEAD_PID, MOUNTS, fake_proc, orphans_for, runtime_with, write_state
from tests.test_sweep import HIERARCHIES, NOW, POD, AgedFs, Recorder, add_unit, cid, sweeper

# -- liveness: only proof of death is death ------------------------------------------------


def stat_bytes(state: str, start: int, comm: str = "sh") -> bytes:
    return f"4001 ({comm}) {state} ".encode() + b"0 " * 18 + f"{start} 0 0\n".encode()


@pytest.mark.parametrize(
    ("raw", "start", "expected"),
    [
        (stat_bytes("S", 777), 777, "alive"),
        (stat_bytes("S", 777), 0, "alive"),  # no recorded start time: the pid alone counts
        (stat_bytes("S", 999), 777, "dead"),  # recycled pid
        (stat_bytes("Z", 777), 777, "dead"),
        (stat_bytes("X", 777), 777, "dead"),
        (stat_bytes("D", 777), 777, "alive"),
        (stat_bytes("S", 777, comm="a) S 1 (b"), 777, "alive"),  # comm with ") "
        (b"4001 (sh) S 1 2", 777, "unknown"),  # cut short
        (b"garbage", 777, "unknown"),
        (b"", 777, "unknown"),
    ],
)
def test_judge_stat(raw: bytes, start: int, expected: str) -> None:
    """Dead only for a zombie or another start time; a line that does not parse is unknown."""
    assert liveness.judge_stat(raw, start) == expected


def test_init_liveness_reads_proc(tmp_path: Path) -> None:
    """ENOENT is dead; any other read error (here EISDIR) is unknown; pid <= 0 is unknown."""
    (tmp_path / "10").mkdir()
    (tmp_path / "10" / "stat").write_bytes(stat_bytes("S", 5))
    (tmp_path / "11" / "stat").mkdir(parents=True)  # open() fails with EISDIR, not ENOENT
    assert liveness.init_liveness(10, 5, str(tmp_path)) == "alive"
    assert liveness.init_liveness(12, 5, str(tmp_path)) == "dead"
    assert liveness.init_liveness(11, 5, str(tmp_path)) == "unknown"
    assert liveness.init_liveness(0, 5, str(tmp_path)) == "unknown"
    assert liveness.init_liveness(-1, 5, str(tmp_path)) == "unknown"


def test_init_liveness_of_this_process() -> None:
    """The real /proc: this process with its real start time is alive, with another one dead."""
    with open(f"/proc/{os.getpid()}/stat", "rb") as f:
        start = int(f.read().rsplit(b")", 1)[1].split()[19])
    assert liveness.init_liveness(os.getpid(), start) == "alive"
    assert liveness.init_liveness(os.getpid(), start + 1) == "dead"


# -- ownership --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "in_containerd_root", "expected"),
    [
        ({"bundle": "/run/containerd/io.containerd.runtime.v2.task/k8s.io/x"}, True, "containerd"),
        ({}, True, "containerd"),  # the location is the proof
        ({"bundle": "/srv/b"}, False, "named_root"),
        ({"bundle": "/run/containerd/io.containerd.runtime.v2.task/k8s.io/x"}, False, "containerd"),
        ({"io.kubernetes.cri.container-type": "container", "bundle": "/x"}, False, "containerd"),
        ({"bundle": "/srv/b", "io.container.manager": "libpod"}, False, "foreign:podman"),
        ({"bundle": "/srv/b", "io.container.manager": "cri-o"}, True, "foreign:cri-o"),
        ({"io.kubernetes.cri-o.Annotations": "{}"}, False, "foreign:cri-o"),
        ({"io.podman.annotations.autoremove": "FALSE"}, False, "foreign:podman"),
        (
            {"bundle": "/var/lib/containers/storage/overlay-containers/abc/userdata"},
            False,
            "foreign:containers-storage",
        ),
        (
            {"bundle": "/run/containers/storage/overlay-containers/abc/userdata"},
            True,
            "foreign:containers-storage",
        ),
        ({}, False, "unknown"),  # nothing to tell an owner from
        (None, False, "unknown"),
        (None, True, "unknown"),
    ],
)
def test_owner_of(labels: dict[str, str] | None, in_containerd_root: bool, expected: str) -> None:
    """containerd by location or its marks; another manager by its marks; else named or unknown."""
    assert ownership.owner_of(labels, in_containerd_root) == expected
    assert ownership.untouchable(expected) == (expected == "unknown" or expected.startswith("foreign:"))


def test_foreign_and_ownerless_state_is_never_redriven(tmp_path: Path, proc: str, fs: AgedFs) -> None:
    """In a named root: podman's and an unmarked crun state stay; a plain runc state is re-driven."""
    flat = tmp_path / "flat"
    podman, crun, plain = (add_unit(fs, n) for n in (1, 2, 3))
    write_state(flat, cid(1), DEAD_PID, labels=["bundle=/srv/b1", "io.container.manager=libpod"])
    write_state(flat, cid(2), DEAD_PID, crun=True)  # no config.json beside it: no owner to tell
    write_state(flat, cid(3), DEAD_PID)
    runs: list[object] = []
    orphans = orphans_for(tmp_path, proc, runs)  # type: ignore[arg-type]
    discovery = Discovery(HIERARCHIES, {u.container_id: u for u in (podman, crun, plain)})
    from runc_guard.node.discovery import add_orphans

    add_orphans(discovery, orphans.scan(), NOW, 60, fs, MOUNTS)
    report = audit(discovery, fs, runtime_with(tmp_path, orphans), NOW, 60)
    left = {e["container_id"]: (e["verdict"], e["owner"]) for e in report.states_left_alone}
    assert left == {cid(1): ("foreign", "foreign:podman"), cid(2): ("owner_unknown", "unknown")}
    assert [o["container_id"] for o in report.orphaned_states] == [cid(3)]
    swept = sweeper(fs, runtime_with(tmp_path, orphans), Recorder(), min_age=60).run(discovery)
    assert [s.container_id for s, _ in runs] == [cid(3)]  # type: ignore[attr-defined]
    assert (flat / cid(1)).exists() and (flat / cid(2)).exists() and not (flat / cid(3)).exists()
    assert all(d in fs.dirs for d in podman.dirs + crun.dirs)
    assert swept.kept == {"runtime_state": 2}


def test_left_alone_state_is_listed_but_not_a_problem(tmp_path: Path, proc: str, fs: AgedFs) -> None:
    """Another manager's state is visible in the audit, and is not a leak for Node Problem Detector."""
    write_state(tmp_path / "flat", cid(1), DEAD_PID, labels=["io.container.manager=cri-o"])
    orphans = orphans_for(tmp_path, proc)
    discovery = Discovery(HIERARCHIES, {})
    from runc_guard.node.discovery import add_orphans

    add_orphans(discovery, orphans.scan(), NOW, 60, fs, MOUNTS)
    report = audit(discovery, fs, runtime_with(tmp_path, orphans), NOW, 60)
    assert report.state_verdicts == {"foreign": 1}
    assert judge(report, 0, 1800) == NPD_OK


def test_default_roots_judge_only_containerds() -> None:
    """runtime_dirs: containerd's root is judged; the flat defaults only keep; --orphan-root adds one."""
    from runc_guard.node.host import Where, runtime_dirs
    from runc_guard.node.orphans import DEFAULT_FLAT_ROOTS
    from runc_guard.settings import load

    settings = load({})
    where = Where("/sys/fs/cgroup", ("kubepods",), "/run/containerd/runc", "/b", DEFAULT_FLAT_ROOTS, True, 60)
    runtime = runtime_dirs(settings, where)
    assert runtime.state_roots == DEFAULT_FLAT_ROOTS
    assert runtime.orphans is not None
    assert (runtime.orphans.roots, runtime.orphans.named_roots) == (("/run/containerd/runc",), ())
    named = Where("/sys/fs/cgroup", ("kubepods",), "/r", "/b", (), True, 60, ("/run/runc",))
    assert runtime_dirs(settings, named).orphans.named_roots == ("/run/runc",)  # type: ignore[union-attr]


# -- the PID namespace ----------------------------------------------------------------------------


def ns_proc(
    tmp_path: Path, self_pid: int | str, containerd_shares: bool | None, same_root: bool = True
) -> str:
    """A /proc whose ``self`` names ``self_pid``, with our ns file and maybe a containerd process
    (in our PID namespace or not; with our root directory or another)."""
    root = tmp_path / "proc"
    (root / "ns").mkdir(parents=True)
    (root / "ns" / "ours").write_text("")
    (root / "ns" / "other").write_text("")
    (tmp_path / "our-root").mkdir()
    (tmp_path / "other-root").mkdir()
    os.symlink(str(self_pid), root / "self")
    me = root / str(self_pid)
    (me / "ns").mkdir(parents=True)
    os.link(root / "ns" / "ours", me / "ns" / "pid")  # same inode: same namespace
    os.symlink(tmp_path / "our-root", me / "root")
    if containerd_shares is not None:
        other = root / "4242"
        (other / "ns").mkdir(parents=True)
        (other / "comm").write_text("containerd\n")
        os.link(root / "ns" / ("ours" if containerd_shares else "other"), other / "ns" / "pid")
        os.symlink(tmp_path / ("our-root" if same_root else "other-root"), other / "root")
    return str(root)


def test_pid_namespace_view_from_a_fake_proc(tmp_path: Path) -> None:
    """/proc of another namespace is foreign; without containerd beside us too; with it, trusted."""
    assert pidns.pid_namespace_view(ns_proc(tmp_path / "a", 7, True), pid=99).verdict == "foreign"
    assert pidns.pid_namespace_view(ns_proc(tmp_path / "b", 99, None), pid=99).verdict == "foreign"
    assert pidns.pid_namespace_view(ns_proc(tmp_path / "c", 99, False), pid=99).verdict == "foreign"
    shared = pidns.pid_namespace_view(ns_proc(tmp_path / "d", 99, True), pid=99)
    assert shared.trusted and "containerd runs in it" in shared.reason
    # A containerd of its own (Docker-in-Docker in a pod without hostPID): its name proves nothing.
    dind = pidns.pid_namespace_view(ns_proc(tmp_path / "e", 99, True, same_root=False), pid=99)
    assert dind.verdict == "foreign" and not dind.trusted
    missing = pidns.pid_namespace_view(str(tmp_path / "nothing"), pid=99)
    assert missing.verdict == "unknown" and not missing.trusted


def test_pid_namespace_view_of_this_process() -> None:
    """The real /proc: trusted exactly when we are in the initial PID namespace (or beside containerd)."""
    view = pidns.pid_namespace_view()
    if os.stat("/proc/self/ns/pid").st_ino == pidns.PROC_PID_INIT_INO:
        assert view.trusted and view.reason == "the initial PID namespace"
    else:
        assert view.verdict in ("host", "foreign")


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket standing in for journald."""
    path = str(tmp_path / "journal.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    monkeypatch.setenv("RUNC_GUARD_JOURNAL_SOCKET", path)
    yield sock
    sock.close()


def test_refusal_raises_exit_77_and_logs(tmp_path: Path, journal: socket.socket) -> None:
    """sweep/audit from a foreign namespace: ForeignPidNamespace (77) and an error entry in the journal."""
    from runc_guard.node.host import require_host_pid_namespace

    proc = ns_proc(tmp_path, 1, None)  # /proc/self is "1", we are not
    with pytest.raises(ForeignPidNamespace) as caught:
        require_host_pid_namespace("sweep", proc)
    assert caught.value.exit_code == 77
    assert "sweep refused" in str(caught.value) and "hostPID" in str(caught.value)
    entry = journal.recv(65536).decode()
    assert "EVENT=sweep_refused" in entry and "PRIORITY=3" in entry


# -- the scope of a container the sweep finished ------------------------------------------------------


class FakeScopes:
    """Records settle() calls; answers with ``outcome``; ``reachable`` is what the test says."""

    def __init__(
        self, outcome: str = systemd_scope.RESET_FAILED, reachable: bool = True, booted: bool = True
    ) -> None:
        self.outcome = outcome
        self.is_reachable = reachable
        self.booted = booted
        self.settled: list[str] = []
        self.read: list[tuple[str, str]] = []

    def ops(self) -> ScopeOps:
        return ScopeOps(lambda: self.is_reachable, self.read_scope, self.settle, lambda: self.booted)

    def read_scope(self, root: str, container_id: str) -> systemd_scope.ScopeRef | None:
        self.read.append((root, container_id))
        return None

    def settle(self, unit: str, empty: object, deadline: float) -> systemd_scope.ScopeResult:
        self.settled.append(unit)
        detail = "deadline passed" if self.outcome == systemd_scope.STILL_BUSY else ""
        return systemd_scope.ScopeResult(unit, self.outcome, detail)


def scope_unit(fs: AgedFs, n: int) -> ContainerUnit:
    """A systemd-driver container: one ``cri-containerd-<id>.scope`` directory per hierarchy."""
    unit = ContainerUnit(cid(n), pod=POD)
    for h in HIERARCHIES:
        path = f"{h.mount}/{POD}/cri-containerd-{cid(n)}.scope"
        fs.add(path)
        unit.dirs.append(path)
    return unit


def test_scope_units_named_by_state_or_directory() -> None:
    """The state's unit and any directory named like the container's scope; bare ids name none."""
    dirs = [f"/cg/memory/{POD}/cri-containerd-{cid(1)}.scope", f"/cg/pids/{cid(1)}"]
    unit = ContainerUnit(cid(1), dirs=dirs)
    ref = systemd_scope.ScopeRef(f"docker-{cid(1)}.scope", "", True)
    assert scope_units(unit, [ref, None]) == [f"cri-containerd-{cid(1)}.scope", f"docker-{cid(1)}.scope"]
    assert scope_units(ContainerUnit(cid(2), dirs=[f"/cg/pids/{cid(2)}"]), [None]) == []


@pytest.mark.parametrize(
    ("outcome", "reachable", "action", "error"),
    [
        (systemd_scope.RESET_FAILED, True, "scope_reset_failed", False),
        (systemd_scope.NOT_LOADED, True, "scope_not_loaded", False),
        (systemd_scope.STILL_BUSY, True, "error", True),
        (systemd_scope.ERROR, True, "error", True),
        (systemd_scope.RESET_FAILED, False, "error", True),
    ],
)
def test_sweep_finishes_the_scope_of_each_container_it_removed(
    fs: AgedFs, outcome: str, reachable: bool, action: str, error: bool
) -> None:
    """After removing a systemd container's dirs the sweep settles its scope; failures are errors."""
    scopes = FakeScopes(outcome, reachable)
    scoped, bare = scope_unit(fs, 1), add_unit(fs, 2)
    runtime = RuntimeDirs("/absent/runc", "/absent/bundles")
    swept = sweeper(fs, runtime, Recorder(), min_age=60)
    swept.scopes = scopes.ops()
    report = swept.run(Discovery(HIERARCHIES, {cid(1): scoped, cid(2): bare}))
    assert report.removed == 2
    assert scopes.settled == ([f"cri-containerd-{cid(1)}.scope"] if reachable else [])
    entries = [e for e in report.containers if e.get("unit")]
    assert [(e["id"], e["action"]) for e in entries] == [(cid(1), action)]
    assert bool(report.errors) == error
    if not reachable:
        assert "PID 1 is systemd but it is not reachable" in report.errors[0]


def test_a_node_without_systemd_has_no_scope_to_finish(fs: AgedFs) -> None:
    """PID 1 is not systemd: a directory named like a scope is just a directory; no error, no call."""
    scopes = FakeScopes(reachable=False, booted=False)
    swept = sweeper(fs, RuntimeDirs("/absent/runc", "/absent/bundles"), Recorder(), min_age=60)
    swept.scopes = scopes.ops()
    report = swept.run(Discovery(HIERARCHIES, {cid(1): scope_unit(fs, 1)}))
    assert report.removed == 1 and report.errors == [] and scopes.settled == []
    assert [e["action"] for e in report.containers] == ["removed"]


def test_dry_run_and_kept_units_settle_no_scope(fs: AgedFs) -> None:
    """A dry run and a unit the sweep keeps (populated) never reach systemd."""
    scopes = FakeScopes()
    unit = scope_unit(fs, 1)
    fs.dirs[unit.dirs[0]] = [901]
    fs.alive.add(901)
    runtime = RuntimeDirs("/absent/runc", "/absent/bundles")
    for dry_run in (True, False):
        swept = sweeper(fs, runtime, Recorder(), min_age=60, dry_run=dry_run)
        swept.scopes = scopes.ops()
        swept.run(Discovery(HIERARCHIES, {cid(1): unit}))
    assert scopes.settled == []


@pytest.fixture
def fs(clock) -> AgedFs:  # type: ignore[no-untyped-def]
    return AgedFs(clock)


@pytest.fixture
def proc(tmp_path: Path) -> str:
    """test_orphans' fake /proc: a live init, a zombie, a recycled pid and one shim."""
    return fake_proc(tmp_path)


# -- doctor: the kernel's features ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("since", "release", "expected"),
    [
        ("5.3", "5.4.0-150-generic", True),
        ("5.14", "5.4.0", False),
        ("5.14 (cgroup v2 only)", "6.1.0-18-amd64", True),
        ("4.20 (CONFIG_PSI, not psi=0)", "4.19.0", False),
        ("5.3", "weird", None),
    ],
)
def test_kernel_at_least(since: str, release: str, expected: bool | None) -> None:
    """uname -r against the feature's first version."""
    from runc_guard.node.doctor import kernel_at_least

    assert kernel_at_least(since, release) is expected


def test_kernel_report_without_cgroup2_or_psi(tmp_path: Path) -> None:
    """No cgroup2 mounted: its files are missing, each with what degrades; PSI absent likewise."""
    from runc_guard.node.doctor import kernel_report

    features, warnings = kernel_report({"/sys/fs/cgroup/memory": "cgroup"}, str(tmp_path / "no-pressure"))
    present = {f["name"]: f["present"] for f in features}
    assert present["cgroup.events"] is False and present["cgroup.kill"] is False
    assert present["PSI"] is False
    assert present["pidfd_open"] is True  # this kernel (>= 5.3) has it
    assert any(w.startswith("kernel: cgroup.events missing") and "polled" in w for w in warnings)
    assert json.dumps(features)  # the JSON report carries it


def test_kernel_report_reads_a_cgroup2_child(tmp_path: Path) -> None:
    """cgroup.events/kill/stat are told by a non-root cgroup2 directory's files."""
    from runc_guard.node.doctor import kernel_report

    child = tmp_path / "cg2" / "system.slice"
    child.mkdir(parents=True)
    (child / "cgroup.events").write_text("populated 0\n")
    (tmp_path / "pressure").mkdir()
    (tmp_path / "pressure" / "cpu").write_text("")
    features, warnings = kernel_report({str(tmp_path / "cg2"): "cgroup2"}, str(tmp_path / "pressure"))
    present = {f["name"]: f["present"] for f in features}
    assert (present["cgroup.events"], present["cgroup.kill"], present["PSI"]) == (True, False, True)
    assert [w.split(":")[1].strip().split()[0] for w in warnings] == ["cgroup.kill", "cgroup.stat", "memcg"]


@pytest.mark.parametrize(
    ("layout", "expected"),
    [("v1", True), ("v2-with", True), ("v2-without", False), ("none", False)],
)
def test_kernel_report_tells_whether_memory_cgroups_can_be_reclaimed(
    tmp_path: Path, layout: str, expected: bool
) -> None:
    """v1's memory.force_empty, or v2's memory.reclaim in a child with the memory controller (5.19+);
    without either, doctor says what stays as it is (issue 32)."""
    from runc_guard.node.doctor import kernel_report

    mounts: dict[str, str] = {}
    if layout == "v1":
        (tmp_path / "memory").mkdir()
        (tmp_path / "memory" / "memory.force_empty").write_text("")
        mounts[str(tmp_path / "memory")] = "cgroup"
    elif layout.startswith("v2"):
        child = tmp_path / "cg2" / "kubepods.slice"
        child.mkdir(parents=True)
        (tmp_path / "cg2" / "cgroup.controllers").write_text("cpu io memory pids\n")
        (child / "memory.current").write_text("0\n")
        if layout == "v2-with":
            (child / "memory.reclaim").write_text("")
        mounts[str(tmp_path / "cg2")] = "cgroup2"
    features, warnings = kernel_report(mounts, str(tmp_path / "pressure"), release="6.1.0")
    found = {f["name"]: f for f in features}["memcg reclaim"]
    assert found["present"] is expected, found
    assert any(w.startswith("kernel: memcg reclaim missing") for w in warnings) is not expected
