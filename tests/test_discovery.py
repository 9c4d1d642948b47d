"""Finding container cgroups under kubepods and merging the shim's pending records."""

from __future__ import annotations

import pytest

from runc_guard.delete.paths import container_id_of
from runc_guard.delete.pending import PendingRecord, RecordRule, write_record
from runc_guard.errors import EXIT_NO_HIERARCHY, NoCgroupHierarchy
from runc_guard.node.discovery import (
    Discovery,
    Hierarchy,
    add_pending,
    check_kubepods_name,
    discover,
    discover_kubepods,
    hierarchies_below,
    pod_uid_of,
)
from tests.fakes import FakeCgroupFs

ID1 = "a" * 64
ID2 = "0123456789abcdef" * 4
ID3 = "f" * 63 + "0"
MOUNTS = {"/cg/memory": "cgroup", "/cg/pids": "cgroup", "/cg/unified": "cgroup2"}
HIERARCHIES = [Hierarchy(m, t) for m, t in sorted(MOUNTS.items())]


def make_dirs(fs: FakeCgroupFs, *paths: str) -> None:
    """Add ``paths`` and every parent below the mount, as a real mkdir -p would."""
    for path in paths:
        parts = path.strip("/").split("/")
        for i in range(3, len(parts) + 1):
            current = "/" + "/".join(parts[:i])
            if current not in fs.dirs:
                fs.add(current)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (ID1, ID1),
        (f"cri-containerd-{ID1}.scope", ID1),
        (f"docker-{ID2}.scope", ID2),
        (f"crio-{ID2}.scope", ID2),
        (f"crio-conmon-{ID2}.scope", None),
        (ID1.upper(), None),
        (ID1[:-1], None),
        (ID1 + "0", None),
        (f"cri-containerd-{ID1}", None),
        (f"cri-containerd-{ID1}.slice", None),
        ("pod" + ID1[:32], None),
        ("kubepods-burstable.slice", None),
        ("burstable", None),
        ("kubepods-burstable-pod1234_5678.slice", None),
    ],
)
def test_container_id_of(name: str, expected: str | None) -> None:
    """Only bare 64-hex ids and the three runtimes' scope names are container cgroups."""
    assert container_id_of(name) == expected


@pytest.mark.parametrize(
    ("pod", "uid"),
    [
        ("kubepods/burstable/pod1234abcd-0000-1111", "1234abcd-0000-1111"),
        ("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12ab_34cd_56ef.slice",
         "12ab-34cd-56ef"),
        ("kubepods/burstable", None),
    ],
)
def test_pod_uid_of(pod: str, uid: str | None) -> None:
    """Pod UIDs come out of both drivers' pod directory names, systemd's _ turned back into -."""
    assert pod_uid_of(pod) == uid


@pytest.mark.parametrize("name", ["kubepods", "kubepods.slice", "rgsweep-1/kubepods", "a/b/"])
def test_kubepods_name_accepted(name: str) -> None:
    """Plain relative paths are accepted (normalised)."""
    assert check_kubepods_name(name) == name.rstrip("/")


@pytest.mark.parametrize("name", ["", "/kubepods", "../kubepods", "a/../../b", "a/../b", "a//b"])
def test_kubepods_name_rejected(name: str) -> None:
    """Absolute, escaping or unnormalised names are refused before any walk."""
    with pytest.raises(ValueError, match="not a relative path"):
        check_kubepods_name(name)


def test_hierarchies_below_filters_by_root() -> None:
    """Only mounts at or below the root count; a sibling with a common prefix does not."""
    mounts = {**MOUNTS, "/cgx/memory": "cgroup", "/cg": "cgroup2"}
    found = hierarchies_below("/cg", mounts)
    assert [h.mount for h in found] == ["/cg", "/cg/memory", "/cg/pids", "/cg/unified"]


def test_no_hierarchy_is_an_error_with_its_exit_code() -> None:
    """Nothing mounted below the root: NoCgroupHierarchy, exit 66."""
    with pytest.raises(NoCgroupHierarchy) as info:
        hierarchies_below("/nowhere", MOUNTS)
    assert info.value.exit_code == EXIT_NO_HIERARCHY == 66


def test_one_unit_per_container_across_hierarchies(fake_fs: FakeCgroupFs) -> None:
    """The same id in three hierarchies and both drivers is one unit with one dir per hierarchy."""
    make_dirs(
        fake_fs,
        f"/cg/memory/kubepods/burstable/pod11111111/{ID1}",
        f"/cg/pids/kubepods/burstable/pod11111111/{ID1}",
        f"/cg/unified/kubepods/burstable/pod11111111/{ID1}",
        f"/cg/memory/kubepods.slice/kubepods-pod22222222.slice/cri-containerd-{ID2}.scope",
        f"/cg/unified/kubepods.slice/kubepods-pod22222222.slice/cri-containerd-{ID2}.scope",
    )
    units = discover_kubepods(HIERARCHIES, ["kubepods", "kubepods.slice"], fake_fs)
    assert sorted(units) == sorted([ID1, ID2])
    assert units[ID1].dirs == [
        f"/cg/{h}/kubepods/burstable/pod11111111/{ID1}" for h in ("memory", "pids", "unified")
    ]
    assert units[ID1].pod == "kubepods/burstable/pod11111111"
    assert units[ID2].pod == "kubepods.slice/kubepods-pod22222222.slice"
    assert len(units[ID2].dirs) == 2


def test_pod_and_qos_levels_and_other_names_are_never_units(fake_fs: FakeCgroupFs) -> None:
    """Pod, QoS and odd directories are walked through but never collected."""
    make_dirs(
        fake_fs,
        "/cg/memory/kubepods/burstable/pod11111111/not-a-container",
        f"/cg/memory/kubepods/burstable/pod11111111/crio-conmon-{ID1}.scope",
        "/cg/memory/kubepods/besteffort",
        f"/cg/memory/kubepods/pod33333333/{ID3}",
    )
    units = discover_kubepods(HIERARCHIES, ["kubepods"], fake_fs)
    assert list(units) == [ID3]
    assert units[ID3].pod == "kubepods/pod33333333"


def test_walk_does_not_enter_container_dirs(fake_fs: FakeCgroupFs) -> None:
    """A container-looking child inside a container cgroup belongs to that unit, not a new one."""
    make_dirs(fake_fs, f"/cg/memory/kubepods/burstable/pod11111111/{ID1}/{ID2}")
    units = discover_kubepods(HIERARCHIES, ["kubepods"], fake_fs)
    assert list(units) == [ID1]


def test_only_named_kubepods_trees_are_walked(fake_fs: FakeCgroupFs) -> None:
    """Containers outside the kubepods trees (system.slice, other roots) are not found."""
    make_dirs(
        fake_fs,
        f"/cg/memory/system.slice/docker-{ID1}.scope",
        f"/cg/memory/rgsweep-x/kubepods/burstable/pod11111111/{ID2}",
    )
    assert discover_kubepods(HIERARCHIES, ["kubepods", "kubepods.slice"], fake_fs) == {}
    assert list(discover_kubepods(HIERARCHIES, ["rgsweep-x/kubepods"], fake_fs)) == [ID2]


def test_symlinked_kubepods_top_is_skipped(fake_fs: FakeCgroupFs) -> None:
    """A kubepods that is a symlink is not followed."""
    make_dirs(fake_fs, f"/cg/memory/kubepods/burstable/pod11111111/{ID1}")
    fake_fs.symlinks.add("/cg/memory/kubepods")
    assert discover_kubepods(HIERARCHIES, ["kubepods"], fake_fs) == {}


def test_depth_is_bounded(fake_fs: FakeCgroupFs) -> None:
    """A container buried deeper than MAX_DEPTH levels below kubepods is not collected."""
    make_dirs(fake_fs, "/cg/memory/kubepods/" + "x/" * 7 + ID1)
    make_dirs(fake_fs, "/cg/memory/kubepods/" + "y/" * 6 + ID2)
    assert list(discover_kubepods(HIERARCHIES, ["kubepods"], fake_fs)) == [ID2]


def _record(cid: str, paths: list[str], created: float = 1000.0) -> PendingRecord:
    return PendingRecord(cid, "/run/containerd/runc/k8s.io", paths, 4242, 1, "/usr/sbin/runc", created)


def test_pending_record_joins_its_unit(fake_fs: FakeCgroupFs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A record for a discovered container adds its record file and runtime root, paths merged."""
    path = f"/cg/memory/kubepods/burstable/pod11111111/{ID1}"
    make_dirs(fake_fs, path, f"/cg/pids/kubepods/x/{ID1}")
    record_file = write_record(str(tmp_path), _record(ID1, [path, f"/cg/pids/kubepods/x/{ID1}"]))
    discovery = Discovery(HIERARCHIES, discover_kubepods(HIERARCHIES, ["kubepods"], fake_fs))
    add_pending(discovery, str(tmp_path), RecordRule(fake_fs, MOUNTS, ["/usr/sbin/runc"]))
    unit = discovery.units[ID1]
    assert unit.record == record_file
    assert unit.runtime_root == "/run/containerd/runc/k8s.io"
    assert unit.dirs == sorted([path, f"/cg/pids/kubepods/x/{ID1}"])
    assert unit.unsafe is None
    assert discovery.records == {record_file: (ID1, 1000.0)}


def test_pending_record_outside_kubepods_is_its_own_unit(fake_fs: FakeCgroupFs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A record for a container outside kubepods becomes a unit whose pod is its parent path."""
    make_dirs(fake_fs, "/cg/memory/default/ctr1")
    write_record(str(tmp_path), _record("ctr1", ["/cg/memory/default/ctr1"]))
    discovery = discover("/cg", ["kubepods"], str(tmp_path), fake_fs, MOUNTS)
    assert discovery.units["ctr1"].pod == "default"
    assert discovery.units["ctr1"].dirs == ["/cg/memory/default/ctr1"]


@pytest.mark.parametrize(
    ("paths", "why"),
    [
        (["/etc/ctr1"], "not below any cgroup mount"),
        (["/cg/memory/kubepods/burstable/pod11111111"], "pod, QoS or slice level"),
        (["/cg/memory/system.slice"], "pod, QoS or slice level"),
        (["/cg/memory/ctr2"], "not named after container ctr1"),
        (["/cg/memory/../../etc/ctr1"], "not a normalised path"),
    ],
)
def test_unsafe_pending_record_marks_unit(
    fake_fs: FakeCgroupFs, tmp_path, paths: list[str], why: str  # type: ignore[no-untyped-def]
) -> None:
    """A record naming anything but its container's cgroups makes the unit unsafe (kept) and is reported."""
    make_dirs(fake_fs, "/cg/memory/system.slice", "/cg/memory/kubepods/burstable/pod11111111")
    record_file = write_record(str(tmp_path), _record("ctr1", paths))
    discovery = discover("/cg", ["kubepods"], str(tmp_path), fake_fs, MOUNTS)
    assert why in discovery.record_errors[record_file]
    assert discovery.units["ctr1"].unsafe is not None
    assert why in discovery.units["ctr1"].unsafe


def test_malformed_record_is_reported_not_used(fake_fs: FakeCgroupFs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A file that is not a record is listed as an error and creates no unit."""
    (tmp_path / "junk@0.json").write_text("{not json")
    discovery = discover("/cg", ["kubepods"], str(tmp_path), fake_fs, MOUNTS)
    assert discovery.units == {}
    assert list(discovery.record_errors) == [str(tmp_path / "junk@0.json")]


def test_missing_pending_dir_is_fine(fake_fs: FakeCgroupFs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """No pending directory yet (fresh node) means no records, not an error."""
    discovery = discover("/cg", ["kubepods"], str(tmp_path / "absent"), fake_fs, MOUNTS)
    assert (discovery.units, discovery.record_errors) == ({}, {})
