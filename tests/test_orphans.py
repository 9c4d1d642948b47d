"""Orphaned runtime state: found in flat and containerd roots, judged purely, re-driven by the sweep.

Runtime state directories are real files in a temp dir, a fake ``/proc``
holds the inits and shims, and the cgroups are the shared fake kernel.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from runc_guard.node import liveness
from runc_guard.node.audit import NPD_PROBLEM, audit, judge
from runc_guard.node.discovery import Discovery, add_orphans
from runc_guard.node.orphans import (
    ORPHAN,
    Orphans,
    Redrive,
    StateDir,
    StateFacts,
    find_states,
    live_shim_ids,
    read_state_facts,
    redrive,
    runtime_for,
    states_of,
)
from runc_guard.node.orphans import judge as judge_state
from runc_guard.node.sweep import RuntimeDirs, UnitFacts, decide
from tests.test_sweep import HIERARCHIES, NOW, POD, AgedFs, Recorder, add_unit, cid, sweeper

MOUNTS = {h.mount: h.fstype for h in HIERARCHIES}
DEAD_PID, LIVE_PID, ZOMBIE_PID, REUSED_PID, SHIM_PID = 4001, 4002, 4003, 4004, 4100
START = 777


def stat_line(pid: int, state: str, start: int) -> str:
    return f"{pid} (sh) {state} " + " ".join(["0"] * 18) + f" {start} 0 0\n"


@pytest.fixture
def proc(tmp_path: Path) -> str:
    return fake_proc(tmp_path)


def fake_proc(tmp_path: Path) -> str:
    """A fake /proc: a live init, a zombie, a recycled pid (other start time) and one shim."""
    root = tmp_path / "proc"
    for pid, state, start in ((LIVE_PID, "S", START), (ZOMBIE_PID, "Z", START), (REUSED_PID, "S", 999)):
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "stat").write_text(stat_line(pid, state, start))
        (root / str(pid) / "cmdline").write_bytes(b"sh\0")
    (root / str(SHIM_PID)).mkdir()
    (root / str(SHIM_PID) / "cmdline").write_bytes(
        b"/usr/bin/containerd-shim-runc-v2\0-namespace\0k8s.io\0-id\0"
        + cid(77).encode()
        + b"\0-address\0/run/containerd/containerd.sock\0"
    )
    (root / "self").mkdir()
    return str(root)


def write_state(
    root: Path,
    container_id: str,
    pid: int,
    *,
    crun: bool = False,
    paths: dict[str, str] | None = None,
    age: float = 3600,
    labels: list[str] | None = None,
) -> Path:
    """A runc state.json (or crun status) as the runtime keeps it, aged ``age`` seconds.

    runc's ``config.labels`` hold ``bundle=<dir>`` and every annotation (default: a plain bundle).
    """
    directory = root / container_id
    directory.mkdir(parents=True)
    if crun:
        doc: dict[str, object] = {
            "pid": pid,
            "process-start-time": START,
            "cgroup-path": f"/{POD}/{container_id}",
        }
        name = "status"
    else:
        doc = {
            "id": container_id,
            "init_process_pid": pid,
            "init_process_start": START,
            "cgroup_paths": paths
            if paths is not None
            else {h.mount.rsplit("/", 1)[-1]: f"{h.mount}/{POD}/{container_id}" for h in HIERARCHIES},
            "config": {"labels": labels if labels is not None else [f"bundle=/srv/bundles/{container_id}"]},
        }
        name = "state.json"
    (directory / name).write_text(json.dumps(doc))
    then = NOW - age
    for path in (directory / name, directory):
        os.utime(path, (then, then))
    return directory


def orphans_for(
    tmp_path: Path, proc: str, runs: list[tuple[StateDir, str]] | None = None, remove_state: bool = True
) -> Orphans:
    """An Orphans whose runtime is a recording fake: it deletes the state (or keeps it, like runc >= 1.2)."""

    def fake_run(state: StateDir, path: str, timeout: float) -> Redrive:
        if runs is not None:
            runs.append((state, path))
        if remove_state:
            for name in os.listdir(state.path):
                os.unlink(os.path.join(state.path, name))
            os.rmdir(state.path)
        code = 0 if remove_state else 1
        return Redrive(
            state.container_id,
            state.root,
            [path, "delete"],
            code,
            "" if remove_state else "unable to destroy container",
            0.01,
            not remove_state,
        )

    bundles = tmp_path / "bundles"
    return Orphans(
        roots=(str(tmp_path / "runc"),),
        named_roots=(str(tmp_path / "flat"),),
        has_bundle=lambda c: any((bundles / ns / c).exists() for ns in ("k8s.io", "moby")),
        configured_runtime="/bin/true",
        mounts=lambda: MOUNTS,
        shims=live_shim_ids(proc),
        proc=proc,
        run=fake_run,
    )


def runtime_with(tmp_path: Path, orphans: Orphans | None) -> RuntimeDirs:
    return RuntimeDirs(str(tmp_path / "runc"), str(tmp_path / "bundles"), (str(tmp_path / "flat"),), orphans)


@pytest.fixture
def fs(clock) -> AgedFs:  # type: ignore[no-untyped-def]
    return AgedFs(clock)


# -- read ------------------------------------------------------------------------


def test_find_states_flat_and_namespaced(tmp_path: Path) -> None:
    """Both layouts are found; a dir without state (being created) and a bad id are not."""
    write_state(tmp_path / "runc" / "k8s.io", cid(1), DEAD_PID)
    write_state(tmp_path / "runc" / "moby", cid(2), DEAD_PID)
    write_state(tmp_path / "flat", cid(3), DEAD_PID)
    write_state(tmp_path / "flat", cid(4), DEAD_PID, crun=True)
    (tmp_path / "runc" / "k8s.io" / cid(5)).mkdir()  # runc made the dir, no state.json yet
    write_state(tmp_path / "flat", "bad:id", DEAD_PID)
    write_state(tmp_path / "runc", cid(6), DEAD_PID)  # flat in containerd's root: not containerd's layout
    found = find_states([str(tmp_path / "runc")], [str(tmp_path / "flat"), str(tmp_path / "absent")])
    assert sorted((s.container_id, s.namespace, s.root, s.containerd_root) for s in found) == [
        (cid(1), "k8s.io", str(tmp_path / "runc" / "k8s.io"), True),
        (cid(2), "moby", str(tmp_path / "runc" / "moby"), True),
        (cid(3), "", str(tmp_path / "flat"), False),
        (cid(4), "", str(tmp_path / "flat"), False),
    ]
    assert find_states([str(tmp_path / "runc")]) == [s for s in found if s.containerd_root]
    assert [(s.root, s.containerd_root) for s in states_of([str(tmp_path / "runc")], cid(1))] == [
        (str(tmp_path / "runc" / "k8s.io"), True)
    ]
    assert states_of([str(tmp_path / "runc")], cid(3)) == []
    assert states_of([str(tmp_path / "runc")], cid(3), named_roots=[str(tmp_path / "flat")]) == [
        StateDir(str(tmp_path / "flat"), cid(3))
    ]
    # A pending record's root: containerd's when it is a namespace of containerd's root.
    assert states_of([str(tmp_path / "runc")], cid(3), str(tmp_path / "flat"))[0].containerd_root is False
    assert states_of([str(tmp_path / "runc")], cid(1), str(tmp_path / "runc" / "k8s.io"))[0].containerd_root
    assert states_of([str(tmp_path / "runc")], "../x") == []


def test_live_shim_ids_from_cmdlines(proc: str, tmp_path: Path) -> None:
    """Shims are recognised by argv[0]; their -id (and v1's -workdir basename) is collected."""
    v1 = Path(proc) / "4200"
    v1.mkdir()
    v1.joinpath("cmdline").write_bytes(
        b"containerd-shim\0-namespace\0moby\0-workdir\0/var/lib/containerd/x/moby/" + cid(78).encode() + b"\0"
    )
    other = Path(proc) / "4201"
    other.mkdir()
    other.joinpath("cmdline").write_bytes(b"sleep\0-id\0" + cid(79).encode() + b"\0")
    assert live_shim_ids(proc) == frozenset({cid(77), cid(78)})
    assert live_shim_ids(str(tmp_path / "no-proc")) == frozenset()


@pytest.mark.parametrize(
    ("pid", "init"),
    [(DEAD_PID, "dead"), (LIVE_PID, "alive"), (ZOMBIE_PID, "dead"), (REUSED_PID, "dead")],
)
def test_read_state_facts_init(tmp_path: Path, proc: str, pid: int, init: str) -> None:
    """The init counts as alive only as the same, non-zombie process (pid + start time)."""
    directory = write_state(tmp_path / "flat", cid(1), pid)
    state = StateDir(str(tmp_path / "flat"), cid(1))
    facts = read_state_facts(state, lambda _c: False, frozenset(), lambda: MOUNTS, proc)
    assert (facts.kind, facts.error, facts.init_pid, facts.init) == ("runc", None, pid, init)
    assert facts.owner == "named_root"
    assert facts.cgroup_paths == tuple(sorted(f"{h.mount}/{POD}/{cid(1)}" for h in HIERARCHIES))
    assert facts.modified == pytest.approx(os.lstat(directory).st_mtime) == NOW - 3600


def test_read_state_facts_crun_and_unreadable(tmp_path: Path, proc: str) -> None:
    """crun's status is placed under every mount; a corrupt state.json is an error, not 'dead'."""
    write_state(tmp_path / "flat", cid(1), DEAD_PID, crun=True)
    crun = read_state_facts(
        StateDir(str(tmp_path / "flat"), cid(1)), lambda _c: False, frozenset(), lambda: MOUNTS, proc
    )
    assert crun.kind == "crun" and crun.error is None and crun.init == "dead"
    assert crun.owner == "unknown", "no config.json beside crun's status: nothing tells the owner"
    assert crun.cgroup_paths == tuple(sorted(f"{m}/{POD}/{cid(1)}" for m in MOUNTS))
    (tmp_path / "flat" / cid(2)).mkdir()
    (tmp_path / "flat" / cid(2) / "state.json").write_text("{}")
    bad = read_state_facts(
        StateDir(str(tmp_path / "flat"), cid(2)), lambda _c: False, frozenset(), lambda: MOUNTS, proc
    )
    assert bad.error is not None and judge_state(bad, NOW, 0) == "unreadable"


# -- decide ----------------------------------------------------------------------


def facts_with(**changes: object) -> StateFacts:
    base: dict[str, object] = {
        "state": StateDir("/run/runc", cid(1)),
        "kind": "runc",
        "error": None,
        "init_pid": DEAD_PID,
        "init": liveness.DEAD,
        "has_bundle": False,
        "shim_alive": False,
        "modified": NOW - 61,
        "owner": "containerd",
    }
    base.update(changes)
    return StateFacts(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "owner", "init", "bundle", "shim", "young"),
    list(
        itertools.product(
            [False, True],
            ["containerd", "named_root", "foreign:podman", "unknown"],
            ["dead", "alive", "unknown"],
            [False, True],
            [False, True],
            [False, True],
        )
    ),
)
def test_judge_orphan_only_when_every_condition_holds(
    error: bool, owner: str, init: str, bundle: bool, shim: bool, young: bool
) -> None:
    """Every combination: orphan iff readable, ours, init dead, no bundle, no shim, old; else why not."""
    facts = facts_with(
        error="bad" if error else None,
        owner=owner,
        init=init,
        has_bundle=bundle,
        shim_alive=shim,
        modified=NOW - 10 if young else NOW - 60,
    )
    verdict = judge_state(facts, NOW, 60)
    expected = next(
        (
            reason
            for reason, flag in (
                ("unreadable", error),
                ("foreign", owner.startswith("foreign:")),
                ("owner_unknown", owner == "unknown"),
                ("init_unknown", init == "unknown"),
                ("alive", init == "alive"),
                ("bundle", bundle),
                ("shim", shim),
                ("too_young", young),
            )
            if flag
        ),
        ORPHAN,
    )
    assert verdict == expected


def test_decide_redrives_orphaned_state_even_without_cgroups() -> None:
    """Orphaned state is re-driven (dirs gone or populated alike); live or unknown state keeps the unit."""
    orphan = facts_with()
    alive = facts_with(init=liveness.ALIVE)
    assert decide(UnitFacts(("a",), (), True, False, NOW - 61, states=(orphan,)), NOW, 60).reason == (
        "orphan_state"
    )
    assert decide(UnitFacts((), (), True, False, None, states=(orphan,)), NOW, 60).reason == "orphan_state"
    assert decide(UnitFacts(("a",), (), True, False, NOW - 61, states=(orphan, alive)), NOW, 60).reason == (
        "runtime_state"
    )
    assert decide(UnitFacts(("a",), (), True, False, NOW - 61), NOW, 60).reason == "runtime_state"
    # Processes left behind do not stop the runtime's own delete (it kills them, as it would have).
    assert decide(UnitFacts(("a",), ("a",), True, False, NOW - 61, states=(orphan,)), NOW, 60).reason == (
        "orphan_state"
    )
    assert decide(UnitFacts(("a",), ("a",), True, False, NOW - 61, states=(alive,)), NOW, 60).reason == (
        "populated"
    )
    assert decide(UnitFacts(("a",), (), True, True, NOW - 61, states=(orphan,)), NOW, 60).reason == "bundle"
    assert decide(UnitFacts(("a",), (), True, False, NOW - 1, states=(orphan,)), NOW, 60).reason == (
        "too_young"
    )


def test_runtime_for_prefers_the_record() -> None:
    """The pending record's runtime wins; crun's state goes to crun; else the configured runtime."""
    assert runtime_for(facts_with(), "nvidia-container-runtime", "runc") == "nvidia-container-runtime"
    assert runtime_for(facts_with(kind="crun"), None, "runc") == "crun"
    assert runtime_for(facts_with(kind="crun"), None, "/usr/local/bin/crun") == "/usr/local/bin/crun"
    assert runtime_for(facts_with(), None, "/opt/runc-1.3.4") == "/opt/runc-1.3.4"


# -- the sweep and the audit -------------------------------------------------------------


def discovery_with(tmp_path: Path, fs: AgedFs, orphans: Orphans, *units: object) -> Discovery:
    discovery = Discovery(HIERARCHIES, {u.container_id: u for u in units})  # type: ignore[attr-defined]
    add_orphans(discovery, orphans.scan(), NOW, 60, fs, MOUNTS)
    return discovery


def test_sweep_redrives_orphans_and_never_touches_live_or_owned_state(
    tmp_path: Path, proc: str, fs: AgedFs
) -> None:
    """Orphans under kubepods and outside it are re-driven and removed; alive/bundle/shim/young stay."""
    ns = tmp_path / "runc" / "k8s.io"
    in_pods = add_unit(fs, 1)
    write_state(ns, cid(1), DEAD_PID)
    outside = [f"{h.mount}/elsewhere/{cid(2)}" for h in HIERARCHIES]
    for path in outside:
        fs.add(path)
    write_state(tmp_path / "flat", cid(2), REUSED_PID, paths={"": outside[0], "pids": outside[1]})
    keepers = {}
    for n, pid, kind in (
        (3, LIVE_PID, "alive"),
        (4, DEAD_PID, "bundle"),
        (77, DEAD_PID, "shim"),
        (6, DEAD_PID, "young"),
    ):
        keepers[n] = add_unit(fs, n)
        write_state(ns, cid(n), pid, age=5 if kind == "young" else 3600)
    (tmp_path / "bundles" / "k8s.io" / cid(4)).mkdir(parents=True)
    runs: list[tuple[StateDir, str]] = []
    orphans = orphans_for(tmp_path, proc, runs)
    discovery = discovery_with(tmp_path, fs, orphans, in_pods, *keepers.values())
    assert set(discovery.units) == {cid(1), cid(2), cid(3), cid(4), cid(77), cid(6)}
    assert sorted(discovery.units[cid(2)].dirs) == sorted(outside[:2])
    report = sweeper(fs, runtime_with(tmp_path, orphans), Recorder(), min_age=60).run(discovery)
    assert sorted(s.container_id for s, _ in runs) == [cid(1), cid(2)]
    assert all(path == "/bin/true" for _, path in runs)
    assert not (ns / cid(1)).exists() and not (tmp_path / "flat" / cid(2)).exists()
    assert all(d not in fs.dirs for d in in_pods.dirs + outside[:2])
    for n, unit in keepers.items():
        assert all(d in fs.dirs for d in unit.dirs) and (ns / cid(n)).exists()
    assert report.kept == {"runtime_state": 4}
    assert (report.removed, len(report.redriven), report.errors) == (2, 2, [])
    assert outside[2] in fs.dirs  # not named in the state: not the sweep's to remove


def test_sweep_keeps_dirs_when_the_runtime_keeps_its_state(tmp_path: Path, proc: str, fs: AgedFs) -> None:
    """A delete that fails again (runc >= 1.2, cgroup still busy) is an error; the unit waits."""
    unit = add_unit(fs, 1)
    write_state(tmp_path / "runc" / "k8s.io", cid(1), DEAD_PID)
    orphans = orphans_for(tmp_path, proc, remove_state=False)
    discovery = discovery_with(tmp_path, fs, orphans, unit)
    report = sweeper(fs, runtime_with(tmp_path, orphans), Recorder(), min_age=60).run(discovery)
    assert all(d in fs.dirs for d in unit.dirs)
    assert report.removed == 0 and len(report.errors) == 1
    assert "runtime state kept" in report.errors[0] and "unable to destroy" in report.errors[0]
    assert report.redriven[0]["exit_code"] == 1


def test_without_orphan_handling_state_keeps_the_unit(tmp_path: Path, proc: str, fs: AgedFs) -> None:
    """--no-orphans is the stock behaviour: any runtime state (flat roots too) keeps its container."""
    unit = add_unit(fs, 1)
    write_state(tmp_path / "flat", cid(1), DEAD_PID)
    report = sweeper(fs, runtime_with(tmp_path, None), Recorder(), min_age=60).run(
        Discovery(HIERARCHIES, {cid(1): unit})
    )
    assert report.kept == {"runtime_state": 1} and report.redriven == []
    assert all(d in fs.dirs for d in unit.dirs)


def test_dry_run_names_the_redrive(tmp_path: Path, proc: str, fs: AgedFs) -> None:
    """A dry run runs no runtime and lists the orphan as would_redrive."""
    unit = add_unit(fs, 1)
    write_state(tmp_path / "runc" / "k8s.io", cid(1), DEAD_PID)
    runs: list[tuple[StateDir, str]] = []
    orphans = orphans_for(tmp_path, proc, runs)
    report = sweeper(fs, runtime_with(tmp_path, orphans), Recorder(), min_age=60, dry_run=True).run(
        discovery_with(tmp_path, fs, orphans, unit)
    )
    assert runs == [] and [c["action"] for c in report.containers] == ["would_redrive"]


def test_unsafe_state_paths_are_refused(tmp_path: Path, proc: str, fs: AgedFs) -> None:
    """An orphan whose state names a cgroup not named after it is kept and reported."""
    fs.add(f"/cg/memory/{POD}")
    write_state(tmp_path / "flat", cid(1), DEAD_PID, paths={"memory": f"/cg/memory/{POD}/{cid(2)}"})
    orphans = orphans_for(tmp_path, proc)
    discovery = discovery_with(tmp_path, fs, orphans)
    assert discovery.units[cid(1)].unsafe is not None
    assert list(discovery.state_errors) == [str(tmp_path / "flat" / cid(1))]
    report = audit(discovery, fs, runtime_with(tmp_path, orphans), NOW, 60)
    assert judge(report, 0, 1800) == NPD_PROBLEM and "unsafe cgroups" in report.message


@pytest.mark.parametrize(("crun", "scope_of"), [(True, 1), (True, 2), (False, 1)])
def test_crun_systemd_leaf_joins_its_unit_with_its_scope(
    tmp_path: Path, proc: str, fs: AgedFs, crun: bool, scope_of: int
) -> None:
    """crun's systemd driver names ``<prefix>-<id>.scope/container``: an orphan's leaf and its scope are
    the unit's dirs (the sweep re-drives crun's delete). A scope of another id, or runc's state naming
    that shape, stays refused (unsafe_path)."""
    leaf = f"/{POD}/cri-containerd-{cid(scope_of)}.scope/container"
    for h in HIERARCHIES:
        fs.add(f"{h.mount}/{POD}")
    directory = write_state(tmp_path / "flat", cid(1), DEAD_PID, crun=crun,
                            paths={"memory": f"/cg/memory{leaf}"})  # fmt: skip
    if crun:
        status = directory / "status"
        doc = {**json.loads(status.read_text()), "cgroup-path": leaf, "bundle": f"/srv/bundles/{cid(1)}"}
        status.write_text(json.dumps(doc))
        os.utime(status, (NOW - 3600, NOW - 3600))
    discovery = discovery_with(tmp_path, fs, orphans_for(tmp_path, proc))
    unit = discovery.units[cid(1)]
    if crun and scope_of == 1:
        assert unit.unsafe is None and not discovery.state_errors
        scopes = [f"{h.mount}{os.path.dirname(leaf)}" for h in HIERARCHIES]
        assert unit.dirs == sorted([f"{h.mount}{leaf}" for h in HIERARCHIES] + scopes)
        assert unit.pod == POD  # the scope's parent, not the scope
    else:
        assert unit.unsafe is not None and "not named after" in unit.unsafe


def test_audit_reports_orphaned_state_as_a_problem(tmp_path: Path, proc: str, fs: AgedFs) -> None:
    """Orphaned state is listed, counted as a leaked container, and makes NPD's verdict a problem."""
    write_state(tmp_path / "runc" / "k8s.io", cid(1), DEAD_PID)
    write_state(tmp_path / "runc" / "k8s.io", cid(3), LIVE_PID)
    add_unit(fs, 1)
    orphans = orphans_for(tmp_path, proc)
    discovery = discovery_with(tmp_path, fs, orphans)
    report = audit(discovery, fs, runtime_with(tmp_path, orphans), NOW, 60)
    assert [o["container_id"] for o in report.orphaned_states] == [cid(1)]
    assert report.leaked_containers == 1
    assert judge(report, 0, 1800) == NPD_PROBLEM
    assert "1 orphaned runtime state(s)" in report.message
    assert all(os.path.exists(d) for d in (tmp_path / "runc" / "k8s.io" / cid(1),))


# -- act: a real child process ----------------------------------------------------------


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_redrive_runs_the_runtime_with_its_root(tmp_path: Path) -> None:
    """The runtime gets --root <state root> delete --force <id>; its output and status are kept."""
    state_dir = write_state(tmp_path / "flat", cid(1), DEAD_PID)
    runtime = script(tmp_path / "rt", f'echo "$@" > {tmp_path}/argv; rm -r {state_dir}; echo done >&2')
    done = redrive(StateDir(str(tmp_path / "flat"), cid(1)), runtime, 10)
    assert (tmp_path / "argv").read_text().split() == [
        "--root",
        str(tmp_path / "flat"),
        "delete",
        "--force",
        cid(1),
    ]
    assert (done.exit_code, done.output, done.state_left, done.error) == (0, "done", False, "")


def test_redrive_is_bounded_by_its_timeout(tmp_path: Path) -> None:
    """A runtime that blocks is killed at the timeout; the state stays for the next sweep."""
    write_state(tmp_path / "flat", cid(1), DEAD_PID)
    runtime = script(tmp_path / "rt", "exec sleep 30")
    started = time.monotonic()
    done = redrive(StateDir(str(tmp_path / "flat"), cid(1)), runtime, 0.5)
    assert time.monotonic() - started < 5
    assert done.exit_code is None and "timed out" in done.error and done.state_left


def test_act_reports_a_missing_runtime(tmp_path: Path, proc: str) -> None:
    """A runtime that cannot be found is reported on the redrive; nothing is run."""
    write_state(tmp_path / "flat", cid(1), DEAD_PID)
    orphans = orphans_for(tmp_path, proc)
    facts = orphans.of(cid(1))[0]
    called: list[object] = []
    run: Callable[[StateDir, str, float], Redrive] = lambda *a: called.append(a)  # type: ignore[assignment,return-value]  # noqa: E731
    orphans.run = run
    done = orphans.act(facts, str(tmp_path / "no-such-runtime"))
    assert called == [] and done.state_left and "missing" in done.error


def test_text_reports_name_the_orphan_and_the_rerun(capsys: pytest.CaptureFixture[str]) -> None:
    """Sweep text shows the re-run runtime command and its outcome; audit text lists the orphaned state."""
    from runc_guard.cli.audit import _print_text as print_audit
    from runc_guard.cli.sweep import _print_text as print_sweep
    from runc_guard.node.audit import AuditReport
    from runc_guard.node.sweep import SweepReport

    sweep = SweepReport(dry_run=False, hierarchies=["/cg/memory"])
    sweep.redriven.append(
        Redrive(
            cid(1),
            "/run/runc",
            ["/usr/sbin/runc", "--root", "/run/runc", "delete", "--force", cid(1)],
            0,
            "",
            0.108,
            False,
        ).as_dict()
    )
    print_sweep(sweep)
    assert f"re-ran /usr/sbin/runc --root /run/runc delete --force {cid(1)}: exit 0, state gone" in (
        capsys.readouterr().out
    )
    report = AuditReport(["/cg/memory"])
    report.orphaned_states = [{"state_dir": f"/run/runc/{cid(1)}", "init_pid": 4001, "age_seconds": 90.0}]
    print_audit(report, quiet=False)
    assert f"orphaned runtime state: /run/runc/{cid(1)} (init 4001 dead, 90s old)" in capsys.readouterr().out


def test_processes_left_in_an_orphan_are_the_runtimes_to_kill(tmp_path: Path, proc: str, fs: AgedFs) -> None:
    """A populated orphan is re-driven; what the runtime kills goes, what it leaves stays (kept busy)."""
    killed, spared = add_unit(fs, 1), add_unit(fs, 2)
    for unit, pid in ((killed, 901), (spared, 902)):
        fs.dirs[unit.dirs[0]] = [pid]
        fs.alive.add(pid)
        write_state(tmp_path / "runc" / "k8s.io", unit.container_id, DEAD_PID)
    orphans = orphans_for(tmp_path, proc)
    removing = orphans.run

    def runtime_kills_host_pid_children(state: StateDir, path: str, timeout: float) -> Redrive:
        if state.container_id == cid(1):
            fs.exit(901)  # runc's destroy SIGKILLs every process of a host-PID container
        return removing(state, path, timeout)

    orphans.run = runtime_kills_host_pid_children
    report = sweeper(fs, runtime_with(tmp_path, orphans), Recorder(), min_age=60).run(
        discovery_with(tmp_path, fs, orphans, killed, spared)
    )
    assert fs.killed == []  # runc-guard itself signalled nothing
    assert all(d not in fs.dirs for d in killed.dirs)
    assert spared.dirs[0] in fs.dirs and 902 in fs.alive
    assert len(report.redriven) == 2 and report.removed == 1 and report.kept == {"busy": 1}
