"""runc-guard in front of other runtimes: a wrapper that execs runc (nvidia-style), and crun."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from labkit import containerd as cl
from labkit import prereq, runtimes

pytestmark = pytest.mark.kernel

#: Path B teardown of the stock control on the v1 layout: 2 s leaks on crun 1.8.1 and 1.28 alike.
CRUN_TEARDOWN = 2.0


def test_wrapper_alone_leaks(guarded: cl.GuardedLab, ctd: cl.Containerd, ns: str) -> None:
    """Control: a wrapper that execs runc 1.1.5 inherits its leak."""
    wrapper = cl.write_wrapper(guarded.workdir)
    crash = cl.path_b_crash(ctd, ns, wrapper, delay=1.0)
    try:
        assert len(crash.left) >= 8, crash.left
        assert any(f"delete --force {crash.task_id}" in c for c in cl.wrapper_calls(guarded.workdir))
    finally:
        cl.remove_dirs(crash.left)


def test_runc_guard_in_front_of_a_wrapper(guarded: cl.GuardedLab, ctd: cl.Containerd, ns: str) -> None:
    """runc-guard -> wrapper -> runc, chosen by the [runtimes] alias: 0 directories left."""
    crash = cl.path_b_crash(ctd, ns, guarded.alias(cl.WRAPPER_ALIAS), delay=1.5)
    try:
        assert crash.left == []
        assert crash.bundle_gone
        calls = [c for c in cl.wrapper_calls(guarded.workdir) if crash.task_id in c]
        assert any(" create " in f" {c} " for c in calls), calls
        assert any(f"delete --force {crash.task_id}" in c for c in calls), calls
        stats = cl.delete_stats(guarded.settings, {crash.task_id})
        assert [s["outcome"] for s in stats] == ["removed"]
    finally:
        cl.remove_dirs(crash.left)


@pytest.fixture(scope="module")
def runtime_from_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cl.GuardedLab]:
    """containerd whose environment names the wrapper in RUNC_GUARD_RUNTIME."""
    workdir = str(tmp_path_factory.mktemp("rgctd-envruntime"))
    wrapper = os.path.join(workdir, "stand-in-wrapper")  # written by guarded_containerd
    try:
        with cl.guarded_containerd(workdir, RUNC_GUARD_RUNTIME=wrapper) as lab:
            yield lab
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_runc_guard_runtime_variable_puts_the_wrapper_behind_it(
    runtime_from_env: cl.GuardedLab,
) -> None:
    """runc-guard itself as BinaryName, RUNC_GUARD_RUNTIME=<wrapper>: 0 directories left."""
    lab = runtime_from_env.containerd
    with cl.namespace(lab) as ns:
        crash = cl.path_b_crash(lab, ns, cl.guard_binary(), delay=1.5)
        try:
            assert crash.left == []
            calls = cl.wrapper_calls(runtime_from_env.workdir)
            assert any(f"delete --force {crash.task_id}" in c for c in calls), calls
        finally:
            cl.remove_dirs(crash.left)


#: crun versions: Debian 12's and sid's (labkit.runtimes). Both warn, delete their state and exit 0
#: when a cgroup stays busy: the runc 1.1 failure mode.
CRUNS = ["1.8.1", "1.28"]


@pytest.fixture(scope="module", params=CRUNS, ids=lambda v: f"crun-{v}")
def legacy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrunLab]:
    """containerd with only the v1 hierarchies: crun refuses this host's hybrid layout
    ("cgroups in hybrid mode not supported, drop all controllers from cgroupv2": the
    v2 tree has hugetlb), and 1.8 fails under pure v2 here (setrlimit RLIMIT_MEMLOCK: EPERM)."""
    if request.param == "1.8.1":
        prereq.require(shutil.which("crun"), "crun (make deps installs it)")
        crun = cl.CRUN
    else:
        crun = runtimes.require(runtimes.CRUN_128)
    with cl.guarded_containerd_in(tmp_path_factory, "rgctd-legacy", cl.LEGACY, crun=crun) as lab:
        yield CrunLab(lab, crun)


@dataclass
class CrunLab:
    lab: cl.GuardedLab
    crun: str


def test_stock_crun_leaks(legacy: CrunLab) -> None:
    """Control: crun warns and exits 0 on a busy cgroup; a 2 s teardown leaks every hierarchy."""
    lab = legacy.lab.containerd
    with cl.namespace(lab) as ns:
        crash = cl.path_b_crash(lab, ns, legacy.crun, delay=CRUN_TEARDOWN)
        try:
            assert crash.bundle_gone
            assert len(crash.left) >= 8, crash.left
        finally:
            cl.remove_dirs(crash.left)


def test_runc_guard_in_front_of_crun(legacy: CrunLab) -> None:
    """runc-guard -> crun, chosen by the [runtimes] alias: 0 directories left."""
    lab = legacy.lab.containerd
    with cl.namespace(lab) as ns:
        crash = cl.path_b_crash(lab, ns, legacy.lab.alias(cl.CRUN_ALIAS), delay=2.0)
        try:
            assert crash.bundle_gone
            assert crash.left == []
            stats = cl.delete_stats(legacy.lab.settings, {crash.task_id})
            assert [s["outcome"] for s in stats] == ["removed"]
        finally:
            cl.remove_dirs(crash.left)
