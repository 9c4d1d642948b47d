"""Durable pending records and the runtime --log line containerd reads."""

from __future__ import annotations

import json
import os
import stat

import pytest

from labkit.kernel import read_jsonl, read_lines
from runc_guard.delete import runclog
from runc_guard.delete.pending import (
    PendingRecord,
    RecordRule,
    UntrustedRecord,
    iter_records,
    read_record,
    record_path,
    remove_record,
    routed_runtimes,
    write_record,
)
from tests.fakes import FakeCgroupFs, FakeClock

RECORD = PendingRecord(
    "c1", "/run/containerd/runc/k8s.io", ["/sys/fs/cgroup/memory/k/c1"], 5, 9, "/usr/sbin/runc", 1.0
)


def _rule(runtimes: tuple[str, ...] = ("/usr/sbin/runc",), patterns: tuple[str, ...] = ()) -> RecordRule:
    """The trust rule over a fake kernel with RECORD's cgroup in it."""
    fs = FakeCgroupFs(FakeClock())
    for path in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/memory/k", "/sys/fs/cgroup/memory/k/c1",
                 "/sys/fs/cgroup/memory/k/svc", "/sys/fs/cgroup/memory/kubepods"):  # fmt: skip
        fs.add(path)
    return RecordRule(fs, {"/sys/fs/cgroup/memory": "cgroup"}, runtimes, patterns)


def test_record_round_trip(tmp_path: os.PathLike[str]) -> None:
    """A record is written atomically with mode 0600 and reads back equal."""
    path = write_record(str(tmp_path / "pending"), RECORD)  # type: ignore[operator]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_record(path, _rule()) == RECORD
    assert [p for p, _ in iter_records(str(tmp_path / "pending"), _rule())] == [path]  # type: ignore[operator]
    remove_record(path)
    remove_record(path)  # idempotent
    assert not os.path.exists(path)


def test_same_id_in_two_namespaces_gets_two_records(tmp_path: os.PathLike[str]) -> None:
    """Records are keyed by runtime root too: k8s.io/c1 and moby/c1 do not collide."""
    a = record_path(str(tmp_path), "/run/containerd/runc/k8s.io", "c1")
    b = record_path(str(tmp_path), "/run/containerd/runc/moby", "c1")
    assert a != b and os.path.basename(a).startswith("c1@")


def test_unwritable_pending_dir_raises(tmp_path: os.PathLike[str]) -> None:
    """A pending dir that is a file raises OSError for the caller to report."""
    blocker = os.path.join(tmp_path, "file")
    open(blocker, "w").close()
    with pytest.raises(FileExistsError):
        write_record(blocker, RECORD)


def test_malformed_record_is_reported(tmp_path: os.PathLike[str]) -> None:
    """A record that is not ours is yielded as an error, not raised."""
    with open(os.path.join(tmp_path, "x.json"), "w") as f:
        f.write('{"container_id": 1}')
    ((_, result),) = list(iter_records(str(tmp_path), _rule()))
    assert isinstance(result, ValueError)


def _planted(tmp_path: os.PathLike[str], record: PendingRecord = RECORD) -> str:
    path = os.path.join(tmp_path, "planted.json")
    with open(path, "w") as f:
        json.dump(record.as_dict(), f)
    os.chmod(path, 0o600)
    return path


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ("symlink", "not ours"),
        ("group-writable", "not ours"),
        ("foreign-owner", "not ours"),
        ("path", "not named after container c1"),
        ("pod-level", "pod, QoS or slice level"),
        ("escape", "not below any cgroup mount point"),
        ("runtime", "not one the settings route to"),
        ("id", "not a container id"),
    ],
)
def test_one_trust_rule_for_every_record(tmp_path: os.PathLike[str], change: str, why: str) -> None:
    """A record is read only if the file is ours (no symlink, our owner, writable by nobody else), its
    paths have a cgroup's shape and the container's ownership, and its runtime is a routed one."""
    if change == "foreign-owner" and os.geteuid() != 0:
        pytest.skip("chown needs root")
    record = {
        "path": RECORD.replace(cgroup_paths=["/sys/fs/cgroup/memory/k/svc"]),
        "pod-level": RECORD.replace(cgroup_paths=["/sys/fs/cgroup/memory/kubepods"]),
        "escape": RECORD.replace(cgroup_paths=["/etc/c1"]),
        "runtime": RECORD.replace(runtime="/tmp/tracer"),
        "id": RECORD.replace(container_id="../c1"),
    }.get(change, RECORD)
    planted = _planted(tmp_path, record)
    path = os.path.join(tmp_path, "c1@0.json")
    if change == "symlink":
        os.symlink(planted, path)
    else:
        os.rename(planted, path)
    if change == "group-writable":
        os.chmod(path, 0o620)
    if change == "foreign-owner":
        os.chown(path, 65534, 65534)
    with pytest.raises(UntrustedRecord, match=why):
        read_record(path, _rule())
    ((_, result),) = [(p, r) for p, r in iter_records(str(tmp_path), _rule()) if p == path]
    assert isinstance(result, UntrustedRecord) and why in str(result)


def test_a_record_named_by_a_configured_pattern_is_trusted(tmp_path: os.PathLike[str]) -> None:
    """``container_cgroup_patterns`` widen ownership for the rule as they do for the delete."""
    record = RECORD.replace(cgroup_paths=["/sys/fs/cgroup/memory/k/svc"], container_id="vc")
    path = os.path.join(tmp_path, "vc@0.json")
    os.rename(_planted(tmp_path, record), path)
    with pytest.raises(UntrustedRecord, match="not named after container vc"):
        read_record(path, _rule())
    assert read_record(path, _rule(patterns=("s{id}",))) == record


def test_routed_runtimes_are_every_path_a_delete_could_have_found() -> None:
    """A bare name in each absolute PATH entry (and the default PATH); a path as it is; nothing else."""
    routed = routed_runtimes(["runc", "/opt/nvidia/runtime"], {"PATH": "/opt/bin:relative:/usr/sbin"})
    assert {"/opt/bin/runc", "/usr/sbin/runc", "/usr/local/bin/runc", "/opt/nvidia/runtime"} <= routed
    assert not any(not os.path.isabs(p) or p.startswith("relative") for p in routed)
    assert "/tmp/runc" not in routed and "/opt/bin/crun" not in routed


def test_runclog_json_line_is_what_containerd_parses(tmp_path: os.PathLike[str]) -> None:
    """--log-format json: a logrus JSON line with level error and msg."""
    path = os.path.join(tmp_path, "log.json")
    assert runclog.append(path, "error", "runc-guard: busy", "json")
    (line,) = read_jsonl(path)
    assert (line["level"], line["msg"]) == ("error", "runc-guard: busy")
    assert line["time"].endswith("Z")


def test_runclog_text_format_and_no_log(tmp_path: os.PathLike[str]) -> None:
    """Text format follows logrus; no --log means nothing is written."""
    path = os.path.join(tmp_path, "log")
    runclog.append(path, "error", 'say "hi"', "text")
    assert 'level=error msg="say \\"hi\\""' in read_lines(path)[0]
    assert runclog.append(None, "error", "x", "json") is False
