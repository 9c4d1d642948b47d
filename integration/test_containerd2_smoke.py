"""Debian sid's containerd 2.1 (config v3, its own shim) + runc 1.3 in the private lab, through runc-guard."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from labkit import containerd as cl
from labkit import prereq, runtimes

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def lab2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cl.GuardedLab]:
    """containerd 2.1 whose runc-guard fronts runc 1.3 (RUNC_GUARD_RUNTIME)."""
    build = cl.require_build(cl.CONTAINERD_21)
    runc = cl.require_runc(cl.RUNC_1_3)
    prereq.require_none(cl.missing_prerequisites(build))
    with cl.guarded_containerd_in(tmp_path_factory, "rgctd21", build=build, runc=runc) as lab:
        yield lab


@pytest.fixture
def ns2(lab2: cl.GuardedLab) -> Iterator[str]:
    if not lab2.containerd.alive():
        pytest.fail(f"containerd 2.1 died:\n{lab2.containerd.log()[-2000:]}")
    with cl.namespace(lab2.containerd) as name:
        yield name


def test_lab_runs_containerd_2_1_with_its_own_ctr(lab2: cl.GuardedLab) -> None:
    """Client and server are both Debian's 2.1 build: the build's ctr talks to the build's containerd."""
    out = lab2.containerd.ctr("default", "version").stdout
    upstream = runtimes.upstream(runtimes.version(runtimes.CONTAINERD_21_PKG))
    assert upstream.startswith("2.1."), upstream
    assert out.count(f"Version:  {upstream}") == 2, out


def test_task_runs_and_is_deleted_through_runc_guard(lab2: cl.GuardedLab, ns2: str) -> None:
    """A task started with runc-guard as --runc-binary runs on runc 1.3 and deletes clean.

    The shim keeps runc's state in the lab's private /run/containerd/runc/<ns>/<id>;
    after ``ctr task delete`` neither that state nor a cgroup directory is left.
    """
    lab = lab2.containerd
    task = cl.run_task(lab, ns2, cl.guard_binary())
    assert os.path.exists(os.path.join(lab.runc_state(ns2, task.id), "state.json"))
    lab.ctr(ns2, "task", "kill", "-s", "KILL", task.id)
    assert cl.wait_for(lambda: task.status() == "STOPPED", 10, 0.05)
    lab.ctr(ns2, "task", "delete", task.id)
    assert task.gone()
    assert task.cgroup_dirs() == []
    assert not os.path.exists(lab.runc_state(ns2, task.id))
    deletes = [e for e in cl.guard_events(lab2.settings, "delete") if e.get("container_id") == task.id]
    assert deletes, "the delete never reached runc-guard"
    assert {e["runtime"] for e in deletes} == {lab.build.runc}


def test_stock_runc_1_3_leaks_on_path_b(lab2: cl.GuardedLab, ns2: str) -> None:
    """Control: dead shim + 2.5 s teardown: runc 1.3 exits 1, containerd only warns,
    cgroup dirs and runc's state dir stay."""
    lab = lab2.containerd
    crash = cl.path_b_crash(lab, ns2, lab.build.runc, delay=2.5)
    try:
        assert crash.bundle_gone
        assert crash.left, "stock runc 1.3 removed everything: the control did not leak"
        assert os.path.exists(lab.runc_state(ns2, crash.task_id))
        lines = lab.log_lines_for(crash.task_id)
        assert any("warnings while cleaning up dead shim" in line for line in lines), lines
    finally:
        cl.remove_dirs(crash.left)
