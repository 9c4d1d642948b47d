"""Orphaned runc 1.3 state on the real kernel: the sweep re-drives runc's own delete.

Path B as the incident had it, with runc >= 1.2: the container's init is
killed (the shim died with it), two host-PID children sit SIGKILLed in a
frozen v1 freezer, and ``runc delete --force`` retries rmdir ~1 s per
directory, exits 1 and *keeps its state* so the delete can be re-run. Nobody
re-runs it on containerd's dead-shim path. Once the held processes have died,
the stock sweep (``--no-orphans``) keeps the container for its runtime state
forever; ``runc-guardctl sweep`` re-runs ``runc delete --force`` itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from labkit import prereq, runtimes
from labkit.kernel import (
    FREEZER,
    FreezerHold,
    cgroup_mount_points,
    dirs_named,
    exited,
    make_bundle,
    procs,
    remove_tree,
    sleepers_script,
    wait_for,
)
from tests.hermetic import own_env, own_roots

pytestmark = pytest.mark.kernel

CTL = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")


@dataclass
class Orphan:
    """A runc 1.3 container left as Path B leaves it: init dead, state kept, cgroups behind."""

    runc: str
    root: str
    container_id: str
    parent: str
    relative: str

    def state_dir(self) -> str:
        return os.path.join(self.root, self.container_id)

    def dirs(self) -> list[str]:
        return dirs_named(self.relative)

    def any_cgroup(self) -> str:
        for mount in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
            path = mount + self.relative
            if os.path.isdir(path):
                return path
        raise FileNotFoundError(self.relative)

    def destroy(self) -> None:
        """Kill what is left by pid, let runc delete, remove every cgroup below the unique parent."""
        for directory in self.dirs():
            for pid in procs(directory):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not any(procs(d) for d in self.dirs()), 10)
        subprocess.run(
            [self.runc, "--root", self.root, "delete", "--force", self.container_id],
            capture_output=True,
            check=False,
            timeout=30,
        )
        for mount in cgroup_mount_points():
            remove_tree(os.path.join(mount, self.parent))


def start_container(tmp_path: Path, root: str) -> tuple[Orphan, int]:
    """A detached host-PID runc 1.3 container (init + 3 sleepers) below a unique kubepods-like parent."""
    runc = runtimes.require(runtimes.RUNC_13)
    cid = uuid.uuid4().hex + uuid.uuid4().hex  # a 64-hex id, as containerd makes them
    parent = f"rgorphan-{uuid.uuid4().hex[:12]}"
    relative = f"/{parent}/kubepods/burstable/pod3f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/{cid}"
    orphan = Orphan(runc, root, cid, parent, relative)
    bundle = make_bundle(str(tmp_path / "bundle"), relative, sleepers_script(3))
    try:
        with open(tmp_path / "run.stderr", "wb") as err:
            subprocess.run(
                [runc, "--root", root, "run", "-d", cid],
                cwd=bundle,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                check=True,
                timeout=30,
            )
        assert wait_for(lambda: len(procs(orphan.any_cgroup())) >= 4, 10)
        with open(os.path.join(orphan.state_dir(), "state.json")) as f:
            init = int(json.load(f)["init_process_pid"])
    except BaseException:
        orphan.destroy()
        raise
    return orphan, init


@contextlib.contextmanager
def path_b_orphan(
    tmp_path: Path, root: str
) -> Iterator[tuple[Orphan, FreezerHold, subprocess.CompletedProcess[str]]]:
    """Start a host-PID runc 1.3 container, hold 2 children frozen, kill init, run runc's delete."""
    prereq.require(os.path.isdir(FREEZER), f"the cgroup v1 freezer at {FREEZER} (the slow-death hold)")
    orphan, init = start_container(tmp_path, root)
    hold = FreezerHold.create()
    try:
        hold.hold([p for p in procs(orphan.any_cgroup()) if p != init][:2])
        os.kill(init, signal.SIGKILL)  # the dead shim's init: runc now sees "stopped"
        assert wait_for(lambda: init not in procs(orphan.any_cgroup()), 5)
        started = time.monotonic()
        delete = subprocess.run(
            [orphan.runc, "--root", root, "delete", "--force", orphan.container_id],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        print(
            f"\nrunc 1.3 delete --force: exit {delete.returncode} after {time.monotonic() - started:.2f}s, "
            f"{len(orphan.dirs())} dirs left: {delete.stderr.strip()[-300:]}"
        )
        yield orphan, hold, delete
    finally:
        hold.destroy()
        orphan.destroy()


def ctl(tmp_path: Path, orphan: Orphan, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = own_env(tmp_path, RUNC_GUARD_RUNTIME=orphan.runc)
    argv = [
        CTL,
        command,
        "--kubepods",
        f"{orphan.parent}/kubepods",
        *own_roots(tmp_path),
        "--orphan-root",  # a flat root is judged only when named (containerd's is namespaced)
        str(tmp_path / "flat"),
        "--min-age",
        "0",
        "--format",
        "json",
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)


@pytest.mark.parametrize("layout", ["containerd", "flat"])
def test_sweep_redrives_orphaned_runc_13_state(tmp_path: Path, layout: str) -> None:
    """runc 1.3 keeps its state after a busy delete; stock sweep keeps it, ours leaves 0 dirs, 0 state."""
    root = str(tmp_path / "runc" / "k8s.io") if layout == "containerd" else str(tmp_path / "flat")
    with path_b_orphan(tmp_path, root) as (orphan, hold, delete):
        assert delete.returncode == 1, delete.stderr
        assert "unable to remove container's cgroup" in delete.stderr
        assert os.path.isdir(orphan.state_dir())
        hold.destroy()  # the held processes finish dying now
        assert wait_for(lambda: not any(procs(d) for d in orphan.dirs()), 10)
        dirs_before = len(orphan.dirs())
        assert dirs_before > 0

        stock = ctl(tmp_path, orphan, "sweep", "--no-orphans")
        assert stock.returncode == 0, stock.stderr
        stock_report = json.loads(stock.stdout)
        assert stock_report["kept"] == {"runtime_state": 1} and stock_report["redriven"] == []
        stock_left = len(orphan.dirs())
        assert stock_left == dirs_before and os.path.isdir(orphan.state_dir())

        audit = ctl(tmp_path, orphan, "audit")
        assert audit.returncode == 1, audit.stdout + audit.stderr
        audit_report = json.loads(audit.stdout)
        assert [o["container_id"] for o in audit_report["orphaned_states"]] == [orphan.container_id]
        assert "orphaned runtime state" in audit_report["message"]

        started = time.monotonic()
        ours = ctl(tmp_path, orphan, "sweep")
        took = time.monotonic() - started
        assert ours.returncode == 0, ours.stderr
        report = json.loads(ours.stdout)
        assert report["errors"] == [], report["errors"]
        (rerun,) = report["redriven"]
        assert rerun["argv"] == [orphan.runc, "--root", root, "delete", "--force", orphan.container_id]
        assert (rerun["exit_code"], rerun["state_left"]) == (0, False)
        assert report["removed"] == 1
        assert orphan.dirs() == [] and not os.path.exists(orphan.state_dir())
        print(
            f"\norphan sweep ({layout}): before {dirs_before} dirs + 1 state dir; stock sweep kept "
            f"{stock_left} dirs + state; runc-guardctl sweep: 0 dirs, 0 state, "
            f"runc delete {rerun['seconds']:.3f}s, sweep {report['duration']:.3f}s, wall {took:.2f}s"
        )


def test_sweep_redrives_state_whose_host_pid_children_live_on(tmp_path: Path) -> None:
    """CRI's dead-shim path never deletes a pod's containers: init dead, host-PID children alive.

    The stock sweep keeps it (populated); ours re-runs runc 1.3's delete, which
    kills the children as runc kills a host-PID container's processes: 0 dirs,
    0 state, no process left. runc-guard itself signals nothing.
    """
    root = str(tmp_path / "runc" / "k8s.io")
    orphan, init = start_container(tmp_path, root)
    try:
        children = [p for p in procs(orphan.any_cgroup()) if p != init]
        os.kill(init, signal.SIGKILL)
        assert wait_for(lambda: init not in procs(orphan.any_cgroup()), 5)
        dirs_before = len(orphan.dirs())
        stock = ctl(tmp_path, orphan, "sweep", "--no-orphans")
        assert json.loads(stock.stdout)["kept"] == {"populated": 1}
        ours = ctl(tmp_path, orphan, "sweep")
        report = json.loads(ours.stdout)
        assert report["errors"] == [], report["errors"]
        (rerun,) = report["redriven"]
        assert (rerun["exit_code"], rerun["state_left"]) == (0, False)
        assert report["removed"] == 1
        assert orphan.dirs() == [] and not os.path.exists(orphan.state_dir())
        assert wait_for(
            lambda: all(exited(p) for p in children), 5
        )
        print(
            f"\nCRI-like orphan: {dirs_before} dirs + state + {len(children)} live children; "
            f"stock sweep kept them (populated); runc-guardctl sweep: 0 dirs, 0 state, 0 processes "
            f"(runc delete {rerun['seconds']:.3f}s)"
        )
    finally:
        orphan.destroy()
