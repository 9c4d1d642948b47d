"""The finisher: what a deadline cut short is completed after the reply, and nothing else is touched.

Unit tests on the fake cgroupfs with a stand-in runtime (the delete unit tests' Lab):
every rule that makes the finisher step back, and the work it does once they hold.
The real kernel's version is in tests/test_finisher_kernel.py.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

import runc_guard.delete.report as report_mod
from runc_guard.delete.aside import OVERLOAD, iter_aside, write_aside
from runc_guard.delete.pending import Claim, PendingRecord, record_path, write_record
from runc_guard.logs import drain_spool
from runc_guard.node.finisher import Finisher, run
from runc_guard.procinfo import start_time
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
    (["-namespace", "k8s.io", "-id", "c1", "-address", "/run/containerd/containerd.sock", "delete"], ["c1"]),
])
def test_a_serving_shim_owns_the_container(lab: Lab, shim_args: list[str], finished: list[str]) -> None:
    """A shim serving the container (or its sandbox) means containerd's own retry comes: untouched.
    containerd's dead-shim cleanup (``... delete``) serves nothing and does not count."""
    _cut_short(lab, "c1", sandbox="sb")
    proc = _fake_proc(lab.tmp, ["/usr/bin/containerd-shim-runc-v2", *shim_args])
    assert run(lab.settings, 1.0, _finisher(lab, proc), quiet=0).finished == finished


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
    from runc_guard.shim.argv import parse

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
