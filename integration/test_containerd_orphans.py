"""containerd's dead-shim path with runc 1.3 leaves runc's state behind; the sweep re-drives it.

containerd (Debian's 1.6, private instance) runs the task through stock runc
1.3 (Debian sid). Two children are held SIGKILLed in a frozen freezer, init and the shim
are killed: containerd's dead-shim cleanup runs ``runc delete --force``, which
fails on the busy cgroups and keeps its state (runc >= 1.2), logs a warning
and deletes the bundle anyway. Nobody re-runs that delete. After the held
processes died, the stock sweep (``--no-orphans``) keeps the container for its
state; ``runc-guardctl sweep`` re-runs runc's own delete and leaves nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from labkit import containerd as cl
from labkit import runtimes
from labkit.kernel import FreezerHold, wait_for

pytestmark = pytest.mark.kernel

CTL = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")


@pytest.fixture(scope="module", params=[cl.HYBRID, cl.UNIFIED])
def ctd(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[cl.Containerd]:
    """A private containerd 1.6 on the host's hybrid layout, and one in a pure cgroup v2 namespace."""
    workdir = str(tmp_path_factory.mktemp(f"rgctd-orphans-{request.param}"))
    with cl.running_containerd(workdir, {}, request.param) as lab:
        yield lab


def runc_root(lab: cl.Containerd) -> str:
    """The shim's runc root as the sweep sees it: from the host, or inside the pure-v2 namespace."""
    return cl.RUNC_ROOT if lab.layout == cl.UNIFIED else lab.inside(cl.RUNC_ROOT)


def sweep(lab: cl.Containerd, ns: str, runc: str, tmp: str, *args: str) -> dict[str, object]:
    """``runc-guardctl sweep`` over the namespace's cgroups (inside containerd's mounts on pure v2)."""
    env = dict(
        os.environ,
        RUNC_GUARD_CONFIG=os.path.join(tmp, "absent.toml"),
        RUNC_GUARD_PENDING_DIR=os.path.join(tmp, "run", "pending"),
        RUNC_GUARD_STATS_FILE=os.path.join(tmp, "run", "deletes.jsonl"),
        # its own cache: the sweep reads (and drops) the stepped-aside records kept there
        RUNC_GUARD_CACHE_DIR=os.path.join(tmp, "run", "cache"),
        RUNC_GUARD_RUNTIME=runc,
    )
    # On pure v2 only containerd's mount namespace has cgroup2 at /sys/fs/cgroup,
    # where runc's state.json places the container: there the sweep runs inside it.
    inside = [cl.NSENTER, "-t", str(lab.pid), "-m", "--"] if lab.layout == cl.UNIFIED else []
    argv = [
        *inside,
        CTL,
        "sweep",
        "--kubepods",
        ns,
        "--min-age",
        "0",
        "--format",
        "json",
        "--runtime-root",
        runc_root(lab),
        "--bundle-root",
        os.path.join(lab.state_dir, "io.containerd.runtime.v2.task"),
        "--state-root",
        os.path.join(tmp, "flat"),
        *args,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_dead_shim_runc_13_state_is_redriven(ctd: cl.Containerd, tmp_path: object) -> None:
    """Stock: runc 1.3's state and dirs stay after the dead-shim cleanup; the sweep leaves 0 of both."""
    runc = runtimes.require(runtimes.RUNC_13)
    with cl.namespace(ctd) as ns:
        # A 64-hex id like containerd's CRI makes, so the sweep's walk of /<ns> sees the container.
        task = cl.Task(ctd, ns, uuid.uuid4().hex + uuid.uuid4().hex, runc)
        shares = ["--cpu-shares", "0"] if ctd.layout == cl.UNIFIED else []  # v2 here has no cpu controller
        ctd.ctr(
            ns,
            "run",
            "-d",
            "--null-io",
            *shares,
            "--rootfs",
            "--runc-binary",
            runc,
            "--with-ns",
            f"pid:/proc/{ctd.pid}/ns/pid",
            ctd.rootfs,
            task.id,
            *cl.sleepers_command(3),
        )
        assert wait_for(lambda: len(task.pids()) >= 4, 10)
        state_dir = os.path.join(ctd.inside(cl.RUNC_ROOT), ns, task.id)
        hold = FreezerHold.create()
        try:
            hold.hold(task.children()[:2])
            init = task.init_pid()
            shim = task.shim_pid(init)
            os.kill(init, signal.SIGKILL)
            wait_for(lambda: init not in task.pids(), 5)
            os.kill(shim, signal.SIGKILL)
            time.sleep(2.5)  # the held children die 2.5 s after the shim (a slow teardown)
            hold.release()
            assert wait_for(task.gone, 15, 0.02), "containerd did not delete the bundle"
            assert wait_for(lambda: not task.pids(), 5)
        finally:
            hold.destroy()
        ctd.ctr(ns, "container", "rm", task.id, check=False)
        dirs_before = len(task.cgroup_dirs())
        assert dirs_before > 0 and os.path.isdir(state_dir), "runc 1.3 did not keep its state"
        assert any(
            "failed to remove runc container" in line or "cleaning up" in line
            for line in ctd.log_lines_for(task.id)
        )

        tmp = str(tmp_path)
        stock = sweep(ctd, ns, runc, tmp, "--no-orphans")
        assert stock["kept"] == {"runtime_state": 1} and stock["redriven"] == []
        assert len(task.cgroup_dirs()) == dirs_before and os.path.isdir(state_dir)

        report = sweep(ctd, ns, runc, tmp)
        assert report["errors"] == [], report["errors"]
        (rerun,) = report["redriven"]  # type: ignore[misc]
        assert rerun["argv"][1:] == [
            "--root",
            os.path.join(runc_root(ctd), ns),
            "delete",
            "--force",
            task.id,
        ]
        assert (rerun["exit_code"], rerun["state_left"]) == (0, False)
        assert task.cgroup_dirs() == [] and not os.path.exists(state_dir)
        print(
            f"\ncontainerd 1.6 + runc 1.3 dead shim ({ctd.layout}): left {dirs_before} dirs + runc state; "
            f"stock sweep kept them; runc-guardctl sweep: 0 dirs, 0 state (runc delete {rerun['seconds']}s, "
            f"sweep {report['duration']}s)"
        )
