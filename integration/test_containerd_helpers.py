"""Where runc-guard's detached helpers run under a real containerd (issue 42 case 6).

The lab's containerd 1.6.20 is moved into a service cgroup of its own in every
hierarchy (what ``containerd.service`` is under systemd: the admin's memory, pids
and CPU bounds), so the shims it starts inherit it. A Path B crash then makes
containerd run ``containerd-shim-runc-v2 delete`` -> runc-guard's delete, whose
reporter lingers long enough to be looked at. Before: the reporter ran in the root
cgroup of every hierarchy. Now: in containerd's service cgroup, in every one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit import containerd as cl
from labkit.kernel import cgroup_mount_points, procs, remove_tree, spool_reporters, unique, wait_for

pytestmark = pytest.mark.kernel


@contextlib.contextmanager
def service_cgroup(pid: int) -> Iterator[str]:
    """``pid`` moved into ``/<name>`` in every hierarchy (cpus and mems as the root's); yields the name.
    Afterwards every process still there goes back to its hierarchy's root, and the cgroups go."""
    name = unique("rgtest-containerd-svc")
    made: list[str] = []
    try:
        for mount in cgroup_mount_points():
            path = os.path.join(mount, name)
            os.mkdir(path)
            made.append(path)
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if os.path.exists(os.path.join(path, knob)):
                    Path(path, knob).write_text(Path(mount, knob).read_text().strip())
            Path(path, "cgroup.procs").write_text(str(pid))
        yield name
    finally:
        for path in made:
            for member in procs(path):
                with contextlib.suppress(OSError):
                    Path(os.path.dirname(path), "cgroup.procs").write_text(str(member))
            remove_tree(path)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        return ""


def test_a_reporter_runs_in_containerds_cgroups(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Path B through runc-guard: the delete's reporter (lingering 10 s) is in containerd's service
    cgroup in every hierarchy, none of them a root."""
    with cl.guarded_containerd_in(tmp_path_factory, "rgctd-helpers", RUNC_GUARD_REPORTER_LINGER="10") as lab:
        spool = os.path.join(lab.settings["RUNC_GUARD_CACHE_DIR"], "spool")
        with service_cgroup(lab.containerd.pid) as svc, cl.namespace(lab.containerd) as ns:
            crash = cl.path_b_crash(lab.containerd, ns, cl.guard_binary(), delay=0.5)
            try:
                # the reporter has stepped back once it has sent the delete's entry (to the log file)
                assert wait_for(lambda: crash.task_id in _read(lab.settings["RUNC_GUARD_LOG_FILE"]), 30)
                reporters = spool_reporters(spool)
                assert reporters, "the delete's reporter has already gone"
                with open(f"/proc/{reporters[0]}/cgroup") as f:
                    paths = [line.rstrip("\n").split(":", 2)[2] for line in f]
                print(f"containerd 1.6.20, Path B: the reporter in containerd's service cgroup in "
                      f"{sum(p == '/' + svc for p in paths)} of {len(paths)} hierarchies, "
                      f"{sum(p == '/' for p in paths)} in a root")
                assert paths and all(p == "/" + svc for p in paths), paths
                assert crash.left == [], crash.left
            finally:
                cl.remove_dirs(crash.left)
                wait_for(lambda: not spool_reporters(spool), 60)
