"""Records dated ahead of the clock (issue 42, "noticed"): the sweep re-stamps them, audit flags them."""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from runc_guard.cli import cli
from runc_guard.delete import memcg_hold
from runc_guard.delete.aside import write_aside
from runc_guard.delete.pending import Claim, PendingRecord, RecordRule, write_record
from runc_guard.node.audit import NPD_OK, NPD_PROBLEM, audit, families, held_memcgs, judge, stepped_aside
from runc_guard.node.discovery import Discovery
from runc_guard.node.finisher import HELD_GIVE_UP
from runc_guard.node.metrics import CountersCollector, new_state, record_sweep
from runc_guard.node.sweep import RuntimeDirs
from tests.fakes import FakeCgroupFs, FakeClock
from tests.hermetic import own_env, own_roots
from tests.test_sweep import HIERARCHIES

#: How far ahead the records are dated: a clock that was ten years fast when they were written.
AHEAD = 10 * 365 * 86400.0
ABSENT = ["--kubepods", f"rgclock-absent-{uuid.uuid4().hex[:8]}"]


def _cid(n: int) -> str:
    return f"{n:064x}"


class Wall:
    """The wall clock the code under test reads (``time.time``), moved by the test."""

    def __init__(self) -> None:
        self.real = time.time
        self.offset = 0.0

    def __call__(self) -> float:
        return self.real() + self.offset


@pytest.fixture
def wall(monkeypatch: pytest.MonkeyPatch) -> Wall:
    clock = Wall()
    monkeypatch.setattr(time, "time", clock)
    return clock


def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = own_env(tmp_path, base={}, RUNC_GUARD_JOURNAL_SOCKET=str(tmp_path / "no-journald.socket"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def _held(cache: str, name: str, parent: Path, created: float) -> tuple[str, str]:
    """A held-memcg record (memcg_hold's own shape) dated ``created``, whose held directory is gone
    (as after an operator's rmdir): the sweep's final step drops such a record once it is the sweep's."""
    held = str(parent / (memcg_hold.PREFIX + name))
    doc: dict[str, object] = {"container_id": name, "runtime_root": "/run/containerd/runc/k8s.io",
                              "original": str(parent / name), "held": held, "reason": "dirty",
                              "created": created}  # fmt: skip
    path = memcg_hold.record_file(cache, held)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f)
    os.chmod(path, 0o600)
    return path, held


def _created(path: str) -> float:
    with open(path) as f:
        return float(json.load(f)["created"])


def _sweep(argv_tail: list[str]) -> str:
    result = CliRunner().invoke(cli, ["sweep", *ABSENT, *argv_tail])
    assert result.exit_code == 0, result.output
    return result.output


def test_a_record_dated_ahead_is_the_sweeps_one_threshold_after_it_first_saw_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wall: Wall
) -> None:
    """A held-memcg record and an aside record written while the clock was ten years fast: the first
    sweep dates them now (one warning entry naming the step), and the held one is the sweep's
    HELD_GIVE_UP s later, like one written now. Before: untouched by every sweep for ten years."""
    env = _env(tmp_path, monkeypatch)
    cache = env["RUNC_GUARD_CACHE_DIR"]
    written = time.time() + AHEAD
    held_record, _ = _held(cache, "c1", tmp_path / "memory" / "pod", written)
    kept = tmp_path / "still-there"  # an aside record whose cgroup is still there stays for audit
    kept.mkdir()
    wall.offset = AHEAD
    aside = write_aside(cache, "/run/containerd/runc/k8s.io", _cid(2), [str(kept)], "unknown liveness")
    wall.offset = 0.0
    assert aside is not None and _created(aside) > time.time() + AHEAD - 60

    out = _sweep(own_roots(tmp_path))
    for path in (held_record, aside):
        assert _created(path) <= time.time(), f"{path} still dated ahead after a sweep"
        with open(path) as f:
            assert json.load(f)["restamped"]["written"] == pytest.approx(written, abs=5)
    assert "dated" in out and "ahead of the clock" in out, out
    with open(env["RUNC_GUARD_LOG_FILE"]) as f:
        [entry] = [e for e in map(json.loads, f) if e.get("event") == "sweep"]
    assert entry["level"] == "warning" and entry["records_restamped"] == 2, entry
    assert entry["clock_step_s"] == pytest.approx(AHEAD, abs=60), entry

    wall.offset = HELD_GIVE_UP - 5  # not the sweep's yet: a finisher that saw it may still work on it
    _sweep(own_roots(tmp_path))
    assert os.path.exists(held_record)
    wall.offset = HELD_GIVE_UP + 1  # past the give-up counted from the re-stamp
    _sweep(own_roots(tmp_path))
    assert not os.path.exists(held_record), "the held record stayed past its give-up after the re-stamp"
    assert os.path.exists(aside)  # its cgroup is still there: audit's to show, nobody's to drop


def test_audit_calls_a_record_dated_ahead_a_problem_and_counts_it(tmp_path: Path) -> None:
    """Pending, aside and held records dated ahead: audit exits 1 with a line naming them, reports
    their age as 0 (never negative) and counts them by kind. Before: "OK" for the pending and held
    ones, ages of minus ten years, never stale however long they stayed."""
    now = time.time()
    cache = str(tmp_path / "cache")
    _held(cache, "c1", tmp_path / "memory" / "pod", now + AHEAD)
    discovery = Discovery(HIERARCHIES)
    discovery.records["/p/a.json"] = (_cid(1), now + AHEAD)
    fs = FakeCgroupFs(FakeClock())
    report = audit(discovery, fs, RuntimeDirs("/nonexistent", "/nonexistent"), now, 60)
    report.held_memcgs = held_memcgs(cache, now)
    assert judge(report, 10, 3600.0) == NPD_PROBLEM, report.message
    assert "2 record(s) dated ahead of the clock" in report.message, report.message

    there = tmp_path / "cg"  # an aside record's cgroup, still there (a problem of its own already)
    there.mkdir()
    fs.add(str(there))
    path = write_aside(cache, "/run/containerd/runc/k8s.io", _cid(2), [str(there)], "unknown liveness")
    assert path is not None
    with open(path) as f:
        doc = json.load(f)
    doc["created"] = now + AHEAD
    with open(path, "w") as f:
        json.dump(doc, f)
    report.aside = stepped_aside(cache, fs, now)
    assert judge(report, 10, 3600.0) == NPD_PROBLEM
    assert "3 record(s) dated ahead of the clock" in report.message, report.message
    assert [(r["kind"], r["age_seconds"]) for r in report.dated_ahead()] == [
        ("pending", 0.0), ("aside", 0.0), ("held", 0.0)
    ]
    assert all(r["dated_ahead_seconds"] == pytest.approx(AHEAD, abs=1) for r in report.dated_ahead())
    [gauge] = [f for f in families(report, now) if f.name == "runc_guard_records_dated_ahead"]
    assert dict((labels[0][1], value) for labels, value in gauge.samples) == {
        "pending": 1.0, "aside": 1.0, "held": 1.0
    }
    [oldest] = [f for f in families(report, now) if f.name == "runc_guard_pending_oldest_age_seconds"]
    assert oldest.samples == (((), 0.0),)


def test_audit_cli_names_each_record_dated_ahead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``runc-guardctl audit``: exit 1, the first line says why, one line per record."""
    env = _env(tmp_path, monkeypatch)
    _held(env["RUNC_GUARD_CACHE_DIR"], "c1", tmp_path / "memory" / "pod", time.time() + AHEAD)
    result = CliRunner().invoke(cli, ["audit", *ABSENT, *own_roots(tmp_path)])
    assert result.exit_code == NPD_PROBLEM, result.output
    first, *rest = result.output.splitlines()
    assert "1 record(s) dated ahead of the clock" in first, first
    assert any(line.startswith("dated ahead: held record ") for line in rest), result.output


def test_a_record_dated_ahead_ages_from_its_restamp(tmp_path: Path) -> None:
    """Once re-stamped a record is an ordinary one: audit OK, then stale (a problem) pending_max_age later."""
    from runc_guard.node import record_clock

    now = time.time()
    pending = str(tmp_path / "pending")
    record = PendingRecord(_cid(1), "/run/containerd/runc/k8s.io", [], 1, 1, "/usr/sbin/runc", now + AHEAD)
    path = write_record(pending, record)
    rule = RecordRule(FakeCgroupFs(FakeClock()), {}, ["/usr/sbin/runc"])
    [done] = record_clock.restamp_records(pending, str(tmp_path / "cache"), rule, lambda: now)
    assert (done.kind, done.done, done.container_id) == ("pending", True, _cid(1))
    assert done.ahead_s == pytest.approx(AHEAD, abs=1)
    assert _created(path) == pytest.approx(now, abs=0.01)
    for later, code in ((now + 10, NPD_OK), (now + 3601, NPD_PROBLEM)):
        discovery = Discovery(HIERARCHIES)
        discovery.records[path] = (_cid(1), _created(path))
        report = audit(discovery, FakeCgroupFs(FakeClock()), RuntimeDirs("/none", "/none"), later, 60)
        assert judge(report, 10, 3600.0) == code, report.message
    assert record_clock.restamp_records(pending, str(tmp_path / "cache"), rule, lambda: now + 1) == []


def test_a_claimed_record_waits_for_the_next_sweep(tmp_path: Path) -> None:
    """A delete or finisher holding the container's claim: nothing is written, the record says why."""
    from runc_guard.node import record_clock

    now = time.time()
    pending = str(tmp_path / "pending")
    record = PendingRecord(_cid(1), "/run/containerd/runc/k8s.io", [], 1, 1, "/usr/sbin/runc", now + AHEAD)
    path = write_record(pending, record)
    before = Path(path).read_bytes()
    rule = RecordRule(FakeCgroupFs(FakeClock()), {}, ["/usr/sbin/runc"])
    with Claim(pending, record.runtime_root, record.container_id, time.monotonic() + 5) as held:
        assert held == "claimed"
        [left] = record_clock.restamp_records(pending, str(tmp_path / "cache"), rule, lambda: now)
    assert (left.done, left.why) == (False, "claim busy: left for the next sweep")
    assert left.ahead_s == pytest.approx(AHEAD, abs=1)
    assert Path(path).read_bytes() == before


def test_a_record_removed_meanwhile_is_never_brought_back(tmp_path: Path) -> None:
    """The re-stamp exchanges names: a record a finisher dropped after our read stays dropped, and no
    temp file is left either way."""
    from runc_guard.node import record_clock

    path = tmp_path / "r.json"
    assert record_clock.replace_existing(str(path), b"{}") is False
    assert list(tmp_path.iterdir()) == []
    path.write_text('{"created": 1}')
    assert record_clock.replace_existing(str(path), b'{"created": 2}') is True
    assert path.read_text() == '{"created": 2}' and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_second_step_keeps_the_date_as_first_written() -> None:
    """Re-stamped twice (the clock stepped back twice): ``written`` is still the first date."""
    from runc_guard.node import record_clock

    once = record_clock.restamped({"created": 5000.0, "container_id": "c"}, 1000.0)
    twice = record_clock.restamped({**once, "created": 3000.0}, 2000.0)
    assert twice["restamped"] == {"written": 5000.0, "at": 2000.0, "ahead_s": 1000.0}
    assert (twice["created"], twice["container_id"]) == (2000.0, "c")


@pytest.mark.parametrize(
    ("created", "ahead", "aged"),
    [
        (100.0, None, {"age_seconds": 0.0}),  # written now
        (100.9, None, {"age_seconds": 0.0}),  # the millisecond rounding and a small step: not ahead
        (99.0, None, {"age_seconds": 1.0}),
        (102.0, 2.0, {"age_seconds": 0.0, "dated_ahead_seconds": 2.0}),
        (math.inf, math.inf, {"age_seconds": 0.0, "dated_ahead_seconds": None}),
        (math.nan, math.inf, {"age_seconds": 0.0, "dated_ahead_seconds": None}),
        ("100", None, {}),  # not a number: the reader's "unusable record", not a date
        (True, None, {}),
    ],
)
def test_ahead_and_aged(created: Any, ahead: float | None, aged: dict[str, Any]) -> None:
    """What counts as dated ahead, and the age audit shows for it."""
    from runc_guard.node import record_clock

    assert record_clock.ahead(created, 100.0) == ahead
    assert record_clock.aged(created, 100.0) == aged


def test_the_sweep_counts_its_restamps() -> None:
    """``runc_guard_sweep_records_restamped``: every record a sweep dated now, over all sweeps."""
    state = new_state()
    report = {"removed": 0, "dirs_removed": 0, "errors": [], "records_cleared": 0, "slowed": 0.0, "kept": {},
              "duration": 0.1, "records_restamped": 2}  # fmt: skip
    record_sweep(state, report, 1.0)
    record_sweep(state, report, 2.0)
    counters = CountersCollector(state).collect()
    [family] = [f for f in counters if f.name == "runc_guard_sweep_records_restamped"]
    assert family.samples[0].value == 4
