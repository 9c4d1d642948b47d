"""Path safety: only the container's own cgroups, on a real cgroup filesystem, are acted on."""

from __future__ import annotations

import pytest

from runc_guard.cgroupfs import RealCgroupFs
from runc_guard.errors import EXIT_UNSAFE_STATE, UnsafeCgroupPath
from runc_guard.paths import check_container_paths, check_path
from runc_guard.state import ContainerState
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
    """The same relative cgroup in every hierarchy, matching cgroupsPath, is accepted."""
    paths = {"memory": "/sys/fs/cgroup/memory/k/c1", "": "/sys/fs/cgroup/unified/k/c1"}
    fake_fs.add("/sys/fs/cgroup/memory/k/c1")  # the v2 container dir is already gone
    assert check_container_paths(state(paths, "/k/c1"), fake_fs, MOUNTS) == sorted(paths.values())


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("relative/c1", "not an absolute path"),
        ("/sys/fs/cgroup/memory/k/../../etc", "normalised"),
        ("/sys/fs/cgroup/memory/k//c1", "normalised"),
        ("/sys/fs/cgroup/memory/./c1", "normalised"),
        ("/etc/passwd", "not below any cgroup mount"),
        ("/sys/fs/cgroup/memory", "not below any cgroup mount"),
        ("/sys/fs/cgroup/memory/kubepods", "kubelet"),
        ("/sys/fs/cgroup/memory/kubepods/burstable", "kubelet"),
        ("/sys/fs/cgroup/memory/kubepods/burstable/pod0f3c7b9a-1111-2222-3333-444455556666", "kubelet"),
        ("/sys/fs/cgroup/memory/kubepods.slice/kubepods-burstable.slice", "kubelet"),
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


def test_refuses_disagreeing_hierarchies(fake_fs: FakeCgroupFs) -> None:
    """One hierarchy pointing elsewhere (e.g. at a sibling container) is refused."""
    paths = {"memory": "/sys/fs/cgroup/memory/k/c1", "pids": "/sys/fs/cgroup/pids/k/c2"}
    with pytest.raises(UnsafeCgroupPath, match="disagree"):
        check_container_paths(state(paths), fake_fs, MOUNTS)


def test_refuses_paths_not_matching_cgroups_path(fake_fs: FakeCgroupFs) -> None:
    """Paths that are not the configured cgroupsPath are refused."""
    with pytest.raises(UnsafeCgroupPath, match="cgroupsPath"):
        check_container_paths(state({"memory": "/sys/fs/cgroup/memory/k/c9"}, "/k/c1"), fake_fs, MOUNTS)


@pytest.mark.kernel
def test_real_tmpfs_is_not_a_cgroup(tmp_path: object) -> None:
    """On the real kernel: a tmp dir passed off as a cgroup mount fails the statfs check."""
    fake_mount = str(tmp_path)
    target = f"{fake_mount}/k/c1"
    import os

    os.makedirs(target)
    with pytest.raises(UnsafeCgroupPath, match="not on a cgroup filesystem"):
        check_path(target, RealCgroupFs(), {fake_mount: "cgroup"})


@pytest.mark.kernel
def test_real_cgroup_mounts_pass() -> None:
    """On the real kernel: a (missing) container path under a real cgroup mount passes."""
    from runc_guard.cgroupfs import cgroup_mounts

    mounts = cgroup_mounts()
    mount = sorted(mounts)[0]
    assert check_path(f"{mount}/rgtest-absent/c1", RealCgroupFs(), mounts) == "/rgtest-absent/c1"
