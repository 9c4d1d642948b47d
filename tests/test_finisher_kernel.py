"""The finisher on the real kernel: a delete cut short by its deadline is completed after the reply.

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

import pytest

from labkit.kernel import RUNC, container_with_hold, reported_events, wait_for
from labkit.scenario import guard_env

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
        # The finisher is opt-in (settings.DEFAULT_FINISH_WINDOW): on, for 5 s after its quiet period.
        env = guard_env(workdir, RUNC_GUARD_RUNTIME=RUNC, RUNC_GUARD_DELETE_TIMEOUT="1",
                        RUNC_GUARD_FINISH_WINDOW="5")
        done = _delete(shim_binary, ctr.root, ctr.id, env)
        pending = os.path.join(workdir, "pending")
        assert done.returncode == 75, done.stderr
        assert os.listdir(pending) and ctr.cgroup_dirs(), "the deadline must have cut it short"
        hold.release()
        assert wait_for(lambda: not ctr.cgroup_dirs() and not os.listdir(pending), 20), (
            ctr.cgroup_dirs(), os.listdir(pending))
        assert not os.path.exists(os.path.join(ctr.root, ctr.id, "state.json"))
        late = [e for e in reported_events(workdir) if e.get("container_id") == ctr.id
                and e.get("outcome") == "finished_late"]
        assert len(late) == 1 and late[0]["runtime_runs"] == 1, reported_events(workdir)
        print(f"finisher: stock left {stock_left} dirs; runc-guard exit 75, then finished "
              f"{late[0]['since_record_ms']} ms after its record, removed {late[0]['removed']}")
