"""Pending records on the real kernel: one trust rule before anything is run, drained or removed.

Issue 42 case 4. A pending record is the most powerful input runc-guard reads:
the finisher runs its ``runtime`` as root and removes its ``cgroup_paths``, and
the next delete of its id removes them too. Here every record breaks exactly
one rule, and each names real, empty cgroups that are not a container's to
lose (their removal is what the earlier code did): a symlink to a file someone
else wrote, a file someone else owns, a path whose leaf is not the container's,
a runtime the settings do not route to (a tracer that would leave a mark). Now
nothing is run, renamed or removed, each record stays with one ``finisher_left`` entry
however many passes look at it (the delete of the id without state one ``record_untrusted``), and
``audit`` counts every one of them (``runc_guard_pending_record_errors``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from labkit.kernel import RUNC, cgroup_mount_points, remove_tree, reported_events, unique, wait_reported
from labkit.scenario import guard_env
from runc_guard.delete.pending import PendingRecord, record_path
from runc_guard.node.finisher import Finisher
from runc_guard.settings import Settings

pytestmark = pytest.mark.kernel

CTL = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")
NOBODY = 65534
#: No process has this pid (above the kernel's default pid_max of 4194304): an init that is dead.
DEAD_PID, DEAD_START = 4194399, 1


def _settings(workdir: str) -> Settings:
    return Settings(
        runtime=RUNC,
        pending_dir=os.path.join(workdir, "pending"),
        cache_dir=os.path.join(workdir, "cache"),
        journal_socket=os.path.join(workdir, "no-journald.socket"),
        log_file=os.path.join(workdir, "events.jsonl"),
        stats_file=os.path.join(workdir, "stats.jsonl"),
        reporter_linger=0.0,
        finish_window=5.0,
    )


def _write(path: str, doc: dict[str, Any], uid: int = 0) -> None:
    with open(path, "w") as f:
        json.dump(doc, f)
    os.chmod(path, 0o600)
    os.chown(path, uid, uid)


@pytest.fixture
def parent() -> Iterator[str]:
    """A unique parent cgroup in every hierarchy but cpuset; removed with whatever is below it."""
    name = unique("rgtest-trust")
    yield name
    for mount in cgroup_mount_points():
        remove_tree(os.path.join(mount, name))


def _cgroups(parent: str, leaf: str) -> list[str]:
    made = []
    for mount in cgroup_mount_points():
        if mount.endswith("/cpuset"):
            continue
        os.makedirs(os.path.join(mount, parent), exist_ok=True)
        path = os.path.join(mount, parent, leaf)
        os.mkdir(path)
        made.append(path)
    return made


Planted = tuple[dict[str, str], dict[str, list[str]], str]


def _plant(workdir: str, pending: str, root: str, parent: str) -> Planted:
    """Five records, each failing one rule, each naming real empty cgroups; (ids, their cgroups, the
    file the tracer runtime would write)."""
    elsewhere = os.path.join(workdir, "elsewhere")
    os.makedirs(elsewhere)

    def record(cid: str, paths: list[str], runtime: str = RUNC) -> dict[str, Any]:
        return PendingRecord(cid, root, paths, DEAD_PID, DEAD_START, runtime, 1.0).as_dict()

    ids = {name: unique(f"rgtest-{name}") for name in ("symlink", "foreign", "named", "runtime", "delete")}
    dirs = {name: _cgroups(parent, cid) for name, cid in ids.items() if name in ("symlink", "foreign")}
    dirs["named"] = _cgroups(parent, "service-a")  # a service's cgroup, empty for the moment
    dirs["runtime"] = _cgroups(parent, ids["runtime"])
    dirs["delete"] = _cgroups(parent, "service-b")
    # 1. a symlink in the pending directory to a file another user wrote
    target = os.path.join(elsewhere, "planted.json")
    _write(target, record(ids["symlink"], dirs["symlink"]), NOBODY)
    os.symlink(target, os.path.join(pending, f"{ids['symlink']}.json"))
    # 2. a record another user owns
    _write(os.path.join(pending, f"{ids['foreign']}.json"), record(ids["foreign"], dirs["foreign"]), NOBODY)
    # 3. a root-owned record whose paths are not named after its container
    _write(os.path.join(pending, f"{ids['named']}.json"), record(ids["named"], dirs["named"]))
    # 4. a root-owned record whose runtime the settings do not route to, with its state (so it would run)
    mark = os.path.join(workdir, "tracer-ran")
    tracer = os.path.join(workdir, "tracer")
    with open(tracer, "w") as f:
        f.write(f'#!/bin/sh\necho "$@" >> {mark}\nfor id; do :; done\nrm -rf "{root}/$id"\n')
    os.chmod(tracer, 0o755)
    state_dir = os.path.join(root, ids["runtime"])
    os.makedirs(state_dir)
    with open(os.path.join(state_dir, "state.json"), "w") as f:
        json.dump({"id": ids["runtime"], "init_process_pid": DEAD_PID, "init_process_start": DEAD_START,
                   "created": "2026-12-07T08:00:00Z", "cgroup_paths": {}, "config": {"labels": []}}, f)
    _write(os.path.join(pending, f"{ids['runtime']}.json"), record(ids["runtime"], dirs["runtime"], tracer))
    # 5. the next delete of an id without state, whose record names a service's cgroup
    _write(record_path(pending, root, ids["delete"]), record(ids["delete"], dirs["delete"]))
    return ids, dirs, mark


def test_untrusted_pending_records_are_left_alone(workdir: str, parent: str) -> None:
    """Five records, each failing one rule: nothing run, renamed or removed; each left, one entry
    each, counted by audit. Before: the finisher removed the cgroups of the symlinked, the
    foreign-owned and the wrongly named record and ran the unrouted runtime; the delete of an id
    without state removed the service cgroup its record named."""
    settings = _settings(workdir)
    pending, root = settings.pending_dir, os.path.join(workdir, "runc-root")
    os.makedirs(pending, mode=0o700)
    os.makedirs(root)
    ids, dirs, mark = _plant(workdir, pending, root, parent)
    records = sorted(os.listdir(pending))

    finisher = Finisher(settings)
    for _ in range(3):
        finisher.pass_once()
    env = guard_env(workdir, RUNC_GUARD_RUNTIME=RUNC)
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "runc-guard"), "--root", root,
                           "delete", "--force", ids["delete"]], capture_output=True, text=True, env=env,
                          timeout=60, check=False)  # fmt: skip
    assert wait_reported(settings.cache_dir)
    metrics = os.path.join(workdir, "audit.prom")
    audit = subprocess.run([CTL, "audit", "--min-age", "0", "--kubepods", f"{parent}/kubepods",
                            "--metrics-file", metrics], capture_output=True, text=True, env=env,
                           timeout=60, check=False)  # fmt: skip
    with open(metrics) as f:
        counted = next(int(float(line.split()[-1])) for line in f
                       if line.startswith("runc_guard_pending_record_errors "))

    left = {name: [d for d in paths if os.path.isdir(d)] for name, paths in dirs.items()}
    events = reported_events(workdir)
    entries = [e for e in events if e.get("event") in ("finisher_left", "delete")]
    summary = (f"dirs left {sum(map(len, left.values()))}/{sum(map(len, dirs.values()))}, "
               f"tracer ran {os.path.exists(mark)}, records {len(os.listdir(pending))}/{len(records)}, "
               f"entries {len(entries)}, audit counts {counted}, delete exit {done.returncode}")
    print(f"untrusted pending records: {summary}")
    assert left == dirs, summary
    assert not os.path.exists(mark), "the tracer (a runtime the settings do not route to) ran as root"
    assert sorted(os.listdir(pending)) == records, summary
    assert counted == len(records), (summary, audit.stdout)
    left_entries = [e for e in events if e.get("event") == "finisher_left"]
    assert sorted(e["record"] for e in left_entries) == [os.path.join(pending, r) for r in records], events
    deletes = [e for e in events if e.get("event") == "delete" and e.get("container_id") == ids["delete"]]
    assert [e["outcome"] for e in deletes] == ["record_untrusted"], deletes
