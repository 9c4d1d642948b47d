"""The systemd cgroup driver inside a booted systemd: stock runc vs runc-guard, per teardown length.

One machine (labkit.systemd) serves the whole module: Debian 12 under
systemd-nspawn, its containerd 1.6.20 with ``SystemdCgroup = true``, tasks
started by ``ctr run --runc-systemd-cgroup`` in a kubelet-style pod slice
(``kubepods-burstable-pod<uid>.slice:cri-containerd:<id>``), host PID, three
children held by a frozen freezer cgroup inside the machine's own freezer
hierarchy. The figures of every scenario are printed in pytest's summary.

A second machine, the same root running Debian sid's containerd 2.1 with its
own shim (``machine_21``, from Debian's archive through ``labkit.runtimes``),
serves only the tests that name it: the finisher's heal and its stock control,
on the containerd a node gets with runc 1.3. It boots when the first of them runs.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator

import pytest

from integration.conftest import SUMMARY_KEY
from labkit import containerd as cl
from labkit import prereq, runtimes
from labkit import systemd as sl
from labkit.kernel import unique, wait_for
from runc_guard.delete import systemd_scope

pytestmark = pytest.mark.kernel

V1_CONTROLLERS = ["blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "pids"]


def booted(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config, containerd: str
) -> Iterator[sl.Machine]:
    """A booted lab machine running ``containerd`` (the root built once per cache key, always stopped)."""
    prereq.require_none(sl.missing())
    image = sl.ensure_image()
    base = str(tmp_path_factory.mktemp("rgsd"))
    with sl.booted_machine(base, image, containerd=containerd) as m:
        built = "cached" if image.build_s is None else f"{image.build_s:.1f} s now"
        pytestconfig.stash[SUMMARY_KEY].append(
            f"systemd lab (containerd {m.containerd_version()}): debootstrap {image.recorded_build_s:.1f} s"
            f" ({built}), boot {m.boot_s:.2f} s"
        )
        yield m


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[sl.Machine]:
    """The module's machine: Debian's containerd 1.6.20."""
    yield from booted(tmp_path_factory, pytestconfig, cl.CONTAINERD_16)


@pytest.fixture(scope="module")
def machine_21(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[sl.Machine]:
    """The same root running containerd 2.1 and its shim (not to be had: fails under CI, else skips)."""
    cl.require_build(cl.CONTAINERD_21)
    runc_13()
    yield from booted(tmp_path_factory, pytestconfig, cl.CONTAINERD_21)


@pytest.fixture(params=[cl.CONTAINERD_16, cl.CONTAINERD_21], ids=lambda name: f"containerd-{name}")
def any_machine(request: pytest.FixtureRequest) -> sl.Machine:
    """A test that must hold on both containerds: the module's machine, then the 2.1 one."""
    name = "machine" if request.param == cl.CONTAINERD_16 else "machine_21"
    found: sl.Machine = request.getfixturevalue(name)
    return found


@pytest.fixture
def ns() -> str:
    """A fresh containerd namespace (no machine of its own: tests name theirs)."""
    return unique("rgsd")


def runc_13() -> str:
    """sid's runc 1.3, bound into the machine at the path it has on the host (labkit.runtimes)."""
    return runtimes.require(runtimes.RUNC_13)


def binary(name: str) -> str:
    return {
        "runc-1.1.5": sl.STOCK_RUNC,
        "guard-1.1.5": sl.GUARD,
        "guard-1.3": sl.GUARD_13,
    }[name]


def needs(name: str) -> str:
    if name == "runc-1.3":
        return runc_13()
    if name.endswith("1.3"):
        runc_13()
    return binary(name)


def line(summary: list[str], label: str, crash: sl.CrashOutcome, machine: sl.Machine) -> None:
    stats = sl.guard_stats(machine, crash.task.id) if "guard" in label else []
    outcome = ",".join(str(s["outcome"]) for s in stats) or "-"
    killed = any("signal: killed" in e for e in crash.containerd_errors)
    summary.append(
        f"{label:<12} teardown {crash.delay:>4.1f} s: {len(crash.dirs_left)} dirs "
        f"({','.join(crash.hierarchies_left()) or '-'}), scope {crash.unit.get('ActiveState')}"
        f"/{crash.unit.get('Result')}, runc state {'left' if crash.state_left else 'gone'}, "
        f"bundle {'gone' if crash.bundle_gone else 'kept'}, cleanup {crash.cleanup_s:.1f} s, "
        f"containerd {'killed the cleanup' if killed else 'ok'}"
        f", runc-guard outcome {outcome}"
    )


# -- what runc records ------------------------------------------------------------


@pytest.mark.parametrize("runtime", ["runc-1.1.5", "runc-1.3"])
def test_state_records_the_systemd_driver_and_the_scope(machine: sl.Machine, ns: str, runtime: str) -> None:
    """runc's state.json says the systemd driver made the cgroups and names the scope unit.

    That is what runc-guard must rely on: the shim's dead-shim ``delete --force``
    comes without ``--systemd-cgroup``.
    """
    task = sl.run_task(machine, ns, needs(runtime))
    try:
        with open(task.runc_state()) as f:
            doc = json.load(f)
        ref = systemd_scope.scope_from_state(doc)
        assert ref is not None and ref.unit == task.unit and ref.slice == task.pod_slice
        cgroups = doc["config"]["cgroups"]
        assert cgroups["Systemd"] is True and cgroups["scope_prefix"] == "cri-containerd"
        # Every v1 controller, name=systemd and the cgroup2 tree: the 10 scope paths.
        assert len(doc["cgroup_paths"]) == 10
        assert all(p.endswith(task.relative) for p in doc["cgroup_paths"].values())
        assert task.unit_state()["ActiveState"] == "active"
    finally:
        sl.remove_task(task)


# -- Path A -----------------------------------------------------------------------


@pytest.mark.parametrize("runtime", ["runc-1.1.5", "guard-1.1.5"])
def test_path_a_kill_then_delete_leaves_nothing(
    machine: sl.Machine, ns: str, runtime: str, summary: list[str]
) -> None:
    """Path A: ``ctr task kill`` then ``ctr task delete`` with children dying 1 s: 0 dirs, no unit."""
    task = sl.run_task(machine, ns, needs(runtime))
    hold = sl.freezer_hold(machine)
    try:
        hold.hold(task.children())
        machine.ctr(ns, "task", "kill", "-s", "KILL", task.id)
        assert wait_for(lambda: "STOPPED" in machine.ctr(ns, "task", "ls").stdout, 10, 0.1)
        started = time.monotonic()
        timer = threading.Timer(1.0, hold.release)
        timer.start()
        delete = machine.ctr(ns, "task", "delete", task.id, check=False)
        timer.join()
        took = time.monotonic() - started
        wait_for(lambda: not task.host_pids(), 5)
        time.sleep(0.3)
        summary.append(
            f"{runtime:<12} Path A (1 s teardown): exit {delete.returncode}, "
            f"{len(task.host_dirs())} dirs, scope {task.unit_state().get('LoadState')}, {took:.1f} s"
        )
        assert delete.returncode == 0, delete.stderr
        assert task.host_dirs() == []
        assert task.unit_state()["LoadState"] == "not-found"
    finally:
        hold.destroy()
        sl.remove_task(task)


# -- Path B -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("runtime", "delay"),
    [
        ("runc-1.1.5", 2.5),
        ("guard-1.1.5", 2.5),
        ("runc-1.3", 2.5),
        ("guard-1.3", 2.5),
        ("runc-1.1.5", 4.0),
        ("runc-1.3", 4.0),
    ],
)
def test_path_b_inside_the_budgets_leaves_nothing(
    machine: sl.Machine, ns: str, runtime: str, delay: float, summary: list[str]
) -> None:
    """Teardown 2.5-4 s (< containerd's 5 s, < the scope's 5 s stop timeout): 0 dirs, unit collected.

    runc's systemd driver stops the scope and systemd waits for it to empty;
    nothing is left for anyone, stock or guarded (runc-guard within its own
    deadline; 4 s with runc-guard: see the deadline tests below).
    """
    crash = sl.path_b(machine, ns, needs(runtime), delay=delay)
    try:
        line(summary, runtime, crash, machine)
        assert crash.dirs_left == []
        assert crash.unit["LoadState"] == "not-found"
        assert crash.bundle_gone and not crash.state_left
    finally:
        sl.remove_task(crash.task)


@pytest.mark.parametrize("runtime", ["runc-1.1.5", "runc-1.3"])
def test_stock_path_b_past_both_budgets_leaks_and_fails_the_scope(
    machine: sl.Machine, ns: str, runtime: str, summary: list[str]
) -> None:
    """Control, teardown 6 s (> containerd's 5 s and > the 5 s stop timeout), stock runc.

    containerd SIGKILLs the shim's cleanup (``signal: killed``) while runc still
    waits on systemd; the scope ends ``failed`` (Result=timeout) and every v1
    controller keeps the scope's directory; runc's state and the bundle stay.
    """
    crash = sl.path_b(machine, ns, needs(runtime), delay=6.0)
    try:
        line(summary, runtime, crash, machine)
        assert any("signal: killed" in e for e in crash.containerd_errors), crash.containerd_errors
        assert crash.hierarchies_left() == V1_CONTROLLERS
        assert (crash.unit["ActiveState"], crash.unit["Result"]) == ("failed", "timeout")
        assert crash.state_left
    finally:
        sl.remove_task(crash.task)


def test_stock_path_b_with_systemds_default_stop_timeout(
    machine: sl.Machine, ns: str, summary: list[str]
) -> None:
    """Control, teardown 6 s with systemd's default 90 s stop timeout: the scope stops cleanly.

    systemd waits out the 6 s and collects the unit, but containerd has already
    killed the cleanup at 5 s: runc's state, the bundle and a directory in every
    v1 controller stay.
    """
    with sl.scope_stop_timeout(machine, 90):
        crash = sl.path_b(machine, ns, sl.STOCK_RUNC, delay=6.0)
    try:
        line(summary, "runc-1.1.5/90s", crash, machine)
        assert any("signal: killed" in e for e in crash.containerd_errors), crash.containerd_errors
        assert crash.unit["LoadState"] == "not-found"
        assert crash.hierarchies_left() == V1_CONTROLLERS
        assert crash.state_left
    finally:
        sl.remove_task(crash.task)


@pytest.mark.parametrize("runtime", ["runc-1.1.5", "runc-1.3"])
def test_runtime_delete_waits_for_systemds_whole_stop_job(
    machine: sl.Machine, ns: str, runtime: str, summary: list[str]
) -> None:
    """What runc's systemd driver costs on Path B, with no containerd budget around it.

    Init dead, children held for good, ``<runc> delete --force`` by hand: runc
    waits for systemd's stop job, which takes the stop timeout twice (SIGTERM,
    then the final SIGKILL: 2 x 5 s here, 2 x 90 s on a default systemd) before
    it turns the scope ``failed``. runc 1.3 caps that wait at 30 s, runc 1.1.5
    waits it out; either way far past containerd's 5 s budget. runc 1.1.5 then
    exits 0 with its state gone, runc 1.3 exits 1 and keeps it (after ~1 s of
    rmdir retries per directory); both leave the v1 directories.
    """
    rt = needs(runtime)
    task = sl.run_task(machine, ns, rt)
    hold = sl.freezer_hold(machine)
    try:
        hold.hold(task.children())
        os.kill(task.init_host_pid(), 9)
        assert wait_for(lambda: "STOPPED" in machine.ctr(ns, "task", "ls").stdout, 10, 0.1)
        started = time.monotonic()
        delete = machine.run(rt, "--root", f"{sl.RUNC_ROOT}/{ns}", "delete", "--force", task.id, check=False)
        took = time.monotonic() - started
        unit = task.unit_state()
        summary.append(
            f"{runtime:<12} delete --force by hand, children held: {took:.1f} s, exit {delete.returncode}, "
            f"{len(task.host_dirs())} dirs, scope {unit['ActiveState']}/{unit['Result']}, "
            f"state {'kept' if os.path.exists(task.runc_state()) else 'gone'}"
        )
        assert took >= 2 * sl.STOP_TIMEOUT_S - 0.5 > sl.SHIM_CLEANUP_BUDGET_S
        assert len(task.host_dirs()) >= 7
        if runtime == "runc-1.1.5":
            assert delete.returncode == 0 and not os.path.exists(task.runc_state())
            assert (unit["ActiveState"], unit["Result"]) == ("failed", "timeout")
        else:
            assert delete.returncode == 1 and os.path.exists(task.runc_state())
    finally:
        hold.destroy()
        sl.remove_task(task)


# -- sweep ------------------------------------------------------------------------


def sweep(machine: sl.Machine, *args: str) -> dict[str, object]:
    """``runc-guardctl sweep --min-age 0 --format json`` inside the machine, from the checkout."""
    out = machine.run(f"{sl.GUARD_BIN}/runc-guardctl", "sweep", "--min-age", "0", "--format", "json", *args)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def actions_for(report: dict[str, object], container_id: str) -> list[str]:
    entries = report["containers"]
    assert isinstance(entries, list)
    return sorted(str(e["action"]) for e in entries if e["id"] == container_id)


def test_sweep_resets_the_failed_scope_once_the_container_is_gone(
    machine: sl.Machine, ns: str, summary: list[str]
) -> None:
    """A failed scope outlives even containerd's own recovery; the sweep resets it through systemd.

    Right after the 6 s crash runc's state is there: the sweep keeps the 8 dirs
    and the failed unit (``runtime_state``). containerd's restart re-runs the
    dead shim's cleanup with nothing left dying: runc removes the dirs and its
    state, but the scope stays ``failed`` for good. The sweep then
    ``reset-failed``s it and systemd collects the unit. The audit reports it first.
    """
    crash = sl.path_b(machine, ns, sl.STOCK_RUNC, delay=6.0)
    task = crash.task
    try:
        first = sweep(machine)
        assert actions_for(first, task.id) == ["kept:runtime_state", "kept:runtime_state"]
        assert len(task.host_dirs()) == len(V1_CONTROLLERS)
        machine.systemctl("restart", "containerd", check=True)
        assert wait_for(task.gone, 20, 0.1), task.containerd_lines()[-3:]
        assert task.host_dirs() == [] and not os.path.exists(task.runc_state())
        assert task.unit_state()["ActiveState"] == "failed"
        audit = machine.run(
            f"{sl.GUARD_BIN}/runc-guardctl", "audit", "--min-age", "0", "--format", "json", check=False
        )
        assert audit.returncode == 1, audit.stdout  # Node Problem Detector: problem
        report = json.loads(audit.stdout)
        assert [s["action"] for s in report["failed_scopes"] if s["id"] == task.id] == ["would_reset_failed"]
        assert "failed scope unit(s) of gone containers" in report["message"]
        dry = sweep(machine, "--dry-run")
        assert actions_for(dry, task.id) == ["would_reset_failed"]
        second = sweep(machine)
        assert actions_for(second, task.id) == ["scope_reset_failed"]
        assert task.unit_state()["LoadState"] == "not-found"
        summary.append(
            "sweep: failed scope kept while runc state exists; after containerd's recovery "
            "(0 dirs, scope still failed) reset-failed -> unit collected"
        )
    finally:
        sl.remove_task(task)


# -- doctor -------------------------------------------------------------------------


def test_doctor_says_containers_use_the_systemd_driver(machine: sl.Machine, ns: str) -> None:
    """Inside the booted systemd, doctor reports containerd's runc handler and a running task as systemd."""
    task = sl.run_task(machine, ns, sl.STOCK_RUNC)
    try:
        out = machine.run(f"{sl.GUARD_BIN}/runc-guardctl", "doctor", "--format", "json", check=False)
        report = json.loads(out.stdout)
        driver = report["cgroup_driver"]
        assert driver["systemd_pid1"] is True
        assert driver["containerd_handlers"] == {"runc": "systemd"}
        assert driver["containers"].get("systemd", 0) >= 1
        assert not [p for p in report["problems"] if "cgroup driver" in p]
    finally:
        sl.remove_task(task)


# -- runc-guard past the budgets (needs the WIP wiring in runc_guard/delete/run.py) -----------------


@pytest.mark.parametrize("runtime", ["guard-1.1.5", "guard-1.3"])
def test_guard_reports_before_containerds_kill_and_the_retry_finishes(
    machine: sl.Machine, ns: str, runtime: str, summary: list[str]
) -> None:
    """Teardown 6 s through runc-guard: it reports at its deadline, and the scope is not failed.

    containerd never has to kill it (no ``signal: killed``); its journal entry
    says ``deadline``; the pending record and runc's state stay. runc-guard starts
    no stop job of its own, so systemd collects the scope once its last process
    exits, where stock runc's stop job ends it ``failed`` (Result=timeout, the
    control above). The next delete of the same id (what containerd's retry or
    the sweep's re-drive runs) runs the runtime's delete and removes the v1
    leftovers: nothing is left.
    """
    guard = needs(runtime)
    records_before = set(sl.pending_records(machine))
    crash = sl.path_b(machine, ns, guard, delay=6.0)
    task = crash.task
    try:
        line(summary, runtime, crash, machine)
        assert not [e for e in crash.containerd_errors if "signal: killed" in e]
        first = sl.guard_stats(machine, task.id)[0]
        assert first["outcome"] == "deadline", sl.guard_stats(machine, task.id)
        entries: list[dict[str, object]] = []

        def reported() -> bool:  # sent by the reporter the delete detached, after it returned
            entries[:] = [
                e for e in machine.journal("SYSLOG_IDENTIFIER=runc-guard", "EVENT=delete")
                if task.id in str(e.get("MESSAGE"))
            ]
            return bool(entries)

        assert wait_for(reported)
        assert "SYSTEMD_SCOPE" not in entries[-1]  # no stop of the scope before the runtime
        assert set(sl.pending_records(machine)) - records_before
        assert crash.state_left and crash.unit["LoadState"] == "not-found", crash.unit
        seen = len(entries)
        retry = machine.run(
            guard, "--root", f"{sl.RUNC_ROOT}/{ns}", "delete", "--force", task.id, check=False
        )
        assert retry.returncode == 0, retry.stderr
        assert wait_for(lambda: reported() and len(entries) > seen)
        assert task.host_dirs() == []
        assert task.unit_state()["LoadState"] == "not-found"
        assert not os.path.exists(task.runc_state())
        assert set(sl.pending_records(machine)) == records_before
        summary.append(f"{runtime:<12} retry: exit 0, 0 dirs, unit collected, record cleared")
    finally:
        sl.remove_task(task)


def test_guard_leaves_a_private_pid_scope_as_stock_does(
    machine: sl.Machine, ns: str, summary: list[str]
) -> None:
    """Path B, own PID namespace, children held 7 s (> the 5 s stop timeout): no unit left, as stock.

    Stock runc's ``delete --force`` sees the exiting init as running and polls for
    it until containerd kills the cleanup at 5 s: it never asks systemd to stop the
    scope, and systemd collects the scope once its last process exits. A stop job
    started by runc-guard whose stop timeout passes first would end ``failed``
    (Result=timeout) instead: the VM node's flaky cell (issue 30, case 10).
    """
    for label in ("runc-1.3", "guard-1.3"):
        crash = sl.path_b(machine, ns, needs(label), delay=7.0, private_pid=True)
        try:
            line(summary, f"{label} pid=own", crash, machine)
            assert crash.unit["LoadState"] == "not-found", (label, crash.unit)
            # Neither got to the runtime's destroy: runc was killed polling, runc-guard reported.
            assert crash.state_left, label
            if label.startswith("guard"):
                assert [s["outcome"] for s in sl.guard_stats(machine, crash.task.id)] == ["deadline"]
        finally:
            sl.remove_task(crash.task)


@pytest.mark.parametrize("runtime", ["runc-1.1.5", "guard-1.1.5"])
def test_serving_shim_delete_of_a_slow_teardown_finishes_as_stock(
    machine: sl.Machine, ns: str, runtime: str, summary: list[str]
) -> None:
    """Path A (shim alive, ``ctr task delete``), host PID, children held 6 s, the scope's stop
    timeout systemd's default 90 s: stock runc waits on systemd's stop job and finishes (exit 0,
    nothing left). runc-guard under the serving shim has at least 7 s, not the dead shim's 4 s:
    it finishes too (issue 30, case 9; with 4 s: exit 75, the state and dirs kept)."""
    with sl.scope_stop_timeout(machine, 90):
        done = sl.path_a(machine, ns, needs(runtime), delay=6.0)
    try:
        summary.append(
            f"{runtime:<12} path A, serving shim, teardown 6.0 s: exit {done.status} in {done.took_s} s, "
            f"{len(done.dirs_left)} dirs, scope {done.unit.get('LoadState')}/{done.unit.get('ActiveState')}, "
            f"runc state {'left' if done.state_left else 'gone'}"
        )
        assert done.status == 0, done.stderr
        assert done.took_s >= 5.5, done  # the teardown really held the delete
        assert done.dirs_left == [] and not done.state_left, done
        assert done.unit["LoadState"] == "not-found", done.unit
    finally:
        sl.remove_task(done.task)


@pytest.mark.parametrize("runtime", ["guard-1.1.5", "guard-1.3"])
@pytest.mark.parametrize("delay", [3.6, 4.0])
def test_guard_deadline_near_the_budget_leaves_nothing_for_a_4s_teardown(
    machine: sl.Machine, ns: str, runtime: str, delay: float, summary: list[str]
) -> None:
    """With ``delete_timeout = 4.5`` (counted from runc-guard's start) a teardown of 3.6-4 s
    ends like stock runc's: 0 dirs, unit gone.

    With a 3 s deadline the same crash leaves the 8 v1 dirs and runc's state
    for the retry (runc-guard gives up before systemd's stop job ends), where
    stock runc, waiting on systemd, finishes inside containerd's 5 s.
    """
    guard = needs(runtime)
    with sl.containerd_environment(machine, RUNC_GUARD_DELETE_TIMEOUT="4.5"):
        crash = sl.path_b(machine, ns, guard, delay=delay)
    try:
        line(summary, f"{runtime}@4.5", crash, machine)
        assert crash.dirs_left == []
        assert crash.unit["LoadState"] == "not-found"
        assert not crash.state_left and crash.bundle_gone
        # What containerd saw: no error at all, so no 'signal: killed' of its cleanup (the
        # cleanup's duration is in the summary line as a figure, not a threshold here).
        assert not crash.containerd_errors
    finally:
        sl.remove_task(crash.task)


# -- the finisher, on containerd 1.6.20 and 2.1 (last: the 2.1 machine boots for these) ----


def test_the_finisher_heals_a_6s_teardown_without_a_sweep(
    any_machine: sl.Machine, ns: str, summary: list[str]
) -> None:
    """Teardown 6 s through runc-guard fronting runc 1.3, shipped defaults (the finisher on),
    no retry and no sweep: within 60 s of the last process's death nothing is left.

    The delete replies at its deadline with its record kept
    (``test_guard_reports_before_containerds_kill_and_the_retry_finishes``); the finisher it
    detached waits until the cgroups are empty and no dead-shim cleanup runs, then re-runs the
    runtime's delete for the kept state and removes the rest: 0 dirs, the scope collected (never
    ``failed``, looked at every 0.5 s), no runc state, no record of the container, the delete's
    second entry ``finished_late``. On containerd 1.6.20 and on 2.1 (its own shim; the
    control: the test after this one).
    """
    machine = any_machine
    guard = needs("guard-1.3")
    crash = sl.path_b(machine, ns, guard, delay=6.0)
    task = crash.task
    try:
        released = time.monotonic()  # path_b returns 0.5 s after the held children are gone
        line(summary, f"guard-1.3  containerd {machine.containerd.build}", crash, machine)
        states = [crash.unit.get("ActiveState", "-")]

        def records() -> list[str]:  # this container's only: an earlier test's finisher may still run
            return [r for r in sl.pending_records(machine) if r.startswith(f"{task.id}@")]

        def healed() -> bool:
            states.append(task.unit_state().get("ActiveState", "-"))
            return not task.host_dirs() and not os.path.exists(task.runc_state()) and not records()

        done = wait_for(healed, 60, 0.5)
        took = time.monotonic() - released
        unit = task.unit_state()
        outcomes = [s["outcome"] for s in sl.guard_stats(machine, task.id)]
        summary.append(f"guard-1.3  containerd {machine.containerd.build} 6 s teardown, finisher:"
                       f" healed={done} {took:.1f} s after path_b returned, unit {unit.get('LoadState')}"
                       f"/{unit.get('ActiveState', '-')} (seen: {','.join(dict.fromkeys(states))}),"
                       f" outcomes {outcomes}")
        assert not [e for e in crash.containerd_errors if "signal: killed" in e]
        assert done, (task.host_dirs(), os.path.exists(task.runc_state()), records())
        assert unit["LoadState"] == "not-found", unit
        assert "failed" not in states, states
        assert outcomes == ["deadline", "finished_late"], outcomes
    finally:
        sl.remove_task(task)


def test_stock_runc_13_on_containerd_21_leaves_what_the_finisher_heals(
    machine_21: sl.Machine, ns: str, summary: list[str]
) -> None:
    """Control of the finisher's test on containerd 2.1: the same 6 s crash through stock runc 1.3.

    As on 1.6.20: runc waits on systemd's stop job, containerd 2.1 SIGKILLs the dead
    shim's cleanup at 5 s (``failed to delete dead shim ... signal: killed``), the
    scope ends ``failed`` (Result=timeout), every v1 controller keeps the scope's
    directory, runc's state and the bundle stay; 10 s later nothing has changed.
    """
    crash = sl.path_b(machine_21, ns, needs("runc-1.3"), delay=6.0)
    task = crash.task
    try:
        line(summary, "runc-1.3  containerd 2.1", crash, machine_21)
        assert any("signal: killed" in e for e in crash.containerd_errors), task.containerd_lines()[-3:]
        assert crash.hierarchies_left() == V1_CONTROLLERS
        assert (crash.unit["ActiveState"], crash.unit["Result"]) == ("failed", "timeout")
        assert crash.state_left and not crash.bundle_gone
        time.sleep(10)  # nobody comes back for it: the finisher's heal took less than that
        assert len(task.host_dirs()) == len(crash.dirs_left) and os.path.exists(task.runc_state())
        assert task.unit_state()["ActiveState"] == "failed"
    finally:
        sl.remove_task(task)
