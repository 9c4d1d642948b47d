"""The launcher's step-aside line (delete/stepaside.py): what Python makes of it, and what it refuses."""

from __future__ import annotations

import os
import socket

import pytest

from runc_guard.delete.aside import read_aside
from runc_guard.delete.pending import record_path
from runc_guard.delete.stepaside import HEADER, parse, pending, take
from runc_guard.overload import overload_reason
from runc_guard.spool import pending_files, read_spooled

NS = 1_765_000_000_123_456_789


def _settings(tmp: str, monkeypatch: pytest.MonkeyPatch, journal: str = "") -> tuple[str, str]:
    """A settings file naming the sink; the cache (its spool) under ``tmp``."""
    cache = os.path.join(tmp, "cache")
    config = os.path.join(tmp, "config.toml")
    with open(config, "w") as f:
        f.write(f'journal_socket = "{journal or tmp + "/no-journald"}"\nlog_file = "{tmp}/events.jsonl"\n')
    monkeypatch.setenv("RUNC_GUARD_CONFIG", config)
    monkeypatch.setenv("RUNC_GUARD_CACHE_DIR", cache)
    spool = os.path.join(cache, "spool")
    os.makedirs(spool, mode=0o700)
    return cache, spool


def _fact(spool: str, line: str, mode: int = 0o600, name: str = f"{NS:020d}-42.aside") -> str:
    path = os.path.join(spool, name)
    with open(path, "w") as f:
        f.write(line)
    os.chmod(path, mode)
    return path


def test_a_fact_becomes_the_record_and_the_entry(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the Python entry's step-aside writes them: the root named by abspath in the launcher's cwd,
    the reason in startup.py's words, the stamp of the step-aside (EventLog's format)."""
    cache, spool = _settings(str(tmp_path), monkeypatch)
    path = _fact(spool, f"{HEADER}\t{NS}\tc1\tr/../root\t/work\t/usr/sbin/runc\tslots\t4\n")
    assert pending(spool) == [path]
    assert take(spool) == 1
    assert not os.path.exists(path)
    record = read_aside(record_path(os.path.join(cache, "aside"), "/work/root", "c1"))
    assert record is not None
    reason = overload_reason("slots", 4)
    assert (record["kind"], record["runtime"], record["reason"], record["runtime_root"]) == (
        "overload", "/usr/sbin/runc", reason, "/work/root")
    assert record["created"] == round(NS / 1e9, 3)
    [spooled] = pending_files(spool)
    doc = read_spooled(spooled)
    sink = {"journal_socket": f"{tmp_path}/no-journald", "log_file": f"{tmp_path}/events.jsonl"}
    assert doc["sink"] == sink
    os.unlink(spooled)  # sent by no reporter here
    assert doc["entries"] == [{"container_id": "c1", "runtime_root": "r/../root", "reason": reason,
                               "event": "startup_overloaded", "level": "warning",
                               "timestamp": "2025-12-06T05:46:40.123456Z"}]


def test_what_is_not_ours_or_not_a_fact_is_dropped(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, journald: tuple[str, socket.socket]
) -> None:
    """Not ours (writable by others), another version, a shape of no step-aside: reported, unlinked."""
    cache, spool = _settings(str(tmp_path), monkeypatch, journal=journald[0])
    good = f"{HEADER}\t{NS}\tc1\t/run/runc\t\t/usr/sbin/runc\tstorm\t0\n"
    assert parse(good.encode()) is not None
    for line in (good.replace("storm", "maybe"), good + good, good[:-1],
                 good.replace("/usr/sbin/runc", "runc"), good.replace("/run/runc", "relative"),
                 "runc-guard-aside 2" + good[len(HEADER):], good.replace("c1", "c\u00e9")):
        assert parse(line.encode()) is None, line
    _fact(spool, good, mode=0o666)  # writable by others: never read
    _fact(spool, "junk\n", name=f"{NS + 1:020d}-42.aside")
    assert take(spool) == 0
    assert pending(spool) == [] and pending_files(spool) == []
    assert not os.path.exists(os.path.join(cache, "aside")) or os.listdir(os.path.join(cache, "aside")) == []
    reported = [journald[1].recv(65536) for _ in range(2)]
    assert all(b"EVENT=spool_unreadable" in datagram for datagram in reported)
