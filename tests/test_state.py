"""Reading runc's state.json: what we take from it, and every way it can be wrong."""

from __future__ import annotations

import json
import os

import pytest

from runc_guard.delete.state import MAX_STATE_BYTES, parse_crun_status, parse_state, read_state
from runc_guard.errors import StateUnreadable

GOOD = {
    "id": "c1",
    "init_process_pid": 4242,
    "init_process_start": 9918,
    "cgroup_paths": {
        "": "/sys/fs/cgroup/unified/k/c1",
        "memory": "/sys/fs/cgroup/memory/k/c1",
        "name=systemd": "/sys/fs/cgroup/systemd/k/c1",
        "rdma": "",
    },
    "config": {"cgroups": {"path": "/k/c1", "name": ""}},
}


def write_state(root: str, doc: object, cid: str = "c1") -> None:
    os.makedirs(os.path.join(root, cid), exist_ok=True)
    with open(os.path.join(root, cid, "state.json"), "w") as f:
        f.write(doc if isinstance(doc, str) else json.dumps(doc))


def test_reads_runc_state(tmp_path: os.PathLike[str]) -> None:
    """Every non-empty cgroup path (v1 incl. name=systemd, and v2 under ""), init pid and start."""
    write_state(str(tmp_path), GOOD)
    state = read_state(str(tmp_path), "c1")
    assert state.cgroup_paths == {k: v for k, v in GOOD["cgroup_paths"].items() if v}  # type: ignore[attr-defined]
    assert (state.init_pid, state.init_start, state.cgroups_path) == (4242, 9918, "/k/c1")


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "expected a JSON object"),
        ({**GOOD, "id": "other"}, "is not 'c1'"),
        ({**GOOD, "cgroup_paths": ["/x"]}, "cgroup_paths"),
        ({**GOOD, "cgroup_paths": {"memory": 3}}, "cgroup_paths"),
        ({**GOOD, "init_process_pid": "12"}, "init_process_pid"),
        ({**GOOD, "init_process_pid": True}, "init_process_pid"),
        ({**GOOD, "init_process_start": -1}, "init_process_start"),
        ("[" * 100000 + "]" * 100000, "not valid JSON"),
    ],
)
def test_corrupt_state_is_reported_not_raised_raw(
    tmp_path: os.PathLike[str], doc: object, needle: str
) -> None:
    """Corrupt or tampered documents raise StateUnreadable with a clear reason."""
    write_state(str(tmp_path), doc)
    with pytest.raises(StateUnreadable, match=needle):
        read_state(str(tmp_path), "c1")


def test_missing_state(tmp_path: os.PathLike[str]) -> None:
    """No state.json: StateUnreadable, and never the words containerd treats as success."""
    with pytest.raises(StateUnreadable) as info:
        read_state(str(tmp_path), "c1")
    assert "does not exist" not in str(info.value)


def test_symlinked_state_is_not_followed(tmp_path: os.PathLike[str]) -> None:
    """state.json that is a symlink is refused (O_NOFOLLOW)."""
    target = os.path.join(tmp_path, "elsewhere.json")
    with open(target, "w") as f:
        json.dump(GOOD, f)
    os.makedirs(os.path.join(tmp_path, "c1"))
    os.symlink(target, os.path.join(tmp_path, "c1", "state.json"))
    with pytest.raises(StateUnreadable, match="symlink"):
        read_state(str(tmp_path), "c1")


def test_huge_state_is_refused(tmp_path: os.PathLike[str]) -> None:
    """A state file past the size cap is refused without reading it all."""
    os.makedirs(os.path.join(tmp_path, "c1"))
    with open(os.path.join(tmp_path, "c1", "state.json"), "wb") as f:
        f.truncate(MAX_STATE_BYTES + 1)
    with pytest.raises(StateUnreadable, match="cap"):
        read_state(str(tmp_path), "c1")


def test_state_that_is_a_fifo_is_refused(tmp_path: os.PathLike[str]) -> None:
    """A FIFO in place of state.json does not block the delete."""
    os.makedirs(os.path.join(tmp_path, "c1"))
    os.mkfifo(os.path.join(tmp_path, "c1", "state.json"))
    with pytest.raises(StateUnreadable, match="not a regular file"):
        read_state(str(tmp_path), "c1")


def test_parse_state_ignores_unrelated_fields() -> None:
    """Fields runc-guard does not use may be anything."""
    doc = {**GOOD, "config": "whatever", "namespace_paths": None}
    assert parse_state(json.dumps(doc).encode(), "c1").cgroups_path == ""


CRUN = {"pid": 7311, "process-start-time": 209325, "cgroup-path": "/k/c1", "systemd-cgroup": False}
MOUNTS = {"/sys/fs/cgroup/memory": "cgroup", "/sys/fs/cgroup/pids": "cgroup"}


def test_reads_crun_status(tmp_path: os.PathLike[str]) -> None:
    """crun's <root>/<id>/status: its relative cgroup-path placed under every cgroup mount."""
    os.makedirs(os.path.join(tmp_path, "c1"))
    with open(os.path.join(tmp_path, "c1", "status"), "w") as f:
        json.dump(CRUN, f)
    state = read_state(str(tmp_path), "c1", lambda: MOUNTS)
    assert state.cgroup_paths == {m: m + "/k/c1" for m in MOUNTS}
    assert (state.init_pid, state.init_start, state.cgroups_path) == (7311, 209325, "/k/c1")


def test_runc_state_wins_over_crun_status(tmp_path: os.PathLike[str]) -> None:
    """With both files present, runc's state.json is what runc-guard reads."""
    write_state(str(tmp_path), GOOD)
    with open(os.path.join(tmp_path, "c1", "status"), "w") as f:
        json.dump(CRUN, f)
    assert read_state(str(tmp_path), "c1", lambda: MOUNTS).init_pid == 4242


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({**CRUN, "cgroup-path": "k/c1"}, "cgroup-path"),
        ({**CRUN, "cgroup-path": "/"}, "cgroup-path"),
        ({**CRUN, "cgroup-path": None}, "cgroup-path"),
        ({**CRUN, "pid": "1"}, "pid"),
        ({**CRUN, "process-start-time": -5}, "process-start-time"),
        ([], "JSON object"),
    ],
)
def test_bad_crun_status(doc: object, needle: str) -> None:
    """A corrupt crun status is StateUnreadable naming the field."""
    with pytest.raises(StateUnreadable, match=needle):
        parse_crun_status(json.dumps(doc).encode(), "c1", MOUNTS)


def test_crun_pid_namespace_and_annotations_from_its_config_copy(tmp_path: object) -> None:
    """crun keeps the OCI config.json beside its status: the PID namespace and the CRI
    annotations come from there (a host-PID pod's stragglers are then crun's, so ours, to kill)."""
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "c1"))
    with open(os.path.join(root, "c1", "status"), "w") as f:
        json.dump({"pid": 42, "process-start-time": 7, "cgroup-path": "/k/c1"}, f)
    config = {
        "linux": {"namespaces": [{"type": "pid", "path": "/proc/1/ns/pid"}, {"type": "mount"}]},
        "annotations": {"io.kubernetes.cri.sandbox-id": "sb"},
    }
    with open(os.path.join(root, "c1", "config.json"), "w") as f:
        json.dump(config, f)
    state = read_state(root, "c1", lambda: {"/sys/fs/cgroup/memory": "cgroup"})
    assert state.pid_namespace == "joined" and state.sandbox_id == "sb"
    config["linux"] = {"namespaces": [{"type": "pid"}]}
    with open(os.path.join(root, "c1", "config.json"), "w") as f:
        json.dump(config, f)
    assert read_state(root, "c1", lambda: {"/sys/fs/cgroup/memory": "cgroup"}).pid_namespace == "private"
    os.unlink(os.path.join(root, "c1", "config.json"))
    assert read_state(root, "c1", lambda: {"/sys/fs/cgroup/memory": "cgroup"}).pid_namespace == "unknown"


def test_runc_state_facts(tmp_path: object) -> None:
    """runc's state.json: PID namespace from config.namespaces, labels, created, the systemd flag."""
    doc = {
        "id": "c1",
        "init_process_pid": 5,
        "init_process_start": 9,
        "created": "2026-11-30T19:08:43.647933971Z",
        "cgroup_paths": {"memory": "/sys/fs/cgroup/memory/k/c1"},
        "config": {
            "namespaces": [{"type": "NEWPID", "path": ""}, {"type": "NEWNS", "path": ""}],
            "labels": [
                "bundle=/b",
                "io.kubernetes.cri.container-type=sandbox",
                "io.kubernetes.cri.sandbox-id=c1",
            ],
            "cgroups": {"path": "/k/c1", "Systemd": False, "scope_prefix": ""},
        },
    }
    state = parse_state(json.dumps(doc).encode(), "c1")
    assert state.pid_namespace == "private" and state.is_sandbox and state.labels["bundle"] == "/b"
    assert abs(state.created - 1796065723.647933) < 1e-3 and not state.systemd
    doc["config"]["namespaces"] = [{"type": "NEWNS", "path": ""}]  # type: ignore[index]
    assert parse_state(json.dumps(doc).encode(), "c1").pid_namespace == "host"


def test_crun_systemd_status_names_its_scope_unit() -> None:
    """crun's systemd driver: ``scope`` becomes the unit name (as scope_unit_name builds runc's), the state is
    crun's; without the driver the field is not read."""
    from runc_guard.delete.state import KIND_CRUN
    from runc_guard.delete.unit_name import scope_unit_name

    leaf = "/kubepods.slice/kubepods-pod1.slice/cri-containerd-c1.scope/container"
    doc = {**CRUN, "cgroup-path": leaf, "scope": "cri-containerd-c1.scope", "systemd-cgroup": True}
    state = parse_crun_status(json.dumps(doc).encode(), "c1", MOUNTS)
    assert (state.kind, state.systemd, state.cgroups_path) == (KIND_CRUN, True, leaf)
    assert scope_unit_name(state.systemd_name, state.scope_prefix) == "cri-containerd-c1.scope"
    assert state.cgroup_paths == {m: m + leaf for m in MOUNTS}
    state = parse_crun_status(json.dumps({**doc, "systemd-cgroup": False}).encode(), "c1", MOUNTS)
    assert (state.systemd, state.systemd_name) == (False, "")
    for scope in (None, 7, "", "cri-containerd-c1.service"):
        state = parse_crun_status(json.dumps({**doc, "scope": scope}).encode(), "c1", MOUNTS)
        assert state.systemd_name == "", scope
