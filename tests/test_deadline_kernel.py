"""What the caller allows a delete (issue 30, case 9), on the real kernel with real runc 1.1.5.

runc 1.1's ``delete --force`` of a container with its own PID namespace kills
init and then polls up to 10 s for it to die; init stays in do_exit until every
other process of its namespace is gone. Children held in a frozen freezer make
that ~6 s: stock runc then finishes (exit 0, nothing left). Under the serving
shim (containerd's Delete for CRI's exit handler: 10 s) runc-guard must finish
too, not cut it at the dead-shim path's 4 s; an unknown caller keeps today's
default (the control: exit 75 at 4 s, record and state kept). The caller is what
runc-guard reads from its parent's command line, so the serving shim is stood in
for by a process with exactly that command line (``containerd-shim-runc-v2
-namespace <ns> -id <id> -address <socket>``; the real shim runs ``runc delete``
without ``--force``, docs/deadline.md: the budget does not depend on the flag).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from labkit.kernel import RUNC, FreezerHold, RuncContainer, reported_events, wait_for, wait_reported
from labkit.scenario import guard_env

pytestmark = pytest.mark.kernel

#: How long the held children keep init in do_exit: past 4 s, inside runc 1.1's 10 s poll.
HOLD_S = 6.0
#: The serving shim's command line (containerd's manager_linux.go newCommand), after argv[0].
SHIM_ARGS = ["-namespace", "k8s.io", "-id", "{id}", "-address", "/run/containerd/containerd.sock"]
#: The stand-in parent (/bin/sh under the shim's argv[0]): runs the delete as its child, exits with its
#: status (the ``exit`` keeps sh from exec'ing its last command: it must stay the parent).
PARENT_SCRIPT = '"$RG_RUNTIME" --root "$RG_ROOT" delete --force "$RG_ID"; exit $?'


@pytest.fixture
def held_private_container(workdir: str) -> Iterator[tuple[RuncContainer, FreezerHold]]:
    """runc 1.1.5, own PID namespace, 3 children of which 2 are held in a frozen freezer."""
    ctr = RuncContainer.start(workdir, children=3, runc=RUNC, host_pid=False)
    hold = FreezerHold.create()
    try:
        hold.hold(ctr.children()[:2])
        yield ctr, hold
    finally:
        hold.destroy()
        ctr.destroy()


def _delete(
    runtime: str, ctr: RuncContainer, hold: FreezerHold, env: dict[str, str], parent: str
) -> dict[str, object]:
    """``runtime delete --force`` run by ``parent`` (serving_shim or unknown); the hold ends after HOLD_S."""
    command = [runtime, "--root", ctr.root, "delete", "--force", ctr.id]
    if parent == "serving_shim":
        shim = [a.format(id=ctr.id) for a in SHIM_ARGS]
        command = ["containerd-shim-runc-v2", "-c", PARENT_SCRIPT, *shim]
        env = dict(env, RG_RUNTIME=runtime, RG_ROOT=ctr.root, RG_ID=ctr.id)
    timer = threading.Timer(HOLD_S, hold.release)
    timer.start()
    started = time.monotonic()
    try:
        proc = subprocess.run(
            command, executable="/bin/sh" if parent == "serving_shim" else None,
            capture_output=True, text=True, env=env, check=False, timeout=60,
        )  # fmt: skip
    finally:
        timer.cancel()
    took = time.monotonic() - started
    hold.release()
    wait_for(lambda: not ctr.pids(), 5)
    return {
        "status": proc.returncode,
        "stderr": proc.stderr,
        "took_s": round(took, 2),
        "dirs": len(ctr.cgroup_dirs()),
        "state": os.path.exists(os.path.join(ctr.root, ctr.id, "state.json")),
    }


def test_stock_finishes_a_slow_private_pid_delete_force(
    held_private_container: tuple[RuncContainer, FreezerHold], workdir: str
) -> None:
    """Control: stock runc 1.1.5 polls for the exiting init and finishes after the hold: exit 0, 0 dirs."""
    ctr, hold = held_private_container
    result = _delete(RUNC, ctr, hold, dict(os.environ), "serving_shim")
    print(f"stock runc 1.1.5, own PID ns, hold {HOLD_S} s: {result}")
    assert (result["status"], result["dirs"], result["state"]) == (0, 0, False), result
    assert HOLD_S <= result["took_s"] < 10, result


@pytest.mark.parametrize(("parent", "status"), [("serving_shim", 0), ("unknown", 75)])
def test_guard_budget_follows_the_caller(
    held_private_container: tuple[RuncContainer, FreezerHold],
    workdir: str,
    shim_binary: str,
    parent: str,
    status: int,
) -> None:
    """Under the serving shim runc-guard lets runc finish as stock does (exit 0, 0 dirs, state gone);
    an unknown caller keeps the 4 s default (exit 75, state and record kept for the retry or sweep)."""
    ctr, hold = held_private_container
    result = _delete(shim_binary, ctr, hold, guard_env(workdir), parent)
    print(f"runc-guard under {parent}, own PID ns, hold {HOLD_S} s: {result}")
    assert result["status"] == status, result
    wait_reported(os.path.join(workdir, "cache"))
    entry = [e for e in reported_events(workdir) if e.get("event") == "delete"][-1]
    if status == 0:
        assert (result["dirs"], result["state"]) == (0, False), result
        assert entry["caller"] == "serving_shim" and entry["outcome"] != "deadline", entry
    else:
        assert result["state"] and result["took_s"] < HOLD_S, result
        assert "caller" not in entry and entry["outcome"] == "deadline", entry
