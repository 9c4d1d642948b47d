"""A node tool's inputs, all inside the test's own directory: never the host's runtime state.

sweep, audit and metrics read containerd's runc root and bundles, the flat roots of
runc and crun, runc-guard's pending records and cache by default. On this machine the
other xdist worker creates and removes containers there, so a test that reads them is
flipped by its neighbour (issue 31: ``runc_guard_leaked_containers`` 1 instead of 0).
Only the cgroup mounts stay the host's (a tmp dir is no cgroup), looked at below a pod
tree the test made or one that does not exist. tests/test_hermetic.py proves, with
strace, that these two helpers leave nothing of :data:`HOST_ROOTS` in reach.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: Where runc, crun, containerd and runc-guard keep a node's state, logs and settings by default.
HOST_ROOTS = (
    "/run/containerd",
    "/run/runc",
    "/run/crun",
    "/run/runc-guard",
    "/var/log/runc-guard",
    "/etc/runc-guard",
)


def own_env(tmp: Path | str, base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """``base`` (default os.environ) with every runc-guard path inside ``tmp``, plus ``extra``."""
    run = os.path.join(tmp, "run")
    return {
        **(os.environ if base is None else base),
        "RUNC_GUARD_CONFIG": os.path.join(tmp, "absent.toml"),
        "RUNC_GUARD_PENDING_DIR": os.path.join(run, "pending"),
        "RUNC_GUARD_STATS_FILE": os.path.join(run, "deletes.jsonl"),
        "RUNC_GUARD_CACHE_DIR": os.path.join(run, "cache"),
        "RUNC_GUARD_LOG_FILE": os.path.join(run, "events.jsonl"),
        **extra,
    }


def own_roots(tmp: Path | str) -> list[str]:
    """sweep/audit/metrics options that put containerd's and the flat runtime roots inside ``tmp``."""
    return [
        "--runtime-root", os.path.join(tmp, "runc"),
        "--bundle-root", os.path.join(tmp, "bundles"),
        "--state-root", os.path.join(tmp, "flat"),
    ]  # fmt: skip
