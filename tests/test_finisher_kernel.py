"""The finisher on the real kernel: a delete cut short by its deadline is completed after the reply.

The second case is a delete that stepped aside at start-up overload (every slot
taken): runc 1.3 ran alone, failed on the busy cgroup and kept its state (the
control); once containerd's bundle is gone and the children died, the finisher
re-runs runc's delete and removes the rest.

A host-PID runc 1.1.5 container, init killed, two children held in a frozen v1
freezer so that they outlive the delete's deadline; they are released after the
delete has replied. Stock runc in the same situation is the control (it exits 0
and leaks every directory). runc-guard replies 75 at its 1 s deadline with its
record kept, and then, with no sweep and no retry, its finisher re-runs runc's
delete and removes the rest once the children are gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

import pytest

from labkit import runtimes
from labkit.kernel import (
    RUNC,
    RuncContainer,
    container_with_hold,
    reported_events,
    wait_for,
    wait_reported,
)
from labkit.scenario import every_slot_taken, gone, guard_env, pod_teardown
from runc_guard.delete.aside import OVERLOAD, iter_aside

pytestmark = pytest.mark.kernel


def _delete(front: str, root: str, cid: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([front, "--root", root, "delete", "--force", cid], capture_output=True, text=True,
                          env=env, check=False, timeout=60)  # fmt: skip


def test_a_cut_short_delete_is_finished_after_the_reply(shim_binary: str, workdir: str) -> None:
    """Stock leaks; runc-guard exits 75 in time, then finishes alone: 0 dirs, no state, no record."""
    with container_with_hold(workdir, children=3, held=2) as (stock, hold):
        os.kill(stock.init_pid(), signal.SIGKILL)
        done = _delete(RUNC, stock.root, stock.id, dict(os.environ))
        hold.release()
        assert wait_for(lambda: not stock.pids(), 10)
        stock_left = len(stock.cgroup_dirs())
        assert done.returncode == 0 and stock_left > 0, (done, stock_left)  # the control leaked

    with container_with_hold(workdir, children=3, held=2) as (ctr, hold):
        os.kill(ctr.init_pid(), signal.SIGKILL)
        # The labs keep the finisher off (labkit.scenario.guard_env). Its window outlasts HOLD_MAX: a
        # suite running beside this test has containerd dead-shim cleanups of its own, and the
        # finisher rightly lets those go first, for up to 30 s.
        env = guard_env(workdir, RUNC_GUARD_RUNTIME=RUNC, RUNC_GUARD_DELETE_TIMEOUT="1",
                        RUNC_GUARD_FINISH_WINDOW="40")
        done = _delete(shim_binary, ctr.root, ctr.id, env)
        pending = os.path.join(workdir, "pending")
        assert done.returncode == 75, done.stderr
        assert os.listdir(pending) and ctr.cgroup_dirs(), "the deadline must have cut it short"
        hold.release()
        gone = ctr.bundle + ".gone"
        os.rename(ctr.bundle, gone)  # what containerd does once its dead-shim cleanup returned
        try:
            assert wait_for(lambda: not ctr.cgroup_dirs() and not os.listdir(pending), 60), (
                ctr.cgroup_dirs(), os.listdir(pending))
        finally:
            os.rename(gone, ctr.bundle)
        assert not os.path.exists(os.path.join(ctr.root, ctr.id, "state.json"))
        late = [e for e in reported_events(workdir) if e.get("container_id") == ctr.id
                and e.get("outcome") == "finished_late"]
        assert len(late) == 1 and late[0]["runtime_runs"] == 1, reported_events(workdir)
        print(f"finisher: stock left {stock_left} dirs; runc-guard exit 75, then finished "
              f"{late[0]['since_record_ms']} ms after its record, removed {late[0]['removed']}")


def test_what_an_overloaded_delete_left_to_the_runtime_is_finished(shim_binary: str, workdir: str) -> None:
    """Every slot taken: runc-guard steps aside and runc 1.3 alone fails on the busy cgroup (exit 1,
    state and dirs kept: the control is the runtime's own result). Nothing is done while containerd's
    bundle exists; once it is gone and the children died, the finisher re-runs runc's delete: 0 dirs,
    no state, no aside record, one finished_late entry (left_by overload)."""
    runc = runtimes.require(runtimes.RUNC_13)
    with container_with_hold(workdir, children=3, held=2, runc=runc) as (ctr, hold):
        os.kill(ctr.init_pid(), signal.SIGKILL)
        env = guard_env(workdir, RUNC_GUARD_RUNTIME=runc, RUNC_GUARD_FINISH_WINDOW="40")
        cache = env["RUNC_GUARD_CACHE_DIR"]
        with every_slot_taken(cache):
            done = _delete(shim_binary, ctr.root, ctr.id, env)
        state = os.path.join(ctr.root, ctr.id, "state.json")
        assert done.returncode == 1 and os.path.exists(state) and ctr.cgroup_dirs(), done.stderr
        asides = [doc for _, doc in iter_aside(cache) if doc is not None]
        assert [(d["kind"], d["runtime"]) for d in asides] == [(OVERLOAD, runc)], asides
        hold.release()
        assert wait_for(lambda: not ctr.pids(), 10)
        # containerd still holds the bundle: the finisher must leave it all alone
        assert not wait_for(lambda: not os.path.exists(state), 7), "acted while the bundle existed"
        gone = ctr.bundle + ".gone"
        os.rename(ctr.bundle, gone)  # what containerd does once its dead-shim cleanup returned
        try:
            assert wait_for(lambda: not ctr.cgroup_dirs() and not os.path.exists(state)
                            and not list(iter_aside(cache)), 60), (ctr.cgroup_dirs(), list(iter_aside(cache)))
        finally:
            os.rename(gone, ctr.bundle)
        late = [e for e in reported_events(workdir) if e.get("container_id") == ctr.id
                and e.get("outcome") == "finished_late"]
        assert [(e["left_by"], e["runtime_runs"]) for e in late] == [("overload", 1)], late
        print(f"finisher after overload: runc 1.3 alone exit 1, state kept; finished "
              f"{late[0]['since_record_ms']} ms after the aside record, removed {late[0]['removed']}")


# -- a CRI sandbox's reply never waits on its siblings (issue 30 case 1) ------------------------

def test_a_sandbox_replies_as_stock_and_its_sibling_is_finished_after(shim_binary: str, workdir: str) -> None:
    """Stock runc 1.1.5 deletes only the sandbox: replies at once, exit 0; the sibling's 10 dirs and
    state stay for good. runc-guard (finisher on) now replies before the sibling's held children are
    released (the sandbox's delete runs nothing of the sibling's), exit 0, the sandbox's dirs gone;
    the sibling is then deleted by its own delete in the finisher: 0 dirs, no state, its own
    canonical entry naming the sandbox. Before (issue 30): the reply waited 4.01 s on the sibling."""
    stock = pod_teardown(RUNC, workdir, dict(os.environ), 6.0)
    assert stock["status"] == 0 and stock["sibling_state"] and stock["sibling_dirs"], stock
    # The sibling's own delete starts right after the reply, while its children are still held (no
    # containerd cleanup to wait for here): cut short at its 4 s deadline, the finisher completes it.
    env = guard_env(workdir, RUNC_GUARD_RUNTIME=RUNC, RUNC_GUARD_FINISH_WINDOW="40")
    guard = pod_teardown(shim_binary, workdir, env, 60.0)
    assert guard["status"] == 0, guard["stderr"]
    assert guard["at_reply"] == {"sibling_dirs": stock["at_reply"]["sibling_dirs"], "held": True}, guard  # type: ignore[index]
    assert guard["sandbox_dirs"] == 0 and guard["sibling_dirs"] == 0 and not guard["sibling_state"], guard
    entries = [e for e in reported_events(workdir) if e.get("event") == "delete"]
    sandbox_entry = next(e for e in entries if e["container_id"] == guard["sandbox_id"])
    assert sandbox_entry["siblings"] == [{"id": guard["sibling_id"], "left_for": "finisher"}]
    # its own delete (cut short at 4 s while the hold lasts, then finished_late), or one that went through
    sibling_entries = [e for e in entries if e["container_id"] == guard["sibling_id"]]
    assert sibling_entries and sibling_entries[0]["sandbox_id"] == guard["sandbox_id"], entries
    sibling_entry = sibling_entries[-1]
    assert sibling_entry["outcome"] in ("removed", "already_gone", "finished_late"), sibling_entries
    print(f"sandbox reply: stock {stock['reply_s'] * 1000:.0f} ms exit 0, sibling {stock['sibling_dirs']} "
          f"dirs + state kept; runc-guard {guard['reply_s'] * 1000:.0f} ms exit 0, sibling 0 dirs, no state "
          f"{guard['settled_s']:.1f} s after the kill ({', '.join(e['outcome'] for e in sibling_entries)})")


# -- a container re-created under the id is never touched (issue 30 case 5) --------------------


def test_a_container_recreated_under_the_id_is_never_touched(shim_binary: str, workdir: str) -> None:
    """runc-guard's delete is cut short (exit 75, record kept); the runtime alone then deletes the
    container and a new one is created under the same id (fixed ctr/nerdctl names, Docker's restart)
    in other cgroups. The finisher, waking later, finds the id's state naming another init: it runs
    nothing and kills nothing (a ``finisher_left`` entry says why); the new container keeps running.
    Stock: nothing ever touches the new container. Before: the finisher ran ``runc delete --force``
    of the id, killing the new container."""
    env = guard_env(workdir, RUNC_GUARD_RUNTIME=RUNC, RUNC_GUARD_DELETE_TIMEOUT="1",
                    RUNC_GUARD_FINISH_WINDOW="40")
    with container_with_hold(workdir, children=3, held=2) as (old, hold):
        os.kill(old.init_pid(), signal.SIGKILL)
        done = _delete(shim_binary, old.root, old.id, env)
        assert done.returncode == 75 and os.listdir(os.path.join(workdir, "pending")), done.stderr
        hold.release()
        assert wait_for(lambda: not old.pids(), 10)
        alone = subprocess.run([RUNC, "--root", old.root, "delete", "--force", old.id], capture_output=True,
                               check=False, timeout=30)  # fmt: skip
        assert alone.returncode == 0 and not os.path.exists(os.path.join(old.root, old.id))
        new = RuncContainer.start(workdir, children=2, cid=old.id)
        try:
            init = new.init_pid()
            assert wait_for(lambda: any(e.get("event") == "finisher_left" and e.get("container_id") == old.id
                                        for e in reported_events(workdir)), 60), reported_events(workdir)
            left = next(e for e in reported_events(workdir) if e.get("event") == "finisher_left")
            assert "re-created" in left["reason"], left
            assert new.init_pid() == init and not gone(init) and len(new.pids()) == 3
            assert new.state()["init_process_pid"] == init
            print(f"re-created id: finisher left it ({left['reason'][:60]}...); new container running, "
                  f"{len(new.pids())} processes, {len(new.cgroup_dirs())} dirs")
        finally:
            new.destroy()


# -- a late sibling's identity, under its claim, before any kill (issue 42 case 5) ---------------


def test_a_sibling_recreated_before_its_wait_is_never_killed(
    workdir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sandbox's dead sibling, recorded for the finisher; between the finisher's look at it and
    its own delete's wait for the cgroups, the id is deleted by the runtime alone and a new
    container is created under it in the same cgroups (a fixed ``cgroupsPath``). The wait must
    not kill the new container's processes: its identity (init pid and start time) is looked at
    under the delete's claim, before any kill. Before: the wait SIGKILLed all 3 of them, and the
    identity check before the runtime then refused (the harm already done)."""
    from runc_guard.delete.aside import SIBLING, write_aside
    from runc_guard.node import finisher as finisher_mod
    from runc_guard.settings import Settings

    settings = Settings(
        runtime=RUNC, pending_dir=os.path.join(workdir, "pending"), cache_dir=os.path.join(workdir, "cache"),
        journal_socket=os.path.join(workdir, "no-journald.socket"),
        log_file=os.path.join(workdir, "events.jsonl"), stats_file=os.path.join(workdir, "stats.jsonl"),
        reporter_linger=0.0, finish_window=5.0,
    )  # fmt: skip
    old = RuncContainer.start(workdir, children=1)
    parent = old.cgroup_relative.rsplit("/", 1)[0].strip("/")
    made: list[RuncContainer] = []
    try:
        state = old.state()
        identity = (state["init_process_pid"], state["init_process_start"])
        for pid in old.pids():
            os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: not old.pids(), 10)
        sandbox = "rgtest-sandbox-gone"  # its state is gone: the sibling's bundle does not hold it
        args = ["--root", old.root, "delete", "--force", old.id]
        extra = {"sandbox_id": sandbox, "args": args, "init_pid": identity[0], "init_start": identity[1]}
        assert write_aside(settings.cache_dir, old.root, old.id, old.cgroup_dirs(), "dead sibling", SIBLING,
                           RUNC, extra)  # fmt: skip
        real = finisher_mod.LateSibling.run_sibling

        def recreated_first(self: finisher_mod.LateSibling, looked_at: Any) -> int:
            subprocess.run([RUNC, "--root", old.root, "delete", "--force", old.id], check=True, timeout=30)
            made.append(RuncContainer.start(workdir, children=2, parent=parent, cid=old.id))
            return real(self, looked_at)

        monkeypatch.setattr(finisher_mod.LateSibling, "run_sibling", recreated_first)
        finisher_mod.Finisher(settings).pass_once(siblings_only=True)
        assert made, "the sibling's delete never started"
        new = made[0]
        assert new.cgroup_dirs() == old.cgroup_dirs() or new.cgroup_relative == old.cgroup_relative
        alive = [p for p in new.pids() if not gone(p)]
        assert wait_reported(settings.cache_dir)
        entries = [e for e in reported_events(workdir) if e.get("container_id") == old.id]
        outcomes = [(e.get("event"), e.get("outcome"), len(e.get("stragglers_killed", []))) for e in entries]
        print(f"sibling re-created before its wait: {len(alive)} of 3 processes of the new container alive; "
              f"entries {outcomes}")
        assert len(alive) == 3, outcomes
        assert [(o, k) for _, o, k in outcomes] == [("refused", 0)], outcomes
    finally:
        for ctr in [*made, old]:
            ctr.destroy()
