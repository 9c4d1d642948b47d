"""Durable pending records and the runtime --log line containerd reads."""

from __future__ import annotations

import os
import stat

import pytest

from labkit.kernel import read_jsonl, read_lines
from runc_guard.delete import runclog
from runc_guard.delete.pending import (
    PendingRecord,
    iter_records,
    read_record,
    record_path,
    remove_record,
    write_record,
)

RECORD = PendingRecord(
    "c1", "/run/containerd/runc/k8s.io", ["/sys/fs/cgroup/memory/k/c1"], 5, 9, "/usr/sbin/runc", 1.0
)


def test_record_round_trip(tmp_path: os.PathLike[str]) -> None:
    """A record is written atomically with mode 0600 and reads back equal."""
    path = write_record(str(tmp_path / "pending"), RECORD)  # type: ignore[operator]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_record(path) == RECORD
    assert [p for p, _ in iter_records(str(tmp_path / "pending"))] == [path]  # type: ignore[operator]
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
    ((_, result),) = list(iter_records(str(tmp_path)))
    assert isinstance(result, ValueError)


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
