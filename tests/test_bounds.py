"""What the delete path writes under /run stays bounded without the timers (delete.bounds)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runc_guard.atomic import append_line
from runc_guard.delete import bounds
from runc_guard.delete.aside import aside_dir, iter_aside, write_aside
from runc_guard.delete.pending import LOCK_DIR, Claim


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real tmpfs, as /run is on a node: its directories grow 20 bytes an entry."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    target = tmp_path / "run"
    target.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "rg-bounds", str(target)], check=True)
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def _fill(directory: Path, count: int, suffix: str) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    made = []
    for i in range(count):
        path = directory / f"{i:08d}-{'x' * 40}{suffix}"
        path.write_text("")
        os.utime(path, (1_000_000 + i, 1_000_000 + i))  # older first
        made.append(path)
    return made


def test_a_directory_is_crowded_once_its_inode_grows(tmpfs: Path) -> None:
    """One stat tells: a few entries are not worth listing, thousands are (tmpfs, the kernel's sizes)."""
    few = tmpfs / "few"
    _fill(few, 10, ".json")
    many = tmpfs / "many"
    _fill(many, 4000, ".json")
    assert not bounds.crowded(str(few))
    assert bounds.crowded(str(many))
    assert not bounds.crowded(str(tmpfs / "missing"))


def test_drop_oldest_keeps_the_newest(tmp_path: Path) -> None:
    """Beyond ``keep``, the oldest files of the kind go; others (and dot files) are not touched."""
    made = _fill(tmp_path / "d", 12, ".json")
    (tmp_path / "d" / ".tmp-1.json").write_text("")
    (tmp_path / "d" / "other.lock").write_text("")
    assert bounds.drop_oldest(str(tmp_path / "d"), 5, ".json") == 7
    left = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert left == sorted([*(p.name for p in made[-5:]), ".tmp-1.json", "other.lock"])


def test_the_stats_file_rotates_past_its_cap(tmp_path: Path) -> None:
    """append_line with rotate_at: the file that passes the cap becomes ``.1``; the next line starts anew."""
    path = str(tmp_path / "deletes.jsonl")
    line = "x" * 99 + "\n"
    for _ in range(11):
        assert append_line(path, line, rotate_at=1000)
    assert os.path.getsize(path + ".1") == 1100 and not os.path.exists(path)
    assert append_line(path, line, rotate_at=1000)
    assert os.path.getsize(path) == 100


def _hold(path: str) -> subprocess.Popen[bytes]:
    """A process that takes ``path``'s flock and keeps it, as a delete in progress does."""
    program = (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600);"
        " fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", program, path], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
    return proc


def test_stale_locks_go_held_and_young_ones_stay(tmp_path: Path) -> None:
    """A lock left by a SIGKILLed delete is unlinked; one a live process holds, or a young one, is kept."""
    locks = tmp_path / "locks"
    locks.mkdir()
    killed, held, young = (str(locks / f"{n}.lock") for n in ("killed", "held", "young"))
    victim = _hold(killed)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    holder = _hold(held)
    try:
        for path in (killed, held):
            os.utime(path, (time.time() - 120, time.time() - 120))
        Path(young).write_text("")
        assert bounds.prune_stale_locks(str(locks)) == 1
        assert sorted(os.listdir(locks)) == ["held.lock", "young.lock"]
    finally:
        holder.kill()
        holder.wait()


def test_a_claim_prunes_stale_locks_only_when_crowded(tmpfs: Path) -> None:
    """Claim's exit lists the lock directory only once it is crowded; then the stale ones go."""
    pending = tmpfs / "pending"
    pending.mkdir()
    stale = _fill(tmpfs / LOCK_DIR, 4000, ".lock")
    with Claim(str(pending), "/run/containerd/runc/k8s.io", "a" * 64, time.monotonic() + 5):
        pass
    assert not any(p.exists() for p in stale)
    few = _fill(tmpfs / LOCK_DIR, 10, ".lock")
    with Claim(str(pending), "/run/containerd/runc/k8s.io", "b" * 64, time.monotonic() + 5):
        pass
    assert all(p.exists() for p in few), "not crowded: not even listed"


def test_aside_records_stay_bounded(tmpfs: Path) -> None:
    """Past the crowd line (tmpfs: 20 bytes an entry), records whose cgroups are gone are pruned as the
    sweep would; records naming cgroups still there are kept up to the cap, the oldest dropped beyond."""
    cache = str(tmpfs / "cache")
    most = bounds.CROWDED_DIR_BYTES // 20 + 1
    for i in range(4000):
        path = f"/sys/fs/cgroup/memory/rg-bounds-gone-{i}"
        assert write_aside(cache, "/run/containerd/runc/k8s.io", f"gone-{i:05d}", [path], "test")
    assert len(list(iter_aside(cache))) < most
    live = tmpfs / "live"
    live.mkdir()
    for i in range(4000):
        write_aside(cache, "/run/containerd/runc/k8s.io", f"live-{i:05d}", [str(live)], "test")
    names = os.listdir(aside_dir(cache))
    assert bounds.MAX_ASIDE_RECORDS <= len(names) < most
    assert not any(n.startswith("gone-") for n in names), "nothing they named is left: pruned first"
    assert any(n.startswith("live-03999@") for n in names), "the newest is kept"
    assert not any(n.startswith("live-00000@") for n in names), "the oldest beyond the cap went"
