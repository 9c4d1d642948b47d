"""A broken settings file is visible in doctor, metrics and audit, never only in a delete (issue 11 case 3).

The delete ignores an invalid key (it keeps its default) and reports it once to
the journal; an operator finds it through ``doctor``, the ``runc_guard_config_valid``
gauge and ``audit`` (a Node Problem Detector problem), which read the same file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from tests.hermetic import own_roots

CTL = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")


def ctl(tmp: str, config_text: str, *args: str) -> subprocess.CompletedProcess[str]:
    config = os.path.join(tmp, "config.toml")
    with open(config, "w") as f:
        f.write(config_text)
    env = {
        **os.environ,
        "RUNC_GUARD_CONFIG": config,
        "RUNC_GUARD_CACHE_DIR": os.path.join(tmp, "cache"),
        "RUNC_GUARD_PENDING_DIR": os.path.join(tmp, "pending"),
        "RUNC_GUARD_STATS_FILE": os.path.join(tmp, "stats.jsonl"),
        "RUNC_GUARD_LOG_FILE": os.path.join(tmp, "events.jsonl"),
        "RUNC_GUARD_REPORTER_LINGER": "0",
        "RUNC_GUARD_JOURNAL_SOCKET": os.path.join(tmp, "no-journald"),
    }
    return subprocess.run([CTL, *args], capture_output=True, text=True, env=env, check=False, timeout=60)


def scan_args(tmp: str) -> list[str]:
    """The real cgroup tree (read-only), below a pod tree that does not exist; runtime roots of our own."""
    return ["--cgroup-root", "/sys/fs/cgroup", "--kubepods", "rgsweep-absent-tree", *own_roots(tmp)]


def test_doctor_names_the_typo(tmp_path: Any) -> None:
    """doctor exits 1 with a PROBLEM line naming the unknown key."""
    proc = ctl(str(tmp_path), "delete_timout = 5\n", "doctor")
    assert proc.returncode == 1
    assert "PROBLEM:" in proc.stdout + proc.stderr and "delete_timout" in proc.stdout + proc.stderr


def test_metrics_export_config_valid_gauge(tmp_path: Any) -> None:
    """metrics still exports with a typo'd file, and runc_guard_config_valid says 0 (1 when valid)."""
    tmp = str(tmp_path)
    good = ctl(tmp, "delete_timeout = 3\n", "metrics", *scan_args(tmp))
    assert good.returncode == 0, good.stderr
    assert "runc_guard_config_valid 1" in good.stdout
    bad = ctl(tmp, "delete_timout = 5\n", "metrics", *scan_args(tmp))
    assert bad.returncode == 0, bad.stderr
    assert "runc_guard_config_valid 0" in bad.stdout


def test_audit_reports_the_typo_as_a_problem(tmp_path: Any) -> None:
    """audit exits 1 (NPD problem) naming the invalid key, not 2 (unknown)."""
    tmp = str(tmp_path)
    proc = ctl(tmp, "delete_timout = 5\n", "audit", *scan_args(tmp))
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "delete_timout" in proc.stdout + proc.stderr
    assert "UNKNOWN" not in proc.stdout + proc.stderr
