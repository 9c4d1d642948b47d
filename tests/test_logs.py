"""The operator's tools log through structlog into the reporter's sink: journald, else the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runc_guard.cli.sweep import MAX_JOURNAL_IDS, journal_entry
from runc_guard.logs import operator_logger
from runc_guard.node.sweep import SweepReport


def _fields(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().splitlines())


def test_an_operator_entry_reaches_journald_with_level_and_timestamp(journald, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """structlog stamps the level and an RFC 3339 UTC time; the sink maps keys to journal fields."""
    path, sock = journald
    log = operator_logger(path, str(tmp_path / "events.jsonl"), "info", tool="sweep")
    log.debug("noise")  # below the level: never sent
    log.warning("sweep", removed=3, kept={"populated": 1}, reason="x: busy")
    fields = _fields(sock.recv(1 << 16))
    assert fields["EVENT"] == "sweep" and fields["SYSLOG_IDENTIFIER"] == "runc-guard"
    assert fields["PRIORITY"] == "4" and "LEVEL" not in fields
    assert fields["MESSAGE"] == "sweep reason=x: busy"
    assert (fields["TOOL"], fields["REMOVED"], json.loads(fields["KEPT"])) == ("sweep", "3", {"populated": 1})
    assert fields["TIMESTAMP"].endswith("Z") and fields["TIMESTAMP"][10] == "T"
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        sock.recv(1 << 16)
    assert not (tmp_path / "events.jsonl").exists()


def test_without_journald_the_entry_goes_to_the_file(tmp_path: Path) -> None:
    """No journald: one JSON line in the fallback file, keys sorted, the level kept."""
    events = tmp_path / "events.jsonl"
    operator_logger(str(tmp_path / "absent.socket"), str(events)).info("sweep", removed=0, odd=object)
    [entry] = [json.loads(line) for line in events.read_text().splitlines()]
    assert (entry["event"], entry["level"], entry["removed"]) == ("sweep", "info", 0)
    assert entry["odd"] == str(object)  # json's default=str for what it cannot encode


def test_the_sweep_entry_names_what_it_removed_and_why_it_kept_the_rest() -> None:
    """One canonical entry per sweep: counts, the removed ids, the first error as its reason."""
    report = SweepReport(dry_run=False, hierarchies=["memory"], found=4, candidates=2, removed=1,
                         dirs_removed=12, kept={"populated": 1}, duration=1.2345)
    report.containers = [{"id": "a" * 64, "action": "removed"}, {"id": "b" * 64, "action": "kept:populated"}]
    report.errors = ["c: scope x.scope: failed"]
    entry = journal_entry(report)
    assert entry["removed_ids"] == ["a" * 64] and entry["kept"] == {"populated": 1}
    assert (entry["found"], entry["dirs_removed"], entry["errors"], entry["duration_ms"]) == (4, 12, 1, 1234)
    assert entry["reason"] == "c: scope x.scope: failed"
    assert json.loads(json.dumps(entry)) == entry and "removed_ids_truncated" not in entry
    report.containers = [{"id": f"{i:064x}", "action": "removed"} for i in range(MAX_JOURNAL_IDS + 1)]
    entry = journal_entry(report)
    assert len(entry["removed_ids"]) == MAX_JOURNAL_IDS and entry["removed_ids_truncated"] is True

