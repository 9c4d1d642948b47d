"""The node tools, run as the tests run them (tests/hermetic.py), read nothing of the host's runtime state."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import prereq
from tests.hermetic import HOST_ROOTS, own_env, own_roots

CTL = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")
ABSENT = ["--kubepods", "rgsweep-absent-tree"]


def touched(tmp_path: Path, argv: list[str], env: dict[str, str]) -> set[str]:
    """Every path ``argv`` (and its children) named in a file syscall, traced with strace."""
    strace = shutil.which("strace")
    prereq.require(strace, "strace (make deps installs it)")
    trace = tmp_path / "trace"
    subprocess.run(
        [str(strace), "-f", "-qq", "-e", "trace=%file", "-o", str(trace), *argv],
        capture_output=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    return set(re.findall(r'"(/[^"]*)"', trace.read_text(errors="replace")))


def host_state(paths: set[str]) -> list[str]:
    return sorted(p for p in paths if any(p == r or p.startswith(r + "/") for r in HOST_ROOTS))


@pytest.mark.parametrize("command", [["metrics"], ["audit"], ["sweep", "--dry-run"]])
def test_own_roots_and_env_keep_the_host_out_of_reach(tmp_path: Path, command: list[str]) -> None:
    """With own_env and own_roots no host runtime root is opened, listed or stat'ed."""
    mine = touched(tmp_path, [CTL, *command, *ABSENT, *own_roots(tmp_path)], own_env(tmp_path))
    assert host_state(mine) == []


def test_the_trace_sees_the_default_roots(tmp_path: Path) -> None:
    """The same trace of metrics with the default roots and pending dir (what
    test_invalid_settings_still_write_metrics ran before issue 31) names the host's: the check can fail."""
    defaults = touched(tmp_path, [CTL, "metrics", *ABSENT], own_env(tmp_path, RUNC_GUARD_PENDING_DIR=""))
    assert {"/run/containerd/runc", "/run/runc-guard/pending"} <= set(host_state(defaults))
