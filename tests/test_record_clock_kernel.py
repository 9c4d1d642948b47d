"""A held memory cgroup whose record is dated ahead of the clock, on the real kernel (issue 42, "noticed").

A delete held a container's v1 memcg aside (delete.memcg_hold, the function the delete
path calls) with 8 MiB of page cache charged to it, while the clock was a year fast; the
clock was then put right. The held directory is a dot-name no scan of container cgroups
finds: only its record leads the sweep to it, and only once the record is HELD_GIVE_UP s
old. The test runs ``runc-guardctl audit`` and ``sweep`` as an operator's timers do, then
the sweep's held step once more with the wall clock HELD_GIVE_UP s later.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labkit.kernel import remove_tree
from runc_guard.delete import memcg_hold
from tests.hermetic import own_env, own_roots

pytestmark = pytest.mark.kernel

MEMORY = "/sys/fs/cgroup/memory"
CTL = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")
AHEAD = 365 * 86400.0
MIB = 1 << 20


@pytest.fixture
def parent() -> Iterator[str]:
    """A parent memcg of the test's own; removed after, whatever is below it (held or not)."""
    if not os.path.isdir(MEMORY):
        pytest.skip("no cgroup v1 memory hierarchy: a memcg is held on cgroup v1 only")
    path = os.path.join(MEMORY, f"rgclock-{uuid.uuid4().hex[:10]}")
    os.mkdir(path)
    try:
        yield path
    finally:
        remove_tree(path)


def _usage(path: str) -> int:
    try:
        with open(os.path.join(path, "memory.usage_in_bytes")) as f:
            return int(f.read())
    except FileNotFoundError:
        return 0


def _charge(memcg: str, path: Path, mib: int) -> None:
    """``mib`` MiB of page cache charged to ``memcg``: written by a process in it, synced, then gone."""
    script = f'echo $$ > {memcg}/cgroup.procs && exec dd if=/dev/zero of={path} bs=1M count={mib} status=none'
    subprocess.run(["sh", "-c", script], check=True, timeout=60)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _ctl(env: dict[str, str], tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    absent = ["--kubepods", f"rgclock-absent-{uuid.uuid4().hex[:8]}"]
    return subprocess.run([CTL, *argv, *absent, *own_roots(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=120, check=False)  # fmt: skip


def _record(cache: str) -> dict[str, Any] | None:
    records = os.listdir(memcg_hold.held_dir(cache))
    if not records:
        return None
    with open(os.path.join(memcg_hold.held_dir(cache), records[0])) as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def test_a_held_memcg_dated_ahead_is_flagged_then_swept_one_give_up_after_the_restamp(
    parent: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Audit exits 1 naming the record; the sweep dates it now (a warning entry with the step) and
    leaves it to a finisher for HELD_GIVE_UP s; then the sweep reclaims and removes it. Before: audit
    "OK" and every sweep left the held memcg and its 8 MiB, for a year."""
    from runc_guard.node.finisher import HELD_GIVE_UP
    from runc_guard.node.host import finish_held
    from runc_guard.node.sweep import SweepReport
    from runc_guard.settings import load_settings

    env = own_env(tmp_path, RUNC_GUARD_JOURNAL_SOCKET=str(tmp_path / "no-journald.socket"))
    cache = env["RUNC_GUARD_CACHE_DIR"]
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    memcg = os.path.join(parent, cid)
    os.mkdir(memcg)
    _charge(memcg, tmp_path / "written", 8)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + AHEAD)  # the clock a year fast at the hold
    held = memcg_hold.hold(memcg, cache, cid, "/run/containerd/runc/k8s.io", "dirty")
    monkeypatch.setattr(time, "time", real)
    assert held is not None and os.path.isdir(held)
    charged = _usage(held)
    seen: dict[str, Any] = {"charged_kib": charged >> 10}

    audit = _ctl(env, tmp_path, "audit")
    seen["audit"] = (audit.returncode, audit.stdout.splitlines()[:1])
    sweep = _ctl(env, tmp_path, "sweep")
    record = _record(cache)
    ahead = None if record is None else round(record["created"] - real())
    seen["after_sweep"] = {"exit": sweep.returncode, "held": os.path.isdir(held), "ahead_s": ahead}
    with open(env["RUNC_GUARD_LOG_FILE"]) as f:
        entries = [e for e in map(json.loads, f) if e.get("event") == "sweep"]
    seen["sweep_entry"] = {k: entries[0].get(k) for k in ("level", "records_restamped", "clock_step_s")}
    again = _ctl(env, tmp_path, "audit")
    seen["audit_after_sweep"] = again.returncode
    # The sweep's held step HELD_GIVE_UP s later (the wall clock moved for that one call).
    monkeypatch.setattr(time, "time", lambda: real() + HELD_GIVE_UP + 1)
    try:
        report = SweepReport(False, [])
        finish_held(load_settings(env), report)
    finally:
        monkeypatch.setattr(time, "time", real)
    seen["later"] = {"held": os.path.isdir(held), "record": _record(cache) is not None,
                     "reclaimed_kib": report.memcg_reclaimed_kb, "errors": report.errors}  # fmt: skip
    print(f"\nheld memcg dated {AHEAD:.0f} s ahead: {json.dumps(seen, sort_keys=True)}")

    assert charged >= 4 * MIB, seen
    assert audit.returncode == 1 and "record(s) dated ahead of the clock" in audit.stdout, audit.stdout
    assert "dated ahead: held record" in audit.stdout, audit.stdout
    assert sweep.returncode == 0, sweep.stderr
    assert seen["after_sweep"]["ahead_s"] is not None and seen["after_sweep"]["ahead_s"] <= 1, seen
    assert seen["after_sweep"]["held"], "the sweep took the memcg before a finisher could have given up"
    assert seen["sweep_entry"]["level"] == "warning" and seen["sweep_entry"]["records_restamped"] == 1
    assert abs(seen["sweep_entry"]["clock_step_s"] - AHEAD) < 120, seen
    assert again.returncode == 0, again.stdout  # an ordinary held record now, a problem HELD_STALE later
    assert seen["later"] == {"held": False, "record": False, "reclaimed_kib": seen["later"]["reclaimed_kib"],
                             "errors": []}, seen  # fmt: skip
