"""runc >= 1.2 on a busy cgroup, on the real kernel: runc-guard waits, then re-runs the delete.

runc 1.2+ returns its destroy error (exit 1) and keeps its state when a cgroup
is still busy, so the delete can be run again (docs/background.md, the failure); runc-guard's
decision table says: wait until the cgroups are empty, then re-run the
runtime's delete. Proven here with the real runc 1.3 of Debian sid
(``labkit.runtimes``): a running host-PID container, two of its
children held in a frozen v1 freezer, ``delete --force``. runc kills init,
cannot remove the held children's cgroups and exits 1 keeping its state (the
control shows exactly that on its own); runc-guard releases nothing itself,
and the hold is released only once runc-guard is seen waiting after that
first run, so the re-run is the only way the delete can end well.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

import pytest

from labkit import runtimes
from labkit.kernel import children, container_with_hold, guard_is_waiting, reported_events, wait_for
from labkit.scenario import guard_env

pytestmark = pytest.mark.kernel

#: runc versions with the kept-state behaviour (first in v1.2.0, unchanged through 1.5.1):
#: the one Debian ships (sid).
VERSIONS = {"1.3": runtimes.RUNC_13}


def _runc(version: str) -> str:
    return runtimes.require(VERSIONS[version])


@pytest.mark.parametrize("version", list(VERSIONS))
def test_stock_runc_exits_1_and_keeps_its_state_on_a_busy_cgroup(
    workdir: str, version: str, record_property: Callable[[str, object], None]
) -> None:
    """Control: the same delete through runc alone fails (exit 1), leaves the held children's
    cgroups and keeps its state, so the runc-guard test below really meets a busy cgroup."""
    runc = _runc(version)
    with container_with_hold(workdir, children=3, held=2, runc=runc) as (ctr, hold):
        proc = subprocess.run(
            [runc, "--root", ctr.root, "delete", "--force", ctr.id],
            capture_output=True, text=True, check=False, timeout=120,
        )
        dirs = ctr.cgroup_dirs()
        state = os.path.exists(os.path.join(ctr.root, ctr.id, "state.json"))
        record_property("figure", f"rerun runc {version} alone: exit {proc.returncode}, "
                        f"{len(dirs)} dirs, state {'kept' if state else 'gone'}")
        assert proc.returncode == 1, proc.stderr
        assert "remove" in proc.stderr and "cgroup" in proc.stderr, proc.stderr
        assert dirs, "the held children must keep the container's cgroups"
        assert state, "runc >= 1.2 keeps its state when the cgroup removal failed"
        hold.release()


@pytest.mark.parametrize("version", list(VERSIONS))
def test_runc_guard_reruns_the_delete_once_the_cgroups_are_empty(
    shim_binary: str, workdir: str, version: str, record_property: Callable[[str, object], None]
) -> None:
    """Through runc-guard: runc's first run fails on the busy cgroup and keeps its state;
    runc-guard waits, the children die, the re-run succeeds: exit 0, ``runtime_runs >= 2``,
    no cgroup dir, no runc state, no pending record."""
    runc = _runc(version)
    with container_with_hold(workdir, children=3, held=2, runc=runc) as (ctr, hold):
        env = guard_env(workdir, RUNC_GUARD_RUNTIME=runc, RUNC_GUARD_DELETE_TIMEOUT="60")
        state = os.path.join(ctr.root, ctr.id, "state.json")
        with open(os.path.join(workdir, "guard.out"), "w+") as out, \
                open(os.path.join(workdir, "guard.err"), "w+") as err:
            guard = subprocess.Popen(
                [shim_binary, "--root", ctr.root, "delete", "--force", ctr.id],
                env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            )
            try:
                # The first run of runc (init alive: runc-guard runs it at once), then runc-guard
                # back in its wait loop with no child: that first run is over.
                assert wait_for(lambda: bool(children(guard.pid)), 30, 0.005), "runc never ran"
                assert wait_for(lambda: guard_is_waiting(guard.pid), 60, 0.01), "runc-guard never waited"
                first_run_kept_state = os.path.exists(state)
                busy = ctr.cgroup_dirs()
                hold.release()
                status = guard.wait(90)
            finally:
                if guard.poll() is None:
                    guard.kill()
                    guard.wait()
            err.seek(0)
            stderr = err.read()
            out.seek(0)
            stdout = out.read()
        (entry,) = [e for e in reported_events(workdir) if e["event"] == "delete"]
        record_property("figure", f"rerun runc-guard -> runc {version}: exit {status}, "
                        f"runtime_runs {entry['runtime_runs']}, outcome {entry['outcome']}, "
                        f"waited {entry['waited_ms']} ms, total {entry['total_ms']} ms")
        assert first_run_kept_state and busy, "runc's first run must have met a busy cgroup"
        assert status == 0, stderr
        assert stdout == ""
        assert entry["runtime_runs"] >= 2, entry
        assert entry["outcome"] == "removed" and entry["exit_status"] == 0, entry
        assert entry["init_alive"] is True, entry  # the running container's path, not Path B
        assert ctr.cgroup_dirs() == []
        assert not os.path.exists(os.path.join(ctr.root, ctr.id))
        assert os.listdir(os.path.join(workdir, "pending")) == []
