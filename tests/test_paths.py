"""Path safety: tampered paths are refused; paths not provably the container's make it step aside."""

from __future__ import annotations

import os

import pytest

from runc_guard.delete.cgroupfs import RealCgroupFs
from runc_guard.delete.paths import (
    CREATED_MARGIN,
    check_container_paths,
    check_path,
    crun_leaf_scope,
    names_container,
    ownership_problem,
)
from runc_guard.delete.state import KIND_CRUN, KIND_RUNC, ContainerState
from runc_guard.errors import EXIT_UNSAFE_STATE, UnsafeCgroupPath
from tests.fakes import FakeCgroupFs

MOUNTS = {
    "/sys/fs/cgroup/memory": "cgroup",
    "/sys/fs/cgroup/pids": "cgroup",
    "/sys/fs/cgroup/unified": "cgroup2",
}


@pytest.fixture(autouse=True)
def mount_points(fake_fs: FakeCgroupFs) -> None:
    """Mount points always exist, as on a real node."""
    for mount in MOUNTS:
        fake_fs.add(mount)


def state(paths: dict[str, str], cgroups_path: str = "") -> ContainerState:
    return ContainerState("c1", paths, 1, 1, cgroups_path)


def test_accepts_consistent_container_paths(fake_fs: FakeCgroupFs) -> None:
    """The same relative cgroup in every hierarchy, matching cgroupsPath, is the container's own."""
    paths = {"memory": "/sys/fs/cgroup/memory/k/c1", "": "/sys/fs/cgroup/unified/k/c1"}
    fake_fs.add("/sys/fs/cgroup/memory/k/c1")  # the v2 container dir is already gone
    own = check_container_paths(state(paths, "/k/c1"), fake_fs, MOUNTS)
    assert own.paths == sorted(paths.values()) and own.step_aside is None


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("relative/c1", "not an absolute path"),
        ("/sys/fs/cgroup/memory/k/../../etc", "normalised"),
        ("/sys/fs/cgroup/memory/k//c1", "normalised"),
        ("/sys/fs/cgroup/memory/./c1", "normalised"),
        ("/etc/passwd", "not below any cgroup mount"),
        ("/sys/fs/cgroup/memory", "not below any cgroup mount"),
        ("/sys/fs/cgroup/memory/k/c1\0", "not an absolute path"),
    ],
)
def test_refuses_tampered_paths(fake_fs: FakeCgroupFs, path: str, needle: str) -> None:
    """Tampered paths raise UnsafeCgroupPath (exit 65) naming the reason."""
    with pytest.raises(UnsafeCgroupPath, match=needle) as info:
        check_path(path, fake_fs, MOUNTS)
    assert info.value.exit_code == EXIT_UNSAFE_STATE == 65


def test_refuses_symlink_component(fake_fs: FakeCgroupFs) -> None:
    """A symlink anywhere in the path is refused, never followed."""
    fake_fs.add("/sys/fs/cgroup/memory/k/c1")
    fake_fs.symlinks.add("/sys/fs/cgroup/memory/k")
    with pytest.raises(UnsafeCgroupPath, match="symlink"):
        check_path("/sys/fs/cgroup/memory/k/c1", fake_fs, MOUNTS)


def test_refuses_wrong_filesystem_magic(fake_fs: FakeCgroupFs) -> None:
    """A path under a 'cgroup' mount whose statfs magic is not cgroup's is refused."""
    fake_fs.add("/sys/fs/cgroup/memory/k/c1")
    fake_fs.magic["/sys/fs/cgroup/memory"] = 0x01021994  # tmpfs
    with pytest.raises(UnsafeCgroupPath, match="statfs magic 0x1021994"):
        check_path("/sys/fs/cgroup/memory/k/c1", fake_fs, MOUNTS)


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("/sys/fs/cgroup/memory/kubepods", "pod, QoS or slice"),
        ("/sys/fs/cgroup/memory/kubepods/burstable", "pod, QoS or slice"),
        ("/sys/fs/cgroup/memory/kubepods/burstable/pod0f3c7b9a-1111-2222-3333-444455556666", "pod, QoS"),
        ("/sys/fs/cgroup/memory/kubepods.slice/kubepods-burstable.slice", "pod, QoS or slice"),
        ("/sys/fs/cgroup/memory/system.slice", "pod, QoS or slice"),
        ("/sys/fs/cgroup/memory/user.slice", "pod, QoS or slice"),
        ("/sys/fs/cgroup/memory/system.slice/containerd.service", "not named after container c1"),
        ("/sys/fs/cgroup/memory/init.scope", "not named after container c1"),
        ("/sys/fs/cgroup/memory/k/c2", "not named after container c1"),
        ("/sys/fs/cgroup/memory/k/c1x", "not named after container c1"),
        ("/sys/fs/cgroup/memory/k/-c1.scope", "not named after container c1"),
    ],
)
def test_steps_aside_for_cgroups_not_named_after_the_container(
    fake_fs: FakeCgroupFs, path: str, needle: str
) -> None:
    """Levels owned by kubelet or systemd, and other names, are legitimate but not ours: step aside."""
    own = check_container_paths(state({"memory": path}), fake_fs, MOUNTS)
    assert own.paths == [path]
    assert own.step_aside is not None and needle in own.step_aside


@pytest.mark.parametrize(
    "name", ["c1", "cri-containerd-c1.scope", "docker-c1.scope", "crio-c1.scope", "libpod-c1.scope"]
)
def test_container_names(name: str) -> None:
    """The id itself and ``<prefix>-<id>.scope`` of the systemd driver name the container."""
    assert names_container(name, "c1")


def test_configured_pattern_names_the_container() -> None:
    """An operator's pattern with {id} extends what names a container; nothing else does."""
    assert not names_container("ctr_c1_x", "c1")
    assert names_container("ctr_c1_x", "c1", ["ctr_{id}_*"])
    assert not names_container("ctr_c2_x", "c1", ["ctr_{id}_*"])


def test_differing_hierarchies_without_cgroups_path_are_the_containers(fake_fs: FakeCgroupFs) -> None:
    """No cgroupsPath: runc nests the container under its caller's cgroup, which may differ
    per hierarchy. Every leaf still names the container, so it is its own (was exit 65)."""
    paths = {"memory": "/sys/fs/cgroup/memory/user.slice/c1", "pids": "/sys/fs/cgroup/pids/sess/c1"}
    own = check_container_paths(state(paths), fake_fs, MOUNTS)
    assert own.step_aside is None and own.paths == sorted(paths.values())


def test_paths_not_matching_cgroups_path_step_aside(fake_fs: FakeCgroupFs) -> None:
    """Paths that are not the configured cgroupsPath: not provably ours, the runtime acts alone."""
    paths = {"memory": "/sys/fs/cgroup/memory/k/c1"}
    own = check_container_paths(state(paths, "/k/other/c1"), fake_fs, MOUNTS)
    assert own.step_aside is not None and "cgroupsPath" in own.step_aside


def test_cgroup_older_than_the_container_steps_aside(fake_fs: FakeCgroupFs) -> None:
    """A directory that existed before the container's init started was not made for it."""
    started = fake_fs.clock.now
    fake_fs.add("/sys/fs/cgroup/memory/k/c1", mtime=started - CREATED_MARGIN - 5)
    own = check_container_paths(state({"memory": "/sys/fs/cgroup/memory/k/c1"}), fake_fs, MOUNTS, started)
    assert own.step_aside is not None and "existed before" in own.step_aside
    fake_fs.mtimes["/sys/fs/cgroup/memory/k/c1"] = started - CREATED_MARGIN / 2
    own = check_container_paths(state({"memory": "/sys/fs/cgroup/memory/k/c1"}), fake_fs, MOUNTS, started)
    assert own.step_aside is None


@pytest.mark.kernel
def test_real_tmpfs_is_not_a_cgroup(tmp_path: object) -> None:
    """On the real kernel: a tmp dir passed off as a cgroup mount fails the statfs check."""
    fake_mount = str(tmp_path)
    target = f"{fake_mount}/k/c1"
    os.makedirs(target)
    with pytest.raises(UnsafeCgroupPath, match="not on a cgroup filesystem"):
        check_path(target, RealCgroupFs(), {fake_mount: "cgroup"})


@pytest.mark.kernel
def test_real_cgroup_mounts_pass() -> None:
    """On the real kernel: a (missing) container path under a real cgroup mount passes."""
    from runc_guard.delete.cgroupfs import cgroup_mounts

    mounts = cgroup_mounts()
    mount = sorted(mounts)[0]
    assert check_path(f"{mount}/rgtest-absent/c1", RealCgroupFs(), mounts) == "/rgtest-absent/c1"


def test_a_cgroup_gone_before_its_statfs_is_answered_for_by_its_parent(fake_fs: FakeCgroupFs) -> None:
    """The walk saw the directory, then a concurrent delete removed it before its statfs (ENOENT):
    not tampering; the parent, checked by the walk, answers. Any other statfs error still refuses."""
    import errno

    path = "/sys/fs/cgroup/memory/k/c1"
    fake_fs.add(path)
    real = fake_fs.fs_magic

    def removed_meanwhile(probe: str) -> int:
        if probe == path:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", probe)
        return real(probe)

    fake_fs.fs_magic = removed_meanwhile  # type: ignore[method-assign]
    assert check_path(path, fake_fs, MOUNTS) == "/k/c1"

    def denied(probe: str) -> int:
        raise PermissionError(errno.EACCES, "Permission denied", probe)

    fake_fs.fs_magic = denied  # type: ignore[method-assign]
    with pytest.raises(UnsafeCgroupPath, match="statfs failed"):
        check_path(path, fake_fs, MOUNTS)


# -- crun's systemd driver: ``<prefix>-<id>.scope/container`` -------------------------------

CID = "c1"
V2 = "/sys/fs/cgroup/unified"
POD = f"{V2}/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f3c7b9a_11.slice"
SCOPE = f"{POD}/cri-containerd-{CID}.scope"
LEAF = f"{SCOPE}/container"
UNIT = f"cri-containerd-{CID}"


def crun_state(leaf: str = LEAF, unit: str = UNIT, systemd: bool = True) -> ContainerState:
    """crun's status as parse_crun_status reads it: one relative cgroup-path, its ``scope`` unit."""
    return ContainerState(CID, {V2: leaf}, 1, 1, leaf[len(V2):], systemd_name=unit, systemd=systemd,
                          kind=KIND_CRUN)  # fmt: skip


def crun_dirs(fake_fs: FakeCgroupFs, *extra: str, mtime: float | None = None) -> None:
    for path in (POD, SCOPE, LEAF, *extra):
        fake_fs.add(path, mtime=mtime)


def test_crun_systemd_leaf_and_its_scope_are_the_containers(fake_fs: FakeCgroupFs) -> None:
    """crun's systemd leaf ``<prefix>-<id>.scope/container``: the leaf and then its scope (leaf first)."""
    crun_dirs(fake_fs)
    own = check_container_paths(crun_state(), fake_fs, MOUNTS, fake_fs.clock.now)
    assert (own.paths, own.step_aside) == ([LEAF, SCOPE], None)


def test_crun_systemd_leaf_already_removed_still_names_its_scope(fake_fs: FakeCgroupFs) -> None:
    """The leaf gone (crun's earlier delete, systemd), the scope left: both still listed, nothing refused."""
    fake_fs.add(POD)
    fake_fs.add(SCOPE)
    own = check_container_paths(crun_state(), fake_fs, MOUNTS)
    assert (own.paths, own.step_aside) == ([LEAF, SCOPE], None)


@pytest.mark.parametrize(
    ("leaf", "unit", "systemd", "kind", "needle"),
    [
        # a tampered status naming someone else's unit + container
        (f"{V2}/system.slice/sshd.service/container", UNIT, True, KIND_CRUN, "not named"),
        (f"{V2}/system.slice/container", UNIT, True, KIND_CRUN, "not named"),
        # a scope named after another container, or after none
        (f"{POD}/cri-containerd-c2.scope/container", UNIT, True, KIND_CRUN, "not named"),
        (f"{POD}/cri-containerd-{CID}x.scope/container", UNIT, True, KIND_CRUN, "not named"),
        (f"{POD}/{CID}.scope/container", CID, True, KIND_CRUN, "not named"),
        (f"{POD}/-{CID}.scope/container", f"-{CID}", True, KIND_CRUN, "not named"),
        # another subgroup (run.oci.systemd.subgroup), or one level deeper
        (f"{SCOPE}/payload", UNIT, True, KIND_CRUN, "not named"),
        (f"{LEAF}/container", UNIT, True, KIND_CRUN, "not named"),
        # the status's unit is not the scope the cgroup-path is in
        (LEAF, "cri-containerd-c2", True, KIND_CRUN, "names unit 'cri-containerd-c2.scope'"),
        (LEAF, "", True, KIND_CRUN, "names unit 'none'"),
        # not crun's systemd driver: crun's cgroupfs driver, or runc's state naming that shape
        (LEAF, UNIT, False, KIND_CRUN, "not named"),
        (LEAF, UNIT, True, KIND_RUNC, "not named"),
    ],
)
def test_crun_shapes_that_are_not_the_containers_step_aside(
    fake_fs: FakeCgroupFs, leaf: str, unit: str, systemd: bool, kind: str, needle: str
) -> None:
    """Only exactly ``<prefix>-<own id>.scope/container`` of crun's systemd driver, with its status
    naming that scope, is the container's: every other shape stays refused (step aside)."""
    crun_dirs(fake_fs, os.path.dirname(leaf), leaf)
    state = crun_state(leaf, unit, systemd).replace(kind=kind)
    own = check_container_paths(state, fake_fs, MOUNTS)
    assert own.step_aside is not None and needle in own.step_aside, own
    assert own.paths[0] == leaf


def test_crun_scope_with_another_child_steps_aside(fake_fs: FakeCgroupFs) -> None:
    """Something beside crun's leaf in the scope: the scope is not the container's alone."""
    crun_dirs(fake_fs, f"{SCOPE}/other")
    own = check_container_paths(crun_state(), fake_fs, MOUNTS)
    assert own.step_aside is not None and f"holds {SCOPE}/other" in own.step_aside


def test_crun_leaf_with_children_steps_aside(fake_fs: FakeCgroupFs) -> None:
    """A ``container`` leaf with cgroups of its own (systemd inside the container, nested runtimes): not the
    layout crun's driver makes, so crun removes it alone."""
    crun_dirs(fake_fs, f"{LEAF}/init.scope")
    own = check_container_paths(crun_state(), fake_fs, MOUNTS)
    assert own.step_aside is not None and "has child cgroups" in own.step_aside


@pytest.mark.parametrize("older", [SCOPE, LEAF])
def test_crun_scope_or_leaf_older_than_the_container_steps_aside(fake_fs: FakeCgroupFs, older: str) -> None:
    """The created-after-init rule holds for both directories."""
    started = fake_fs.clock.now
    crun_dirs(fake_fs, mtime=started)
    fake_fs.mtimes[older] = started - CREATED_MARGIN - 5
    own = check_container_paths(crun_state(), fake_fs, MOUNTS, started)
    assert own.step_aside == f"{older} existed before the container was started (shared with something else)"


def test_crun_scope_at_a_mount_point_is_no_scope(fake_fs: FakeCgroupFs) -> None:
    """A hierarchy mounted at a directory named like a scope: its ``container`` child has no scope of ours."""
    mount = f"/sys/fs/cgroup/cri-containerd-{CID}.scope"
    fake_fs.add(mount)
    fake_fs.add(f"{mount}/container")
    state = ContainerState(CID, {mount: f"{mount}/container"}, 1, 1, "/container",
                           systemd_name=f"cri-containerd-{CID}", systemd=True, kind=KIND_CRUN)  # fmt: skip
    own = check_container_paths(state, fake_fs, {**MOUNTS, mount: "cgroup2"})
    assert own.paths == [f"{mount}/container"] and own.step_aside is not None


@pytest.mark.parametrize(
    ("path", "scope"),
    [
        (LEAF, SCOPE),
        (f"{POD}/crun-{CID}.scope/container", f"{POD}/crun-{CID}.scope"),
        (f"{SCOPE}/container2", None),
        (f"{POD}/cri-containerd-{CID}.slice/container", None),
        (f"{POD}/cri containerd-{CID}.scope/container", None),  # no unit name
        (SCOPE, None),
    ],
)
def test_crun_leaf_scope(path: str, scope: str | None) -> None:
    """The shape, alone: ``<prefix>-<id>.scope/container`` with a name systemd takes for a unit."""
    assert crun_leaf_scope(path, CID) == scope


def test_a_record_trusts_crun_s_leaf_only_beside_its_scope(fake_fs: FakeCgroupFs) -> None:
    """A pending record's ``<scope>/container`` is the container's only with its scope in the record too."""
    crun_dirs(fake_fs)
    assert ownership_problem(LEAF, CID, fake_fs, None, (), [LEAF, SCOPE]) is None
    assert ownership_problem(SCOPE, CID, fake_fs, None, (), [LEAF, SCOPE]) is None
    assert "not named after" in (ownership_problem(LEAF, CID, fake_fs, None, (), [LEAF]) or "")
    other = f"{POD}/cri-containerd-c2.scope"
    problem = ownership_problem(f"{other}/container", CID, fake_fs, None, (), [other])
    assert problem is not None and "not named after" in problem
