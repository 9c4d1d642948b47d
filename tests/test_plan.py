"""The delete's frozen plan: who may be killed, waited for, watched and thawed, from the state alone."""

from __future__ import annotations

import pytest

from runc_guard.delete.plan import NO_PLAN, DeletePlan
from runc_guard.delete.state import PID_HOST, PID_JOINED, PID_PRIVATE, PID_UNKNOWN, ContainerState
from tests.fakes import FakeCgroupFs, FakeClock

PATHS = ["/sys/fs/cgroup/freezer/c1", "/sys/fs/cgroup/memory/c1"]


def _state(namespace: str) -> ContainerState:
    return ContainerState("c1", {"freezer": PATHS[0], "memory": PATHS[1]}, 42, 7, pid_namespace=namespace)


def _fs() -> FakeCgroupFs:
    fs = FakeCgroupFs(FakeClock())
    for path in PATHS:
        fs.add(path)
    return fs


@pytest.mark.parametrize(
    ("namespace", "kill_stragglers", "may_kill", "watch_foreign", "wait_first"),
    [
        (PID_HOST, True, True, False, True),
        (PID_JOINED, True, True, False, True),
        (PID_HOST, False, False, False, False),  # kill_stragglers off: the runtime kills first
        (PID_PRIVATE, True, False, True, True),  # the kernel kills a dead init's namespace: waiting is safe
        (PID_PRIVATE, False, False, True, True),
        (PID_UNKNOWN, True, False, False, False),  # not known: act as if runc-guard were not there
    ],
)
def test_the_kill_policy_follows_the_pid_namespace(
    namespace: str, kill_stragglers: bool, may_kill: bool, watch_foreign: bool, wait_first: bool
) -> None:
    plan = DeletePlan.of(_state(namespace), PATHS, _fs(), kill_stragglers)
    assert (plan.may_kill, plan.watch_foreign, plan.wait_first) == (may_kill, watch_foreign, wait_first)
    assert plan.paths == tuple(PATHS) and plan.may_thaw


def test_a_freezer_frozen_before_the_delete_is_the_owners_pause() -> None:
    fs = _fs()
    fs.freezers[PATHS[0]] = True
    plan = DeletePlan.of(_state(PID_HOST), PATHS, fs, True)
    assert plan.paused == frozenset({PATHS[0]})
    fs.freezers[PATHS[0]] = False
    assert plan.paused == frozenset({PATHS[0]}), "frozen: read once, at the start"


def test_a_records_leftovers_are_only_removed() -> None:
    plan = DeletePlan.of_record(PATHS)
    assert plan.paths == tuple(PATHS)
    assert not (plan.may_kill or plan.watch_foreign or plan.wait_first or plan.may_thaw or plan.paused)
    assert NO_PLAN.paths == ()
    with pytest.raises(AttributeError):
        plan.may_kill = True  # type: ignore[misc]


def test_only_a_freeze_that_came_during_the_delete_is_thawed() -> None:
    fs = _fs()
    fs.freezers[PATHS[0]] = True
    plan = DeletePlan.of(_state(PID_HOST), PATHS, fs, True)  # paused by its owner before the delete
    assert plan.thaw_left_frozen(fs) == [] and fs.freezers[PATHS[0]] is True
    fs.freezers[PATHS[0]] = False
    plan = DeletePlan.of(_state(PID_HOST), PATHS, fs, True)
    fs.freezers[PATHS[0]] = True  # the runtime's destroy froze it, then was stopped
    assert DeletePlan.of_record(PATHS).thaw_left_frozen(fs) == []
    assert plan.thaw_left_frozen(fs) == [PATHS[0]] and fs.freezers[PATHS[0]] is False


def test_the_deadlines_kill_reaches_only_a_member_of_the_plans_cgroups() -> None:
    fs = _fs()
    fs.add("/sys/fs/cgroup/memory/other", [99])
    fs.dirs[PATHS[1]] = [42]
    fs.alive.add(42)
    plan = DeletePlan.of(_state(PID_HOST), PATHS, fs, True)
    assert not plan.kill_member(fs, 99) and fs.killed == []
    assert plan.kill_member(fs, 42) and fs.killed == [42]
