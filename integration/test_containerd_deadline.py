"""A delete that outlives runc-guard's deadline inside containerd: a visible error, a kept record."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from labkit import containerd as cl
from labkit.kernel import wait_for

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def short_deadline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cl.GuardedLab]:
    """containerd whose runc-guard gives up after 1 s (RUNC_GUARD_DELETE_TIMEOUT); ``ctr task delete``
    goes through the serving shim, whose budget is at least 7 s (docs/deadline.md)."""
    with cl.guarded_containerd_in(tmp_path_factory, "rgctd-deadline", RUNC_GUARD_DELETE_TIMEOUT="1") as lab:
        yield lab


def test_delete_fails_with_runc_guards_reason_and_keeps_the_record(
    short_deadline: cl.GuardedLab,
) -> None:
    """containerd's error quotes runc-guard's --log reason; the pending record survives for the sweep."""
    lab = short_deadline.containerd
    with cl.namespace(lab) as ns, cl.path_a(lab, ns, cl.guard_binary(), release_after=None) as run:
        left = run.task.cgroup_dirs()
        try:
            assert run.delete.returncode != 0
            error = run.delete.stderr
            # The shim quotes the last "level":"error" line of --log as the whole reason
            # (runtimeError in containerd's runc shim); go-runc's own text would say
            # "exit status".
            assert "failed to delete task: runc-guard: cgroup " in error, error
            assert "still in use" in error
            assert "exit status" not in error
            assert "does not exist" not in error
            records = [r for r in cl.pending_records(short_deadline.settings)
                       if r.startswith(run.task.id + "@")]
            assert len(records) == 1
            assert left, "the held children keep the cgroups"
            # Once the children die, containerd's retry of the delete goes through.
            run.hold.release()
            wait_for(lambda: not run.task.pids(), 5)
            retry = lab.ctr(ns, "task", "delete", run.task.id, check=False)
            assert retry.returncode == 0, retry.stderr
            assert run.task.gone()
        finally:
            run.hold.release()
            wait_for(lambda: not run.task.pids(), 5)
            cl.remove_dirs(run.task.cgroup_dirs())
