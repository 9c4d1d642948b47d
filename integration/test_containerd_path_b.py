"""Path B, the incident's path: init and shim SIGKILLed, containerd cleans up a dead shim."""

from __future__ import annotations

import pytest

from labkit import containerd as cl

pytestmark = pytest.mark.kernel


def test_stock_runc_leaks_and_containerd_logs_only_shim_disconnected(
    ctd: cl.Containerd, ns: str
) -> None:
    """Control: stock runc 1.1.5 leaves the cgroups in every hierarchy and nobody logs an error."""
    crash = cl.path_b_crash(ctd, ns, cl.STOCK_RUNC, delay=1.0)
    try:
        assert crash.bundle_gone
        # Every hierarchy but the freezer (the held children left it for the hold).
        assert len(crash.left) >= 8, crash.left
        lines = ctd.log_lines_for(crash.task_id)
        assert any('msg="shim disconnected"' in line for line in lines), lines
        assert not [line for line in lines if "level=error" in line or "fail" in line], lines
    finally:
        cl.remove_dirs(crash.left)


def test_runc_guard_leaves_no_cgroup_bundle_or_record(
    guarded: cl.GuardedLab, ctd: cl.Containerd, ns: str
) -> None:
    """Through runc-guard the same crash leaves 0 directories, no bundle and no pending record.

    The task made a child cgroup of its own in every hierarchy: removed too, leaf first.
    """
    crash = cl.path_b_crash(ctd, ns, cl.guard_binary(), delay=1.5, nested=True)
    try:
        assert crash.left == [], [e for e in cl.guard_events(guarded.settings)
                                  if e.get("container_id") == crash.task_id]
        assert crash.bundle_gone
        assert not [r for r in cl.pending_records(guarded.settings)
                    if r.startswith(crash.task_id + "@")]
        stats = cl.delete_stats(guarded.settings, {crash.task_id})
        assert [s["outcome"] for s in stats] == ["removed"]
        # It had to wait for the held children *before* runc ran (init was dead), so
        # runc's own removal succeeded, the nested cgroups included.
        assert int(str(stats[0]["waited_ms"])) > 0
    finally:
        cl.remove_dirs(crash.left)
