"""The finisher: what a deadline cut short is completed after the reply, and nothing else is touched.

Unit tests on the fake cgroupfs with a stand-in runtime (the delete unit tests' Lab):
every rule that makes the finisher step back, and the work it does once they hold.
The real kernel's version is in tests/test_finisher_kernel.py.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

import runc_guard.delete.report as report_mod
from labkit.kernel import wait_reported
from runc_guard.delete.aside import OVERLOAD, iter_aside, write_aside
from runc_guard.delete.pending import Claim, PendingRecord, record_path, write_record
from runc_guard.node.finisher import Finisher
from runc_guard.node.finisher_process import POLL, run
from runc_guard.procinfo import start_time
from runc_guard.reporter import drain_spool
from tests.fakes import FakeCgroupFs, FakeClock
from tests.test_delete_unit import DEAD_PID, DEAD_START, Lab, mounts


@pytest.fixture
def lab(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Lab:
    clock = FakeClock()
    # the reporter, without the fork: the finisher's entries are drained here and now
    monkeypatch.setattr(report_mod, "detach_reporter", lambda d, _linger: drain_spool(d, linger=0))
    return Lab(str(tmp_path), FakeCgroupFs(clock), clock)


def _cut_short(lab: Lab, cid: str, *, pids: tuple[int, ...] = (), alive: bool = False,
               sandbox: str = "", runtime_status: int = 0) -> tuple[list[str], str]:
    """What a delete cut short by its deadline leaves: runc's state, the cgroups, the record."""
    labels = {"io.kubernetes.cri.sandbox-id": sandbox} if sandbox else None
    dirs = lab.container(cid, pids=pids, labels=labels)
    pid, start = (os.getpid(), start_time(os.getpid()) or 0) if alive else (DEAD_PID, DEAD_START)
    record = PendingRecord(cid, lab.root, dirs, pid, start, lab.runtime(runtime_status), 1.0)
    return dirs, write_record(lab.settings.pending_dir, record)


def _finisher(lab: Lab, proc: str = "/proc") -> Finisher:
    return Finisher(lab.settings, fs=lab.fs, clock=lab.clock, proc=proc, mounts=mounts)


def _overloaded(lab: Lab, cid: str, *, kind: str = OVERLOAD, **container: Any) -> tuple[list[str], str]:
    """What a delete that stepped aside at start-up overload leaves once the runtime ran alone and
    failed on a busy cgroup (runc >= 1.2): its state kept, the cgroups, an aside record naming none."""
    dirs = lab.container(cid, **container)
    path = write_aside(lab.settings.cache_dir, lab.root, cid, [], "all slots busy", kind, lab.runtime())
    assert path is not None
    return dirs, path


def _fake_proc(tmp: str, cmdline: list[str]) -> str:
    """A /proc with one process (a containerd shim) and nothing else."""
    proc = os.path.join(tmp, "proc")
    os.makedirs(os.path.join(proc, "4242"))
    with open(os.path.join(proc, "4242", "cmdline"), "wb") as f:
        f.write(b"\0".join(a.encode() for a in cmdline) + b"\0")
    return proc


def test_it_reruns_the_runtime_removes_the_rest_and_reports(lab: Lab) -> None:
    """Init dead, cgroups empty, the runtime kept its state: its delete runs again, the directories go
    leaf-first, the record is dropped, one entry (outcome finished_late) and a stats line follow."""
    dirs, record = _cut_short(lab, "c1")
    finisher = run(lab.settings, 60.0, _finisher(lab), quiet=0)
    assert finisher.finished == ["c1"]
    assert lab.runs() == ["runtime c1"] and not lab.has_state("c1")
    assert not any(lab.fs.exists(d) for d in dirs) and not os.path.exists(record)
    entry = lab.entry()
    assert (entry["outcome"], entry["runtime_runs"], entry["removed"]) == ("finished_late", 1, 2)
    assert [(s["outcome"], s["container_id"]) for s in lab.stats()] == [("finished_late", "c1")]


def test_it_waits_for_the_cgroups_and_kills_nothing(lab: Lab) -> None:
    """A process still inside: the finisher waits (never kills) until its window closes; the record
    stays for the sweep."""
    dirs, record = _cut_short(lab, "c1", pids=(4242,))
    finisher = run(lab.settings, 5.0, _finisher(lab), quiet=0)
    assert finisher.finished == [] and lab.fs.killed == [] and lab.runs() == []
    assert os.path.exists(record) and all(lab.fs.exists(d) for d in dirs)
    assert lab.fs.waits, "it must wait on the cgroups, not spin"


def test_it_leaves_a_live_or_unknown_init_alone(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """An init that is alive (or cannot be judged) is a running container's: untouched."""
    _, alive = _cut_short(lab, "c1", alive=True)
    assert run(lab.settings, 1.0, _finisher(lab), quiet=0).finished == []
    assert os.path.exists(alive) and lab.runs() == []
    import runc_guard.node.finisher as finisher_mod

    monkeypatch.setattr(finisher_mod, "init_liveness", lambda *_a: "unknown")
    _, unknown = _cut_short(lab, "c2")
    assert run(lab.settings, 1.0, _finisher(lab), quiet=0).finished == []
    assert os.path.exists(unknown) and lab.runs() == []


@pytest.mark.parametrize(("shim_args", "finished"), [
    (["-namespace", "k8s.io", "-id", "c1", "-address", "/run/containerd/containerd.sock"], []),
    (["-namespace", "k8s.io", "-id", "sb", "-address", "/run/containerd/containerd.sock"], []),
    (["-namespace", "k8s.io", "-id", "c1", "-address", "/run/containerd/containerd.sock", "delete"], []),
    (["-namespace", "k8s.io", "-id", "sb", "-address", "/run/containerd/containerd.sock", "delete"], []),
    (["-namespace", "k8s.io", "-id", "c9", "-address", "/run/containerd/containerd.sock", "delete"], ["c1"]),
])
def test_a_shim_naming_the_container_owns_it(lab: Lab, shim_args: list[str], finished: list[str]) -> None:
    """A shim serving the container (or its sandbox) means containerd's own retry comes: untouched.
    So does containerd's dead-shim cleanup (``... delete``) of it or its sandbox while it still runs
    (its unmounts and the bundle's removal follow our reply; issue 30 case 4: that hold lapsed after
    30 s before). A cleanup of another container does not hold it."""
    _cut_short(lab, "c1", sandbox="sb")
    proc = _fake_proc(lab.tmp, ["/usr/bin/containerd-shim-runc-v2", *shim_args])
    assert run(lab.settings, 1.0, _finisher(lab, proc), quiet=0).finished == finished


def test_a_process_in_a_child_cgroup_keeps_the_record_waiting(lab: Lab) -> None:
    """Issue 42 case 2: a process anywhere below the recorded cgroups (a child cgroup: Docker-in-Docker,
    kind, systemd inside) keeps them busy: the finisher waits on it and runs no runtime. Before: it
    looked at the recorded directories' own cgroup.procs only, re-ran the runtime and failed its rmdir."""
    dirs, record = _cut_short(lab, "c1")
    lab.fs.add(dirs[0] + "/sub", [4242])
    finisher = run(lab.settings, 5.0, _finisher(lab), quiet=0)
    assert finisher.finished == [] and lab.runs() == [] and lab.fs.killed == []
    assert os.path.exists(record) and lab.fs.exists(dirs[0] + "/sub")
    assert any(dirs[0] + "/sub" in paths for paths, _, _ in lab.fs.waits), "it waits on the child's cgroup"


def test_a_delete_holding_the_claim_keeps_it(lab: Lab) -> None:
    """Another delete of the same id (containerd's retry) holds its claim: the finisher steps back."""
    _, record = _cut_short(lab, "c1")
    with Claim(lab.settings.pending_dir, lab.root, "c1", lab.clock()) as held:
        assert held == "claimed"
        assert run(lab.settings, 1.0, _finisher(lab), quiet=0).finished == []
    assert os.path.exists(record) and lab.runs() == []


def test_a_runtime_that_keeps_failing_is_left_to_the_sweep(lab: Lab) -> None:
    """A runtime delete that fails and keeps its state is tried at most three times, then left."""
    state_kept = _cut_short(lab, "c1", runtime_status=1)[1]
    with open(record_path(lab.settings.pending_dir, lab.root, "c1")) as f:
        runtime = json.load(f)["runtime"]
    with open(runtime) as f:
        body = f.read()
    with open(runtime, "w") as f:  # a runtime that fails and keeps the state, like runc >= 1.2 on EBUSY
        f.write(body.replace(f'rm -rf "{lab.root}/$id"', ":"))
    finisher = run(lab.settings, 10.0, _finisher(lab), quiet=0)
    assert finisher.finished == [] and lab.runs().count("runtime c1") == 3
    assert os.path.exists(state_kept) and lab.has_state("c1")


def test_nothing_is_done_while_deletes_still_cut_short(lab: Lab) -> None:
    """For ``quiet`` s after the last new record (a storm's deletes may still run) the finisher only
    waits: it must not take the CPU those deletes and their runtimes need. Then it acts."""
    _, record = _cut_short(lab, "c1")
    started = lab.clock()
    finisher = run(lab.settings, 0.0, _finisher(lab), quiet=5.0)  # no time left after the quiet period
    assert finisher.finished == [] and lab.runs() == [] and os.path.exists(record)
    assert lab.clock() - started >= 5.0
    assert run(lab.settings, 60.0, _finisher(lab), quiet=5.0).finished == ["c1"]


def test_it_finishes_what_an_overloaded_delete_left_to_the_runtime(lab: Lab) -> None:
    """Start-up overload: the runtime ran alone and kept its state. Once containerd is done (no
    bundle), the init dead and the cgroups empty, the finisher re-runs the runtime's delete with the
    runtime the record names, removes the directories the state names, drops the aside record."""
    dirs, aside = _overloaded(lab, "c1")
    finisher = run(lab.settings, 60.0, _finisher(lab), quiet=0)
    assert finisher.finished == ["c1"]
    assert lab.runs() == ["runtime c1"] and not lab.has_state("c1")
    assert not any(lab.fs.exists(d) for d in dirs) and not os.path.exists(aside)
    entry = lab.entry()
    assert (entry["outcome"], entry["left_by"], entry["removed"]) == ("finished_late", "overload", 2)


@pytest.mark.parametrize("kind", ["pending", "overload"])
def test_a_record_naming_a_runtime_no_route_leads_to_is_left_once(lab: Lab, kind: str) -> None:
    """Issue 42 case 4: a pending or overload record whose runtime the settings do not route to is
    never run: the runtime not run, nothing removed, the record kept, one ``finisher_left`` entry
    however many passes look at it."""
    dirs = lab.container("c1")
    tracer = os.path.join(lab.tmp, "elsewhere", "runc")
    os.makedirs(os.path.dirname(tracer))
    os.rename(lab.runtime(), tracer)  # a working runtime (it would log its run), at a path no route names
    if kind == "pending":
        record = PendingRecord("c1", lab.root, dirs, DEAD_PID, DEAD_START, tracer, 1.0)
        path = write_record(lab.settings.pending_dir, record)
    else:
        aside = write_aside(lab.settings.cache_dir, lab.root, "c1", [], "all slots busy", OVERLOAD, tracer)
        path = aside or ""
    finisher = _finisher(lab)
    for _ in range(3):
        finisher.pass_once()
    assert lab.runs() == [] and lab.has_state("c1") and all(lab.fs.exists(d) for d in dirs)
    assert os.path.exists(path)
    lefts = [e for e in lab.events() if e["event"] == "finisher_left"]
    assert len(lefts) == 1 and "not one the settings route to" in lefts[0]["reason"], lefts


@pytest.mark.parametrize("why", ["bundle", "alive", "not_its_own", "unsure", "no_state", "busy"])
def test_an_overload_record_is_left_alone_unless_everything_proves_it_done(lab: Lab, why: str) -> None:
    """Kept as it is (record, state, directories; nothing killed, no runtime run): containerd still
    holds the bundle; the init lives; the state names cgroups that are not the container's own; an
    aside record of another kind (runc-guard could not prove something); no state left to prove
    anything (runc 1.1 drops it: the sweep's); a process still inside (the finisher waits)."""
    bundle = os.path.join(lab.tmp, "bundle-c1")
    os.makedirs(bundle)
    container: dict[str, Any] = {
        "bundle": {"labels": {"bundle": bundle}},
        "alive": {"alive": True},
        "not_its_own": {"relative": "/rgt/someone-else"},
        "busy": {"pids": (4242,)},
    }.get(why, {})
    kind = "unsure" if why == "unsure" else OVERLOAD
    dirs, aside = _overloaded(lab, "c1", kind=kind, **container)
    if why == "no_state":
        import shutil

        shutil.rmtree(os.path.join(lab.root, "c1"))

    finisher = run(lab.settings, 2.0, _finisher(lab), quiet=0)
    assert finisher.finished == [] and lab.runs() == [] and lab.fs.killed == []
    assert os.path.exists(aside) and all(lab.fs.exists(d) for d in dirs)
    assert [p for p, _ in iter_aside(lab.settings.cache_dir)] == [aside]


def test_the_bundle_rule_is_what_held_it(lab: Lab) -> None:
    """The control of the bundle case: the same container is finished once containerd drops its bundle."""
    bundle = os.path.join(lab.tmp, "bundle-c1")
    os.makedirs(bundle)
    _overloaded(lab, "c1", labels={"bundle": bundle})
    assert run(lab.settings, 2.0, _finisher(lab), quiet=0).finished == []
    os.rmdir(bundle)
    assert run(lab.settings, 2.0, _finisher(lab), quiet=0).finished == ["c1"]


def test_containerds_own_cleanups_go_first(lab: Lab) -> None:
    """While a dead-shim cleanup of containerd's runs (a storm under way; each is SIGKILLed at 5 s),
    the finisher waits: quiet counts from the last cleanup seen, for at most HOLD_MAX s after the
    last new record. Control: with no cleanup running it acts after ``quiet``."""
    from runc_guard.node.finisher import HOLD_MAX

    _cut_short(lab, "c1")
    proc = _fake_proc(lab.tmp, ["/usr/bin/containerd-shim-runc-v2", "-namespace", "k8s.io", "-id", "c9",
                                "-address", "/run/containerd/containerd.sock", "delete"])
    started = lab.clock()
    assert run(lab.settings, 60.0, _finisher(lab, proc), quiet=5.0).finished == ["c1"]
    assert lab.clock() - started >= HOLD_MAX
    _cut_short(lab, "c2")
    calm = _fake_proc(os.path.join(lab.tmp, "calm"), ["/bin/sleep", "60"])  # not the host's: it has cleanups
    started = lab.clock()
    assert run(lab.settings, 60.0, _finisher(lab, calm), quiet=5.0).finished == ["c2"]
    assert 5.0 <= lab.clock() - started < HOLD_MAX


@pytest.mark.parametrize(("window", "lag", "margin"), [(0.0, 1.0, 0.0), (30.0, 1.0, 0.5), (30.0, 0.04, 0.02),
                                                      (30.0, 1.2, 0.3), (30.0, 2.0, 0.0), (30.0, 9.0, 0.0)])
def test_a_busy_node_replies_earlier_only_when_a_finisher_completes(
    lab: Lab, window: float, lag: float, margin: float
) -> None:
    """The budget ran ``lag`` s before the delete could begin (a storm: the shim and the interpreter
    waited for a CPU); containerd's shim then needs CPU after the reply too. With a finisher, the
    delete replies earlier by half that lag, never leaving the runtime less than a quarter of its
    deadline (0.5 s here: at lag 1.2 the margin is 0.3 s, past 1.5 s none); without one, the
    deadline stays delete_timeout (2 s here) from the budget's start."""
    from runc_guard.delete.run import DeleteRun
    from runc_guard.invocation import parse

    settings = lab.settings.replace(finish_window=window)
    args = lab.invocation_args("c1")
    run_ = DeleteRun(parse(args), args, "/bin/true", settings, fs=lab.fs, mounts=mounts, clock=lab.clock,
                     started=lab.clock() - lag)
    assert run_.deadline == pytest.approx(run_.started + 2.0 - margin)
    assert run_.canonical.get("reply_margin_ms", 0) == round(margin * 1000)


def test_an_overload_record_naming_a_path_is_never_read(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record is input: a container id that is not one (here a path to a real state) is dropped
    before it names any file or reaches a runtime."""
    import runc_guard.node.finisher as finisher_mod

    _overloaded(lab, "c1")
    ((aside, _),) = list(iter_aside(lab.settings.cache_dir))
    with open(aside) as f:
        doc = json.load(f)
    doc["container_id"] = "../state/c1"

    def no_read(*_args: object) -> None:
        raise AssertionError("a state was read for an invalid id")

    monkeypatch.setattr(finisher_mod, "read_state", no_read)
    assert _finisher(lab)._judge_overload(doc) is None


# -- a CRI sandbox's dead siblings, after the sandbox's reply (issue 30 case 1) ----------------

SB = {"io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-id": "sb"}


def _of(sandbox: str) -> dict[str, str]:
    return {"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-id": sandbox}


def _delete_sandbox(lab: Lab, runtime: str | None = None) -> None:
    """The sandbox's own delete with the finisher on: it replies 0 having run only its own runtime."""
    settings = lab.settings.replace(finish_window=30.0)
    assert lab.run("sb", runtime or lab.runtime(0), settings) == 0
    assert [r for r in lab.runs() if r.startswith("runtime")] == ["runtime sb"]
    assert lab.entry()["container_id"] == "sb"


def test_a_sandboxs_dead_sibling_gets_its_own_delete_after_the_reply(lab: Lab) -> None:
    """The sibling the sandbox recorded is deleted by the finisher with the delete's own decision
    table: its runtime's ``delete --force``, its cgroups removed, its own canonical entry (with
    ``sandbox_id``) and stats line; the aside record goes. A live sibling and another pod's stay.
    The sibling's bundle still exists (containerd's dead-shim cleanup removes only the sandbox's)."""
    lab.container("sb", labels=SB)
    bundle = os.path.join(lab.tmp, "bundle-app")
    os.makedirs(bundle)
    dead = lab.container("app", labels={**_of("sb"), "bundle": bundle})
    live = lab.container("live", alive=True, labels=_of("sb"))
    other = lab.container("other", labels=_of("sb2"))
    _delete_sandbox(lab)
    assert lab.entry()["siblings"] == [{"id": "app", "left_for": "finisher"}]
    assert run(lab.settings, 60.0, _finisher(lab), quiet=0).finished == ["app"]
    assert [r for r in lab.runs() if r.startswith("runtime")] == ["runtime sb", "runtime app"]
    assert not lab.has_state("app") and not any(lab.fs.exists(d) for d in dead)
    assert lab.has_state("live") and all(lab.fs.exists(d) for d in live + other)
    entry = lab.entry()
    assert (entry["container_id"], entry["sandbox_id"], entry["outcome"]) == ("app", "sb", "removed")
    assert [s["container_id"] for s in lab.stats()] == ["sb", "app"]
    assert list(iter_aside(lab.settings.cache_dir)) == [] and lab.records() == []


def test_each_siblings_failure_is_its_own(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception inside one sibling's delete (ENOMEM reading its cgroup.procs: not an Outcome)
    becomes that sibling's own internal_error entry; the next sibling is still deleted."""
    lab.container("sb", labels=SB)
    broken = lab.container("app1", labels=_of("sb"))
    fine = lab.container("app2", labels=_of("sb"))
    _delete_sandbox(lab)
    real = lab.fs.read_procs

    def enomem(path: str) -> list[int]:
        if path in broken:
            raise OSError(12, "Cannot allocate memory")
        return real(path)

    monkeypatch.setattr(lab.fs, "read_procs", enomem)
    assert sorted(run(lab.settings, 60.0, _finisher(lab), quiet=0).finished) == ["app1", "app2"]
    entries = {e["container_id"]: e for e in lab.events() if e["event"] == "delete"}
    assert (entries["app1"]["outcome"], entries["app1"]["exit_status"]) == ("internal_error", 70)
    assert "Cannot allocate memory" in entries["app1"]["reason"]
    assert entries["app2"]["outcome"] == "removed" and not any(lab.fs.exists(d) for d in fine)
    assert entries["sb"]["exit_status"] == 0


def test_a_sibling_that_steps_aside_is_bounded_and_never_delays_the_sandbox(lab: Lab) -> None:
    """A sibling whose cgroups are not provably its own steps aside; its runtime (hanging here) is
    bounded by the sibling's own deadline, in the finisher; the sandbox replied without waiting on it."""
    import time

    lab.container("sb", labels=SB)
    lab.container("app1", relative="/rgt/shared", labels=_of("sb"))
    slow = lab.runtime(0, body='case "$id" in app1) exec sleep 30;; esac')
    started = time.monotonic()
    _delete_sandbox(lab, slow)
    assert time.monotonic() - started < 5
    settings = lab.settings.replace(delete_timeout=1.0)
    started = time.monotonic()
    assert run(settings, 60.0, Finisher(settings, fs=lab.fs, clock=lab.clock, mounts=mounts),
               quiet=0).finished == ["app1"]  # fmt: skip
    assert time.monotonic() - started < 10, "the sibling's runtime ran past its deadline"
    entry = lab.entry()
    assert (entry["container_id"], entry["exit_status"], entry["sandbox_id"]) == ("app1", 75, "sb")


@pytest.mark.parametrize("why", ["recreated", "shim_of_the_sandbox", "cleanup_of_the_sibling", "claimed"])
def test_a_sibling_is_left_alone_while_anyone_else_has_it(lab: Lab, why: str) -> None:
    """Nothing is run, killed or removed for a recorded sibling re-created under its id (a new init:
    for good, with a ``finisher_left`` entry), while a containerd shim names it or its sandbox, or
    while another delete holds its claim."""
    import shutil

    lab.container("sb", labels=SB)
    dirs = lab.container("app", labels=_of("sb"))
    _delete_sandbox(lab)
    proc = "/proc"
    if why == "recreated":
        shutil.rmtree(os.path.join(lab.root, "app"))
        for d in dirs:
            lab.fs.rmdir(d)
        dirs = lab.container("app", alive=True, labels=_of("sb"))
    elif why != "claimed":
        shim_id, tail = ("sb", []) if why == "shim_of_the_sandbox" else ("app", ["delete"])
        proc = _fake_proc(lab.tmp, ["/usr/bin/containerd-shim-runc-v2", "-namespace", "k8s.io", "-id",
                                    shim_id, "-address", "/run/containerd/containerd.sock", *tail])
    import contextlib

    claim = Claim(lab.settings.pending_dir, lab.root, "app", lab.clock())
    with claim if why == "claimed" else contextlib.nullcontext():
        assert run(lab.settings, 2.0, _finisher(lab, proc), quiet=0).finished == []
    assert [r for r in lab.runs() if r.startswith("runtime")] == ["runtime sb"] and lab.fs.killed == []
    assert lab.has_state("app") and all(lab.fs.exists(d) for d in dirs)
    if why == "recreated":
        left = [e for e in lab.events() if e["event"] == "finisher_left"]
        assert left and "re-created" in left[0]["reason"]


# -- looked at again under the claim, right before acting (issue 30 cases 4 and 5) -------------


def _rewrite_state(lab: Lab, cid: str, alive: bool) -> None:
    """The id's state now names another init (a container re-created under the same id)."""
    path = os.path.join(lab.root, cid, "state.json")
    with open(path) as f:
        doc = json.load(f)
    doc["init_process_pid"], doc["init_process_start"] = (
        (os.getpid(), start_time(os.getpid())) if alive else (DEAD_PID + 1, DEAD_START + 1))
    with open(path, "w") as f:
        json.dump(doc, f)


@pytest.mark.parametrize("alive", [True, False])
def test_a_container_recreated_under_the_id_is_never_touched(lab: Lab, alive: bool) -> None:
    """The record's init is dead, but the id's state now names another init (running, or itself
    stopped): not the recorded container. No runtime run, nothing removed or killed; the record stays
    for the id's new owner, one ``finisher_left`` entry says why. Control: the first test here."""
    dirs, record = _cut_short(lab, "c1")
    _rewrite_state(lab, "c1", alive)
    assert run(lab.settings, 2.0, _finisher(lab), quiet=0).finished == []
    assert lab.runs() == [] and lab.fs.rmdirs == [] and lab.fs.killed == []
    assert os.path.exists(record) and lab.has_state("c1") and all(lab.fs.exists(d) for d in dirs)
    (left,) = [e for e in lab.events() if e["event"] == "finisher_left"]
    assert "re-created" in left["reason"]


def test_the_identity_is_looked_at_again_before_the_removal(lab: Lab) -> None:
    """A container of the same id created while the runtime's delete ran (its state back, another
    init): its cgroups are not removed although they are empty."""
    dirs, record = _cut_short(lab, "c1")
    fresh = os.path.join(lab.tmp, "fresh-state.json")
    with open(os.path.join(lab.root, "c1", "state.json")) as f:
        doc = json.load(f)
    doc["init_process_pid"], doc["init_process_start"] = os.getpid(), start_time(os.getpid())
    with open(fresh, "w") as f:
        json.dump(doc, f)
    with open(record) as f:
        runtime = json.load(f)["runtime"]
    with open(runtime, "a") as f:  # after its own rm -rf: a `runc create` of the same id got in
        f.write(f'mkdir -p "{lab.root}/c1" && cp "{fresh}" "{lab.root}/c1/state.json"\n')
    with open(runtime) as f:  # ... before the `exit`
        lines = f.read().splitlines()
    exit_line = next(i for i, line in enumerate(lines) if line.startswith("exit"))
    lines.append(lines.pop(exit_line))
    with open(runtime, "w") as f:
        f.write("\n".join(lines) + "\n")
    assert run(lab.settings, 2.0, _finisher(lab), quiet=0).finished == []
    assert lab.runs() == ["runtime c1"] and lab.fs.rmdirs == [] and all(lab.fs.exists(d) for d in dirs)
    assert os.path.exists(record)


def test_a_bundle_still_held_keeps_a_pending_record_waiting(lab: Lab) -> None:
    """runc 1.1 dropped the state (and with it the bundle label): the record's own bundle stands in.
    While it exists containerd still works on the container; once it is gone, the record is finished."""
    import shutil

    dirs = lab.container("c1")
    shutil.rmtree(os.path.join(lab.root, "c1"))
    bundle = os.path.join(lab.tmp, "bundle-c1")
    os.makedirs(bundle)
    record = PendingRecord("c1", lab.root, dirs, DEAD_PID, DEAD_START, lab.runtime(0), 1.0, bundle, "")
    path = write_record(lab.settings.pending_dir, record)
    assert run(lab.settings, 2.0, _finisher(lab), quiet=0).finished == []
    assert os.path.exists(path) and lab.fs.rmdirs == []
    os.rmdir(bundle)
    assert run(lab.settings, 2.0, _finisher(lab), quiet=0).finished == ["c1"]
    assert lab.runs() == [] and not any(lab.fs.exists(d) for d in dirs)


@pytest.mark.parametrize("sandbox_state", [True, False])
def test_a_pod_members_bundle_holds_it_only_while_its_sandbox_lives(lab: Lab, sandbox_state: bool) -> None:
    """A pod's container with its bundle still there: held while the sandbox has state (containerd
    still works on the pod); once the sandbox is gone (the dead-shim path deletes only the sandbox and
    its bundle, the sibling's stays until the CRI removes it), the shim check alone holds it."""
    if sandbox_state:
        lab.container("sb", labels=SB)
    bundle = os.path.join(lab.tmp, "bundle-app")
    os.makedirs(bundle)
    dirs, _ = _cut_short(lab, "app", sandbox="sb")
    state_file = os.path.join(lab.root, "app", "state.json")
    with open(state_file) as f:
        doc = json.load(f)
    doc["config"]["labels"] = [f"bundle={bundle}", "io.kubernetes.cri.sandbox-id=sb"]
    with open(state_file, "w") as f:
        json.dump(doc, f)
    finished = run(lab.settings, 2.0, _finisher(lab), quiet=0).finished
    assert finished == ([] if sandbox_state else ["app"])
    assert all(lab.fs.exists(d) for d in dirs) == sandbox_state


def _crun_container(lab: Lab, cid: str, bundle: str, sandbox: str) -> list[str]:
    """crun's state: ``status`` (its bundle, a relative cgroup path) and config.json's annotations."""
    os.makedirs(os.path.join(lab.root, cid))
    status = {"pid": DEAD_PID, "process-start-time": DEAD_START, "cgroup-path": f"/rgt/{cid}",
              "bundle": bundle, "created": "2026-11-30T10:00:00.123456789Z", "systemd-cgroup": False}
    with open(os.path.join(lab.root, cid, "status"), "w") as f:
        json.dump(status, f)
    with open(os.path.join(lab.root, cid, "config.json"), "w") as f:
        json.dump({"annotations": {"io.kubernetes.cri.sandbox-id": sandbox}}, f)
    dirs = [f"{m}/rgt/{cid}" for m in sorted(mounts())]
    for d in dirs:
        lab.fs.add(d)
    return dirs


@pytest.mark.parametrize("hold", ["bundle", "shim_of_the_sandbox", "none"])
def test_crun_state_gets_the_same_guards(lab: Lab, hold: str) -> None:
    """crun's state is read with the cgroup mounts (it was skipped: StateMissing), its bundle comes
    from its status and its sandbox from config.json: either still held means hands off."""
    bundle = os.path.join(lab.tmp, "bundle-c1")
    if hold == "bundle":
        os.makedirs(bundle)
    lab.container("sb", labels=SB)  # the pod's sandbox still has state: containerd still works on it
    dirs = _crun_container(lab, "c1", bundle, "sb")
    record = PendingRecord("c1", lab.root, dirs, DEAD_PID, DEAD_START, lab.runtime(0), 1.0)
    write_record(lab.settings.pending_dir, record)
    proc = "/proc"
    if hold == "shim_of_the_sandbox":
        proc = _fake_proc(lab.tmp, ["/usr/bin/containerd-shim-runc-v2", "-namespace", "k8s.io", "-id", "sb",
                                    "-address", "/run/containerd/containerd.sock"])
    finished = run(lab.settings, 2.0, _finisher(lab, proc), quiet=0).finished
    assert finished == ([] if hold != "none" else ["c1"])
    assert all(lab.fs.exists(d) for d in dirs) == (hold != "none")


def test_a_state_directory_without_state_waits(lab: Lab) -> None:
    """``<root>/<id>`` without state.json: a container of that id being created. Nothing is done."""
    import shutil

    _, record = _cut_short(lab, "c1")
    shutil.rmtree(os.path.join(lab.root, "c1"))
    os.makedirs(os.path.join(lab.root, "c1"))
    assert run(lab.settings, 2.0, _finisher(lab), quiet=0).finished == []
    assert lab.fs.rmdirs == [] and os.path.exists(record)


@pytest.mark.parametrize(("active_state", "reset"), [("active", False), ("deactivating", False),
                                                     ("failed", True)])
def test_the_scope_is_only_ever_reset_never_stopped(
    lab: Lab, monkeypatch: pytest.MonkeyPatch, active_state: str, reset: bool
) -> None:
    """The systemd driver's scope of a finished record: a *failed* unit is reset once empty; an active
    one (a container re-created under the id runs in it) or one systemd is stopping is left as it is:
    ``systemctl stop`` is never sent."""
    import runc_guard.delete.systemd_scope as scope
    from runc_guard.delete import unit_name

    calls: list[str] = []
    status = scope.UnitStatus("cri-containerd-c1.scope", "loaded", active_state, "x", "timeout", "/")
    monkeypatch.setattr(unit_name, "transient_unit_loaded", lambda _unit: True)
    monkeypatch.setattr(scope, "query", lambda u, _d: scope.ScopeResult(u, active_state, status=status))
    monkeypatch.setattr(scope, "stop", lambda u, _d: calls.append("stop") or scope.ScopeResult(u, "stopped"))
    monkeypatch.setattr(
        scope, "reset_failed", lambda u, _d: calls.append("reset") or scope.ScopeResult(u, "reset_failed")
    )
    dirs = lab.container("c1", relative="/rgt/cri-containerd-c1.scope")
    write_record(lab.settings.pending_dir,
                 PendingRecord("c1", lab.root, dirs, DEAD_PID, DEAD_START, lab.runtime(0), 1.0))  # fmt: skip
    assert run(lab.settings, 2.0, _finisher(lab), quiet=0).finished == ["c1"]
    assert calls == (["reset"] if reset else [])


def test_a_pending_record_naming_a_path_is_never_acted_on(lab: Lab) -> None:
    """A pending record is input too: an id that is not one (``../state/c1``) reaches no path, no
    runtime, no rmdir."""
    dirs = lab.container("c1")
    root = os.path.join(lab.tmp, "x")  # root/../state/c1 is the real state of c1
    record = PendingRecord("../state/c1", root, dirs, DEAD_PID, DEAD_START, lab.runtime(0), 1.0)
    write_record(lab.settings.pending_dir, record)
    assert run(lab.settings, 2.0, _finisher(lab), quiet=0).finished == []
    assert lab.runs() == [] and lab.fs.rmdirs == [] and lab.has_state("c1")


def test_a_sibling_recreated_while_its_delete_waits_is_never_the_runtimes_target(lab: Lab) -> None:
    """The sibling's delete waits for a process in its cgroups; meanwhile the id is re-created (a new
    init in its state). Right before the runtime would run, the state is looked at again: the runtime
    is not run (``refused``, its own entry), the new state stays. Control: the first sibling test."""
    lab.container("sb", labels=SB)
    lab.container("app", pidns="private", labels=_of("sb"), pids=(4242,))
    _delete_sandbox(lab)

    def recreate_once(fs: FakeCgroupFs) -> None:
        if 4242 in fs.alive:
            _rewrite_state(lab, "app", alive=True)
            fs.exit(4242)

    lab.fs.on_wait = recreate_once
    run(lab.settings, 60.0, _finisher(lab), quiet=0)
    assert [r for r in lab.runs() if r.startswith("runtime")] == ["runtime sb"]
    assert lab.has_state("app")
    entry = [e for e in lab.events() if e["event"] == "delete" and e["container_id"] == "app"][-1]
    assert (entry["outcome"], entry["sandbox_id"]) == ("refused", "sb"), entry


def test_a_sibling_recreated_before_its_wait_is_never_killed(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The id is re-created (a new init in its state, a process of it in the same cgroups) after the
    finisher looked at the sibling and before its delete's wait: identity is looked at under the claim
    before the first kill, so nothing is killed and the runtime not run (``refused``). Before: the
    wait killed the new container's process, and only the runtime was refused."""
    from runc_guard.node import finisher as finisher_mod

    lab.container("sb", labels=SB)
    dirs = lab.container("app", labels=_of("sb"))  # host PID: the wait may kill stragglers
    _delete_sandbox(lab)
    real = finisher_mod.LateSibling.run_sibling

    def recreated_first(self: finisher_mod.LateSibling, state: Any) -> int:
        _rewrite_state(lab, "app", alive=True)
        for path in dirs:
            lab.fs.add(path, [4343])  # the new container's process
        return real(self, state)

    monkeypatch.setattr(finisher_mod.LateSibling, "run_sibling", recreated_first)
    run(lab.settings, 60.0, _finisher(lab), quiet=0)
    assert lab.fs.killed == [] and 4343 in lab.fs.alive
    assert [r for r in lab.runs() if r.startswith("runtime")] == ["runtime sb"]
    entry = [e for e in lab.events() if e["event"] == "delete" and e["container_id"] == "app"][-1]
    assert (entry["outcome"], entry["stragglers_killed"]) == ("refused", []), entry


def test_a_sibling_record_names_its_bundle_and_another_bundle_is_another_container(lab: Lab) -> None:
    """The sandbox's delete records each sibling's bundle; a state with the recorded init but another
    bundle is not the recorded container: refused, nothing run."""
    lab.container("sb", labels=SB)
    lab.container("app", labels=_of("sb"))
    _delete_sandbox(lab)
    docs = [doc for _, doc in iter_aside(lab.settings.cache_dir) if doc is not None]
    assert [d["bundle"] for d in docs] == ["/run/bundles/app"], docs
    path = os.path.join(lab.root, "app", "state.json")
    with open(path) as f:
        doc = json.load(f)
    doc["config"]["labels"] = ["bundle=/run/bundles/other", *doc["config"]["labels"][1:]]
    with open(path, "w") as f:
        json.dump(doc, f)
    run(lab.settings, 60.0, _finisher(lab), quiet=0)
    assert [r for r in lab.runs() if r.startswith("runtime")] == ["runtime sb"]
    entry = [e for e in lab.events() if e["event"] == "delete" and e["container_id"] == "app"][-1]
    assert entry["outcome"] == "refused", entry


def test_siblings_are_deleted_with_the_finisher_off_and_without_the_quiet_wait(lab: Lab) -> None:
    """finish_window 0 (the finisher off): the sandbox's dead sibling is still deleted after the
    reply (the sandbox's delete did that before, inline), at once rather than after ``quiet``; a
    pending record beside it, what a deadline cut short, is not finished (that is the opt-in part)."""
    lab.container("sb", labels=SB)
    dead = lab.container("app", labels=_of("sb"))
    assert lab.run("sb", lab.runtime(0)) == 0
    assert lab.entry()["siblings"] == [{"id": "app", "left_for": "finisher"}]
    _, record = _cut_short(lab, "c1")
    removed_at: list[float] = []
    real_rmdir = lab.fs.rmdir

    def timed_rmdir(path: str) -> None:
        real_rmdir(path)
        removed_at.append(lab.clock())

    lab.fs.rmdir = timed_rmdir  # type: ignore[method-assign]
    calm = _fake_proc(lab.tmp, ["/bin/sleep", "60"])  # not the host's: it may have cleanups of its own
    started = lab.clock()
    assert run(lab.settings, 0.0, _finisher(lab, calm), quiet=5.0).finished == ["app"]
    assert not any(lab.fs.exists(d) for d in dead) and not lab.has_state("app")
    assert removed_at and max(removed_at) - started < 1.0, "the sibling waited for the quiet period"
    assert os.path.exists(record) and lab.has_state("c1")
    assert lab.entry()["container_id"] == "app"


@pytest.mark.parametrize(("cleanup_of", "finished"), [("c9", ["app"]), ("sb", []), ("app", [])])
def test_siblings_wait_only_for_a_cleanup_of_their_own_pod(
    lab: Lab, cleanup_of: str, finished: list[str]
) -> None:
    """A dead-shim cleanup of another container (a storm elsewhere) does not hold a sibling back: it
    ran inline on containerd's time before, now niced after the reply. One of its sandbox (the
    sandbox's own unmounts after our reply) or of itself does, for as long as it runs."""
    lab.container("sb", labels=SB)
    lab.container("app", labels=_of("sb"))
    assert lab.run("sb", lab.runtime(0)) == 0
    proc = _fake_proc(lab.tmp, ["/usr/bin/containerd-shim-runc-v2", "-namespace", "k8s.io", "-id", cleanup_of,
                                "-address", "/run/containerd/containerd.sock", "delete"])
    started = lab.clock()
    assert run(lab.settings, 0.0, _finisher(lab, proc), quiet=5.0).finished == finished
    if finished:
        assert lab.clock() - started < 5.0


def test_a_sibling_deleted_meanwhile_by_another_delete_leaves_no_record(lab: Lab) -> None:
    """containerd 1.6 deletes a pod's container itself: when that delete removed the sibling's state
    while the finisher's delete of it waited, the runtime answers "does not exist" and what is left
    is removed; no record stays (seen in the CRI lab: a record left after kubelet's removal)."""
    import shutil

    lab.container("sb", labels=SB)
    dirs = lab.container("app", pidns="private", labels=_of("sb"), pids=(4242,))
    _delete_sandbox(lab)

    def deleted_by_containerd(fs: FakeCgroupFs) -> None:
        if 4242 in fs.alive:
            shutil.rmtree(os.path.join(lab.root, "app"))
            fs.exit(4242)

    lab.fs.on_wait = deleted_by_containerd
    assert run(lab.settings, 60.0, _finisher(lab), quiet=0).finished == ["app"]
    assert lab.records() == [] and not any(lab.fs.exists(d) for d in dirs)


def test_the_finisher_reclaims_a_memcg_before_it_removes_it(lab: Lab) -> None:
    """What a cut-short delete left is removed by the finisher after the reply: an empty memory
    cgroup among it is reclaimed first (the sweep's budget), and the entry says how much (issue 32)."""
    dirs, _record = _cut_short(lab, "c1")
    lab.fs.charged[dirs[0]] = 3 << 20
    finisher = run(lab.settings, 60.0, _finisher(lab), quiet=0)
    assert finisher.finished == ["c1"]
    assert [p for p, _ in lab.fs.reclaims] == [dirs[0]] and not lab.fs.exists(dirs[0])
    entry = lab.entry()
    assert entry["memcg_reclaimed_kb"] == 3 << 10 and "memcg_unreclaimed" not in entry
    assert [s["reclaimed_kb"] for s in lab.stats()] == [3 << 10]



def _held(lab: Lab, name: str, reason: str = "page cache too large") -> tuple[str, str]:
    """A held-memcg record as delete.memcg_hold writes it (the directory itself is the fake's)."""
    import time

    from runc_guard.atomic import write_atomic
    from runc_guard.delete.memcg_hold import record_file

    held = f"/cg/memory/pod/.runc-guard-held.{name}"
    doc = {"container_id": name, "runtime_root": lab.root, "original": f"/cg/memory/pod/{name}", "held": held,
           "reason": reason, "created": time.time()}
    record = record_file(lab.settings.cache_dir, held)
    write_atomic(record, json.dumps(doc).encode(), 0o600, durable=False, dir_mode=0o700)
    return held, record


def test_a_held_memcg_keeps_the_finisher_until_it_is_reclaimed(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No pending record, one held memcg (delete.memcg_hold): the finisher takes one step of its reclaim
    per pass, past its window, until it is done; one memcg_reclaimed_late entry and a stats line that
    metrics counts as memory, not as a delete."""
    import runc_guard.node.finisher as finisher_mod
    from runc_guard.node.late_reclaim import Step

    held, record = _held(lab, "c1", "too much dirty (writeback would block)")
    steps: list[str] = []

    def step(path: str, got: dict[str, object], reparents: bool = False) -> Step:
        steps.append(str(got["held"]))
        if len(steps) < 4:
            return Step(False, 64 << 20, 192 << 20, "dirty pages waiting for writeback")
        os.unlink(path)
        return Step(True, 192 << 20, 0, "")

    monkeypatch.setattr(finisher_mod, "late_step", step)
    run(lab.settings, 0.0, _finisher(lab), quiet=0)  # window 0: it would leave at once, but for the memcg
    assert steps == [held] * 4 and not os.path.exists(record)
    [entry] = lab.events()
    assert (entry["event"], entry["held"]) == ("memcg_reclaimed_late", held)
    assert entry["memcg_reclaimed_kb"] == 384 << 10
    assert [(s["kind"], s["reclaimed_kb"]) for s in lab.stats()] == [("memcg", 384 << 10)]


def test_one_pass_reclaims_a_bounded_share_of_all_held_memcgs(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A storm of large caches is reclaimed at HELD_PASS_BYTES a pass, not a step per memcg per pass."""
    import runc_guard.node.finisher as finisher_mod
    from runc_guard.node.late_reclaim import Step

    for name in ("a", "b", "c"):
        _held(lab, name)
    stepped: list[str] = []

    def step(path: str, got: dict[str, object], reparents: bool = False) -> Step:
        stepped.append(str(got["container_id"]))
        return Step(False, finisher_mod.HELD_PASS_BYTES // 2 + 1, 1 << 30, "reclaiming")

    monkeypatch.setattr(finisher_mod, "late_step", step)
    assert _finisher(lab).reclaim_held() == 3
    assert len(stepped) == 2  # the second step passed the pass's share: the third waits for the next pass


def test_a_held_record_dated_ahead_never_keeps_the_finisher_past_its_give_up(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A held record whose ``created`` lies ahead (a clock stepped back, hostile input) is given up
    HELD_GIVE_UP s after this finisher first saw it, with one entry: its age alone never gets there."""
    import time

    import runc_guard.node.finisher as finisher_mod
    from runc_guard.node.late_reclaim import Step

    _, record = _held(lab, "c1")
    with open(record) as f:
        doc = json.load(f)
    doc["created"] = time.time() + 10 * finisher_mod.HELD_GIVE_UP
    with open(record, "w") as f:
        json.dump(doc, f)
    appeared = Step(False, why="a cgroup appeared in it")
    monkeypatch.setattr(finisher_mod, "late_step", lambda _p, _d, **_: appeared)
    started = lab.clock()

    def bounded(_fs: Any) -> None:
        assert lab.clock() - started < 2 * finisher_mod.HELD_GIVE_UP, "the finisher outlived its give-up"

    lab.fs.on_wait = bounded
    run(lab.settings, 0.0, _finisher(lab), quiet=0)
    give_up = finisher_mod.HELD_GIVE_UP
    assert give_up <= lab.clock() - started <= give_up + 2 * POLL
    assert [(e["event"], e["container_id"]) for e in lab.events()] == [("finisher_left", "c1")]
    assert os.path.exists(record)  # the sweep's and audit's now


def test_a_held_record_dated_ahead_ages_from_the_finishers_first_look(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """late_reclaim's LATE_MAX counts from the older of the record's date and this finisher's first
    look: a record dated a year ahead is as old as the finisher has seen it, never "not late yet"."""
    import time

    import runc_guard.node.finisher as finisher_mod
    from runc_guard.node.late_reclaim import Step

    _, record = _held(lab, "c1")
    with open(record) as f:
        doc = json.load(f)
    doc["created"] = time.time() + 365 * 86400
    with open(record, "w") as f:
        json.dump(doc, f)
    seen: list[float] = []

    def step(_path: str, held: dict[str, Any], **_: Any) -> Step:
        seen.append(float(held["created"]))
        return Step(False, why="reclaiming")

    monkeypatch.setattr(finisher_mod, "late_step", step)
    finisher = _finisher(lab)
    finisher.reclaim_held()
    lab.clock.now += 130
    finisher.reclaim_held()
    assert seen[0] <= time.time() + 1, "dated ahead: its age starts at this finisher's first look"
    assert time.time() - seen[1] >= 129, "aged by what the finisher saw, not by its date"


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` so far (its /proc stat), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_finisher_ends_whatever_held_records_remain(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42 case 1: the detached finisher (the program a delete starts) with one unreadable
    held-memcg record and one it cannot finish, past HELD_GIVE_UP. It ends within its window plus a
    pass, writes one ``finisher_left`` entry for the one it gave up on and none for the unreadable one,
    and leaves both records for the sweep, listed by audit and counted by the metrics. Before: it
    never ended (a pass without a sleep, again and again; an entry and a reporter each time)."""
    import signal
    import time

    from runc_guard.delete.memcg_hold import held_dir, record_file
    from runc_guard.delete.report import detach_finisher
    from runc_guard.node.audit import AuditReport, families, held_memcgs, judge
    from runc_guard.node.finisher import HELD_GIVE_UP

    cache, window = tmp_path / "cache", 1.0
    for key, value in {"CONFIG": tmp_path / "none.toml", "CACHE_DIR": cache, "PENDING_DIR": tmp_path / "p",
                       "LOG_FILE": tmp_path / "events.jsonl", "STATS_FILE": tmp_path / "stats.jsonl",
                       "JOURNAL_SOCKET": tmp_path / "no-journald.socket", "REPORTER_LINGER": 0,
                       "FINISH_WINDOW": window}.items():  # fmt: skip
        monkeypatch.setenv(f"RUNC_GUARD_{key}", str(value))
    os.makedirs(held_dir(str(cache)), mode=0o700)
    unreadable = os.path.join(held_dir(str(cache)), "00000000-unreadable.json")
    with open(unreadable, "w") as f:
        f.write("{}")
    os.chmod(unreadable, 0o666)  # writable by anyone: never trusted (atomic.read_trusted)
    held = tmp_path / "pod" / ".runc-guard-held.c1"  # no cgroup: a held path the finisher may not touch
    held.mkdir(parents=True)
    doc = {"container_id": "c1", "runtime_root": "/run/containerd/runc/k8s.io", "held": str(held),
           "original": str(held.parent / "c1"), "reason": "dirty", "created": time.time() - HELD_GIVE_UP - 1}
    with open(record_file(str(cache), str(held)), "w") as f:
        json.dump(doc, f)
    started = time.monotonic()
    pid = detach_finisher(str(cache))
    assert pid > 0
    bound = window + 5.0  # its window, one pass, and an interpreter's start on a busy CI node
    lifetime, cpu = None, 0.0
    try:
        while time.monotonic() - started < bound:
            cpu = _cpu_seconds(pid) or cpu
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                lifetime = time.monotonic() - started
                break
            time.sleep(0.05)
    finally:
        if lifetime is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    # Its entries go through the spool: the reporter it started may still be sending them.
    assert wait_reported(str(cache)), "the finisher's reporter did not finish sending its entries"
    lefts = [e for e in (json.loads(line) for line in _lines(tmp_path / "events.jsonl"))
             if e.get("event") == "finisher_left"]  # fmt: skip
    end = f"ended after {lifetime:.2f} s" if lifetime is not None else f"still alive after {bound:.0f} s"
    print(f"\nfinisher, 2 held records it cannot finish: {end}, {cpu:.2f} CPU s, {len(lefts)} finisher_left")
    assert lifetime is not None, f"the finisher did not end: {cpu:.2f} CPU s, {len(lefts)} entries"
    assert [e["container_id"] for e in lefts] == ["c1"], lefts
    found = held_memcgs(str(cache), time.time())
    assert sorted("error" in h for h in found) == [False, True], found
    report = AuditReport([])
    report.held_memcgs = found
    judge(report, 10, 3600.0, None)
    assert report.status == "problem"  # the unreadable record, at once; the other once HELD_STALE passed
    [gauge] = [f for f in families(report, time.time()) if f.name == "runc_guard_memcgs_held"]
    assert gauge.samples == (((), 2.0),), gauge


def _lines(path: Any) -> list[str]:
    try:
        with open(path) as f:
            return [line for line in f if line.strip()]
    except FileNotFoundError:
        return []


# -- crun's systemd driver: the pod's processes in ``<prefix>-<id>.scope/container`` ---------------


def _crun_systemd(lab: Lab, cid: str, labels: dict[str, str], pids: tuple[int, ...] = ()) -> list[str]:
    """crun 1.28's state with its systemd driver: ``cgroup-path`` ``<scope>/container``, ``scope`` its unit,
    a private PID namespace and the CRI annotations in config.json; the scope and leaf made now in the
    fake's v2 hierarchy. crun's one path lands under every mount (the v1 one never exists): returns each
    mount's leaf and scope, leaf first, as the delete lists them."""
    scope = f"/rgt/cri-containerd-{cid}.scope"
    os.makedirs(os.path.join(lab.root, cid))
    status = {"pid": DEAD_PID, "process-start-time": DEAD_START, "cgroup-path": f"{scope}/container",
              "scope": f"cri-containerd-{cid}.scope", "systemd-cgroup": True,
              "created": "2026-11-30T10:00:00.123456789Z"}  # fmt: skip
    with open(os.path.join(lab.root, cid, "status"), "w") as f:
        json.dump(status, f)
    config = {"linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}]}, "annotations": labels}
    with open(os.path.join(lab.root, cid, "config.json"), "w") as f:
        json.dump(config, f)
    lab.fs.add(f"/sys/fs/cgroup/unified{scope}", mtime=time.time())
    lab.fs.add(f"/sys/fs/cgroup/unified{scope}/container", pids, mtime=time.time())
    return [p for m in sorted(mounts()) for p in (f"{m}{scope}/container", f"{m}{scope}")]


@pytest.fixture
def no_transient_units(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """systemd has freed every scope (no transient unit file): nothing to ask systemctl."""
    from runc_guard.delete import unit_name

    transient = os.path.join(str(tmp_path), "transient")
    os.makedirs(transient)
    monkeypatch.setattr(unit_name, "TRANSIENT_DIR", transient)


@pytest.mark.usefixtures("no_transient_units")
def test_crun_systemd_pod_path_b_leaves_nothing(lab: Lab) -> None:
    """Path B behind crun's systemd driver (issue 41 item 4): the sandbox's delete takes its own
    ``<scope>/container`` and scope, records the dead sibling, and the sibling's delete waits for its
    dying writer, then removes its leaf before its scope, names the unit and drops crun's status."""
    sandbox = _crun_systemd(lab, "sb", SB)
    app = _crun_systemd(lab, "app", _of("sb"), pids=(4242,))
    lab.fs.dying.add(4242)  # SIGKILLed with its PID namespace, held in D a while
    lab.fs.on_wait = lambda fs: fs.exit(4242) if len(fs.waits) >= 3 else None
    _delete_sandbox(lab)
    sb = lab.entry()
    assert (sb["outcome"], sb["cgroup_paths"]) == ("removed", sandbox)
    assert sb["systemd_unit"] == "cri-containerd-sb.scope"
    assert sb["siblings"] == [{"id": "app", "left_for": "finisher"}]
    assert run(lab.settings, 60.0, _finisher(lab), quiet=0).finished == ["app"]
    entry = lab.entry()
    assert (entry["container_id"], entry["outcome"], entry["exit_status"]) == ("app", "removed", 0)
    assert (entry["cgroup_paths"], entry["systemd_unit"]) == (app, "cri-containerd-app.scope")
    assert [d for d in lab.fs.rmdirs if d in app] == app[2:]  # the v2 leaf, then its scope
    assert not any(lab.fs.exists(d) for d in sandbox + app) and lab.fs.killed == []
    assert not os.path.exists(os.path.join(lab.root, "app", "status"))
    assert lab.records() == [] and list(iter_aside(lab.settings.cache_dir)) == []


@pytest.mark.usefixtures("no_transient_units")
def test_crun_systemd_sibling_cut_short_is_finished_late(lab: Lab) -> None:
    """The sibling's writer outlasts its delete's deadline: exit 75 with a pending record naming the leaf and
    its scope, which the trust rule accepts; once the writer is gone the finisher completes it."""
    _crun_systemd(lab, "sb", SB)
    app = _crun_systemd(lab, "app", _of("sb"), pids=(4242,))
    lab.fs.dying.add(4242)
    _delete_sandbox(lab)
    settings = lab.settings.replace(delete_timeout=0.5)
    finisher = Finisher(settings, fs=lab.fs, clock=lab.clock, mounts=mounts)
    assert run(settings, 1.0, finisher, quiet=0).finished == ["app"]
    entry = lab.entry()
    assert (entry["container_id"], entry["outcome"], entry["exit_status"]) == ("app", "deadline", 75)
    (record,) = lab.records()
    with open(os.path.join(settings.pending_dir, record)) as f:
        assert json.load(f)["cgroup_paths"] == app
    lab.fs.exit(4242)
    assert run(settings, 60.0, _finisher(lab), quiet=0).finished == ["app"]
    assert lab.entry()["outcome"] == "finished_late" and lab.records() == []
    assert not any(lab.fs.exists(d) for d in app)
    assert not os.path.exists(os.path.join(lab.root, "app", "status"))


@pytest.mark.usefixtures("no_transient_units")
def test_crun_systemd_scope_of_another_container_is_stepped_aside_from(lab: Lab) -> None:
    """A tampered status naming another container's scope + ``container``: the sandbox's delete steps aside
    (crun alone, nothing removed by runc-guard, no sibling recorded), as before the rule."""
    _crun_systemd(lab, "sb", SB)
    other = _crun_systemd(lab, "other", _of("sb2"))
    status = os.path.join(lab.root, "sb", "status")
    with open(status) as f:
        doc = json.load(f)
    doc["cgroup-path"] = "/rgt/cri-containerd-other.scope/container"
    with open(status, "w") as f:
        json.dump(doc, f)
    assert lab.run("sb", lab.runtime(0)) == 0
    entry = lab.entry()
    assert entry["outcome"] == "stepped_aside" and "not named after container sb" in entry["reason"]
    assert all(lab.fs.exists(d) for d in other[2:]) and lab.fs.rmdirs == [] and "siblings" not in entry
