"""Path A, the normal path: ``ctr task kill -s KILL`` then ``ctr task delete`` while children hang."""

from __future__ import annotations

import pytest

from labkit import containerd as cl
from labkit.kernel import wait_for

pytestmark = pytest.mark.kernel


def test_stock_runc_delete_succeeds_and_leaks(ctd: cl.Containerd, ns: str) -> None:
    """Control: stock runc's delete exits 0 while the held children keep the cgroups busy."""
    with cl.path_a(ctd, ns, cl.STOCK_RUNC, release_after=1.0) as run:
        assert run.delete.returncode == 0, run.delete.stderr
        wait_for(lambda: not run.task.pids(), 5)
        left = run.task.cgroup_dirs()
        try:
            assert len(left) >= 8, left
        finally:
            cl.remove_dirs(left)


def test_runc_guard_delete_waits_and_removes_everything(
    guarded: cl.GuardedLab, ctd: cl.Containerd, ns: str
) -> None:
    """Through runc-guard the delete returns once the children died, with 0 directories left."""
    with cl.path_a(ctd, ns, cl.guard_binary(), release_after=1.0) as run:
        left = run.task.cgroup_dirs()
        try:
            assert run.delete.returncode == 0, run.delete.stderr
            assert left == []
            assert run.task.gone()
            assert not [r for r in cl.pending_records(guarded.settings)
                        if r.startswith(run.task.id + "@")]
        finally:
            cl.remove_dirs(left)
