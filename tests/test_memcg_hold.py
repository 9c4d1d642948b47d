"""delete.memcg_hold and node.late_reclaim without a kernel: what is held, what is trusted, what is counted.

tests/test_reclaim_kernel.py proves the same against the kernel's v1 memory controller.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runc_guard.delete import memcg_hold
from runc_guard.delete.cgroupfs import CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC
from runc_guard.delete.cleanup import drain
from runc_guard.delete.reclaim import DIRTY, holdable, reclaim
from runc_guard.errors import ForeignProcess
from runc_guard.node import late_reclaim
from runc_guard.node.metrics import apply_delete_line, new_state
from tests.fakes import FakeCgroupFs, FakeClock

TOO_LARGE = "page cache too large to reclaim on the reply's time"


def _v1(path: Path, usage: int = 256 << 20) -> Path:
    path.mkdir(parents=True)
    (path / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (path / "memory.stat").write_text(f"cache {usage}\nrss 0\ndirty 0\nwriteback 0\n")
    (path / "cgroup.procs").write_text("")
    return path


def test_drain_holds_what_its_budget_cannot_reclaim_and_the_rmdir_finds_it_gone() -> None:
    clock = FakeClock()
    fs = FakeCgroupFs(clock)
    for path in ("/cg/memory/pod/big", "/cg/memory/pod/broken", "/cg/memory/pod/small"):
        fs.add(path)
        fs.charged[path] = 1 << 20
    fs.unreclaimable["/cg/memory/pod/big"] = TOO_LARGE
    fs.unreclaimable["/cg/memory/pod/broken"] = "memory.force_empty: EIO"
    held: list[tuple[str, str]] = []

    def hold(path: str, why: str) -> str:
        held.append((path, why))
        del fs.dirs[path]  # the rename: the directory is no longer where it was
        return path + ".held"

    report = drain(["/cg/memory/pod/big", "/cg/memory/pod/broken", "/cg/memory/pod/small"], fs, clock() + 4,
                   0.1, may_kill=False, clock=clock, reclaim_budget=0.1, hold=hold)  # fmt: skip
    # only a reason a later, paced reclaim can do better on; a kernel error stays as it is
    assert held == [("/cg/memory/pod/big", TOO_LARGE)]
    assert report.held == {"/cg/memory/pod/big": "/cg/memory/pod/big.held"}
    assert report.unreclaimed == {"/cg/memory/pod/broken": "memory.force_empty: EIO"}
    assert fs.rmdirs == ["/cg/memory/pod/broken", "/cg/memory/pod/small"]
    assert report.remaining == {}


def test_dirty_pages_are_held_not_reclaimed_on_the_reply_where_a_hold_is_possible() -> None:
    """A v1 memcg with dirty pages is held rather than reclaimed on the reply's time (the kernel's reclaim
    can wait 100 ms on a dirty page it cannot write); a systemd unit's cgroup cannot be held, so its pages
    are reclaimed on the reply as before, and so is one the hold refuses."""
    clock = FakeClock()
    fs = FakeCgroupFs(clock)
    paths = ["/cg/memory/pod/ctr", "/cg/memory/pod/cri-containerd-x.scope", "/cg/memory/pod/refused"]
    for path in paths:
        fs.add(path)
        fs.charged[path] = 1 << 20
        fs.dirty.add(path)
    held: list[tuple[str, str]] = []

    def hold(path: str, why: str) -> str | None:
        held.append((path, why))
        if memcg_hold.held_name(path) is None or path.endswith("refused"):
            return None  # a unit's cgroup; a record of that name exists, or the rename failed
        del fs.dirs[path]
        return path + ".held"

    report = drain(paths, fs, clock() + 4, 0.1, may_kill=False, clock=clock, reclaim_budget=0.1, hold=hold)
    assert held == [(path, DIRTY) for path in paths]
    assert report.held == {"/cg/memory/pod/ctr": "/cg/memory/pod/ctr.held"}
    assert fs.charged["/cg/memory/pod/cri-containerd-x.scope"] == fs.charged["/cg/memory/pod/refused"] == 0
    assert report.reclaimed == 2 << 20 and report.unreclaimed == {}


def test_reclaim_leaves_dirty_pages_to_a_hold_on_v1_only(tmp_path: Path) -> None:
    v1 = _v1(tmp_path / "v1", 2 << 20)
    cold = f"inactive_file {2 << 20}\n"  # written once: on the inactive list, cold
    (v1 / "memory.stat").write_text(f"cache {2 << 20}\nrss 0\ndirty 4096\nwriteback 0\n{cold}")
    (v1 / "memory.force_empty").write_text("")
    result = reclaim(str(v1), float("inf"), hold_dirty=True)
    assert result.skipped == DIRTY and (v1 / "memory.force_empty").read_text() == ""
    assert holdable(result.skipped)
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.current").write_text(f"{2 << 20}\n")
    (v2 / "memory.stat").write_text(f"anon 0\nfile {2 << 20}\nfile_dirty 4096\nfile_writeback 0\n{cold}")
    (v2 / "memory.reclaim").write_text("")
    reclaim(str(v2), float("inf"), hold_dirty=True)  # cgroup2 has no rename: nothing to leave it to
    assert (v2 / "memory.reclaim").read_text() == f"{2 << 20} swappiness=0"


def test_hold_records_first_then_renames_beside_the_original(tmp_path: Path) -> None:
    cg = _v1(tmp_path / "memory" / "pod" / "ctr1")
    cache = tmp_path / "cache"
    held = memcg_hold.hold(str(cg), str(cache), "ctr1", "/run/containerd/runc/k8s.io", TOO_LARGE)
    assert held == str(tmp_path / "memory" / "pod" / ".runc-guard-held.ctr1")
    assert os.path.isdir(held) and not cg.exists()
    [(record, doc)] = list(memcg_hold.iter_held(str(cache)))
    assert doc is not None and (doc["original"], doc["held"], doc["container_id"]) == (str(cg), held, "ctr1")
    assert record == memcg_hold.record_file(str(cache), held)


@pytest.mark.parametrize(
    "name",
    ["ctr.scope", "kubepods-pod1.slice", ".runc-guard-held.x", "x" * 240, "cri-containerd-c.scope/container"],
)
def test_hold_leaves_what_it_must_not_or_cannot_rename(tmp_path: Path, name: str) -> None:
    """systemd's units (it re-creates and removes them itself), a held one, a name that would not fit, and
    crun's systemd leaf inside its scope (the held name would sit in the unit's cgroup)."""
    cg = _v1(tmp_path / "memory" / name)
    assert memcg_hold.hold(str(cg), str(tmp_path / "cache"), "c", "/r", TOO_LARGE) is None
    assert cg.is_dir() and list(memcg_hold.iter_held(str(tmp_path / "cache"))) == []


def test_hold_needs_a_v1_memory_cgroup_and_drops_its_record_when_the_rename_fails(tmp_path: Path) -> None:
    v2 = tmp_path / "unified" / "ctr"
    v2.mkdir(parents=True)
    (v2 / "memory.current").write_text("1\n")
    assert memcg_hold.hold(str(v2), str(tmp_path / "cache"), "c", "/r", TOO_LARGE) is None
    cg = _v1(tmp_path / "memory" / "ctr")
    (tmp_path / "memory" / ".runc-guard-held.ctr").mkdir()
    (tmp_path / "memory" / ".runc-guard-held.ctr" / "x").write_text("")  # rename onto a non-empty dir fails
    assert memcg_hold.hold(str(cg), str(tmp_path / "cache"), "c", "/r", TOO_LARGE) is None
    assert cg.is_dir() and list(memcg_hold.iter_held(str(tmp_path / "cache"))) == []


def _record(tmp_path: Path, original: str, held: str) -> tuple[str, dict[str, object]]:
    doc = {"container_id": "c", "runtime_root": "/r", "original": original, "held": held, "reason": TOO_LARGE,
           "created": 1.0}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    return str(path), doc


def v1_fs(path: str) -> int:
    return CGROUP_SUPER_MAGIC


@pytest.mark.parametrize(
    ("original", "held", "fs_type"),
    [
        ("/cg/memory/pod/ctr", "/cg/memory/pod/.runc-guard-held.other", v1_fs),  # not the original's name
        ("/cg/memory/pod/ctr", "/cg/memory/.runc-guard-held.ctr", v1_fs),  # not beside it
        ("pod/ctr", "pod/.runc-guard-held.ctr", v1_fs),  # relative
        ("/cg/memory/pod/ctr", "/cg/memory/pod/.runc-guard-held.ctr", lambda p: CGROUP2_SUPER_MAGIC),
        ("/cg/memory/pod/ctr", "/cg/memory/pod/.runc-guard-held.ctr", lambda p: 0xEF53),  # ext4
    ],
)
def test_a_record_is_input_and_only_a_held_v1_memcg_is_touched(tmp_path: Path, original: str, held: str,
                                                               fs_type: object) -> None:  # fmt: skip
    assert late_reclaim.trusted({"original": original, "held": held}, fs_type) is None  # type: ignore[arg-type]


def test_a_record_whose_directory_is_gone_is_dropped(tmp_path: Path) -> None:
    pod = tmp_path / "pod"
    record, doc = _record(tmp_path, str(pod / "ctr"), str(pod / ".runc-guard-held.ctr"))
    result = late_reclaim.step(record, doc, fs_type=v1_fs)
    assert result.done and result.why == "gone" and not os.path.exists(record)


def test_a_populated_or_dirty_held_memcg_waits_and_nothing_is_written(tmp_path: Path) -> None:
    held = _v1(tmp_path / "pod" / ".runc-guard-held.ctr")
    record, doc = _record(tmp_path, str(tmp_path / "pod" / "ctr"), str(held))
    (held / "cgroup.procs").write_text("42\n")
    now = lambda: 2.0  # noqa: E731 - one second after it was held
    assert late_reclaim.step(record, doc, now=now, fs_type=v1_fs).why == "a process or cgroup appeared in it"
    (held / "cgroup.procs").write_text("")
    (held / "memory.stat").write_text(f"cache {256 << 20}\ndirty {64 << 20}\nwriteback 0\n")
    result = late_reclaim.step(record, doc, now=now, fs_type=v1_fs, io="/nonexistent", memory="/nonexistent")
    assert (result.done, result.why) == (False, "dirty pages waiting for writeback")
    assert not (held / "memory.limit_in_bytes").exists() and not (held / "memory.force_empty").exists()


def test_pressure_holds_a_step_back(tmp_path: Path) -> None:
    held = _v1(tmp_path / "pod" / ".runc-guard-held.ctr")
    record, doc = _record(tmp_path, str(tmp_path / "pod" / "ctr"), str(held))
    psi = tmp_path / "memory-psi"
    psi.write_text("some avg10=42.00 avg60=1.00 avg300=0.00 total=1\nfull avg10=0.00 avg60=0.00 total=0\n")
    result = late_reclaim.step(record, doc, now=lambda: 2.0, fs_type=v1_fs, io="/none", memory=str(psi))
    assert (result.done, result.why) == (False, "memory pressure (some avg10 42%)")


def test_a_held_memcgs_late_reclaim_counts_memory_not_a_delete() -> None:
    state = new_state()
    line = {"kind": "memcg", "time": 1.0, "container_id": "c", "outcome": "memcg_reclaimed_late",
            "waited_ms": 0, "removed": 0, "reclaimed_kb": 1024, "memcg_left": 0}
    assert apply_delete_line(state, json.dumps(line).encode())
    assert state["deletes"] == {} and state["memcg_reclaimed_kb"] == 1024


def test_audit_lists_held_memcgs_and_calls_an_old_one_a_problem(tmp_path: Path) -> None:
    from runc_guard.node.audit import HELD_STALE, AuditReport, held_memcgs, judge

    cg = _v1(tmp_path / "memory" / "pod" / "ctr1")
    held = memcg_hold.hold(str(cg), str(tmp_path / "cache"), "ctr1", "/r", TOO_LARGE)
    [(_, doc)] = list(memcg_hold.iter_held(str(tmp_path / "cache")))
    assert doc is not None
    found = held_memcgs(str(tmp_path / "cache"), float(doc["created"]) + 1)
    assert [(h["held"], h["exists"], h["age_seconds"]) for h in found] == [(held, True, 1.0)]
    report = AuditReport([])
    report.held_memcgs = found
    judge(report, 10, 3600.0, None)
    assert report.status == "ok"
    report.held_memcgs = held_memcgs(str(tmp_path / "cache"), float(doc["created"]) + HELD_STALE + 1)
    judge(report, 10, 3600.0, None)
    assert report.status == "problem" and "held memory cgroup" in report.message


def test_the_sweep_finishes_only_what_a_finisher_gave_up_on(tmp_path: Path) -> None:
    """A held memcg no finisher finished: once a finisher would have given up (LATE_MAX + HOLD_MAX),
    the sweep takes the final step; a younger one is the finisher's."""
    import time
    from types import SimpleNamespace

    from runc_guard.node.finisher import HOLD_MAX
    from runc_guard.node.host import finish_held
    from runc_guard.node.sweep import SweepReport

    cache = tmp_path / "cache"
    young = memcg_hold.hold(str(_v1(tmp_path / "memory" / "a")), str(cache), "a", "/r", TOO_LARGE)
    old = memcg_hold.hold(str(_v1(tmp_path / "memory" / "b")), str(cache), "b", "/r", TOO_LARGE)
    assert young and old
    for path, doc in memcg_hold.iter_held(str(cache)):
        if doc is not None and doc["held"] == old:
            doc["created"] = time.time() - late_reclaim.LATE_MAX - HOLD_MAX - 1
            Path(path).write_text(json.dumps(doc))
    os.rename(old, str(tmp_path / "elsewhere"))  # its directory gone: the sweep drops the record
    report = SweepReport(False, [])
    finish_held(SimpleNamespace(cache_dir=str(cache)), report)  # type: ignore[arg-type]
    assert report.held_cleared == 1 and report.errors == []
    assert [doc["held"] for _, doc in memcg_hold.iter_held(str(cache)) if doc] == [young]


def _renaming_hold(fs: FakeCgroupFs, held: list[tuple[str, str]]):  # type: ignore[no-untyped-def]
    """A hold that renames as cgroup1_rename does: the directory and everything below it move."""

    def hold(path: str, why: str) -> str:
        held.append((path, why))
        target = memcg_hold.held_name(path) or path + ".held"
        for old in [d for d in fs.dirs if d == path or d.startswith(path + "/")]:
            fs.dirs[target + old[len(path):]] = fs.dirs.pop(old)
        return target

    return hold


def test_a_process_in_a_child_cgroup_is_found_and_its_parent_never_held() -> None:
    """Issue 42 case 2: the container's memcg (dirty) has a child cgroup with a live process that is not
    dying (private PID namespace: not the container's). Nothing is reclaimed or held while it is there,
    and the foreign step-aside fires for it as it would at the top. Before: the parent was held, the
    rename took the child and its process out of view, and the drain called it all empty."""
    clock = FakeClock()
    fs = FakeCgroupFs(clock)
    root = "/cg/memory/pod/ctr"
    fs.add(root)
    fs.add(root + "/sub", [4242])
    fs.charged[root] = 8 << 20
    fs.dirty.add(root)
    held: list[tuple[str, str]] = []
    with pytest.raises(ForeignProcess) as caught:
        drain([root], fs, clock() + 4, 0.1, may_kill=False, remove=False, watch_foreign=True, clock=clock,
              reclaim_budget=0.1, hold=_renaming_hold(fs, held))  # fmt: skip
    assert (caught.value.path, caught.value.pid) == (root + "/sub", 4242)
    assert held == [] and fs.reclaims == [] and root + "/sub" in fs.dirs


def test_an_empty_child_keeps_its_parent_unreclaimed_and_only_a_root_is_held() -> None:
    """An empty child cgroup (left for the runtime's RemovePath, which removes it first): the child is
    reclaimed, never held (its held name would sit inside the tree being removed); its parent is neither
    reclaimed (that would take the child's pages too) nor held (the rename would take the child along)."""
    clock = FakeClock()
    fs = FakeCgroupFs(clock)
    root = "/cg/memory/pod/ctr"
    for path in (root, root + "/sub"):
        fs.add(path)
        fs.charged[path] = 8 << 20
        fs.dirty.add(path)
    held: list[tuple[str, str]] = []
    report = drain([root], fs, clock() + 4, 0.1, may_kill=False, remove=False, clock=clock,
                   reclaim_budget=0.1, hold=_renaming_hold(fs, held))  # fmt: skip
    assert held == [] and report.held == {} and report.remaining == {}
    assert [p for p, _ in fs.reclaims] == [root + "/sub"] and fs.charged == {root: 8 << 20, root + "/sub": 0}
    # removing: the child goes first, then the root is empty and may be held as before
    report = drain([root], fs, clock() + 4, 0.1, may_kill=False, remove=True, clock=clock,
                   reclaim_budget=0.1, hold=_renaming_hold(fs, held))  # fmt: skip
    assert held == [(root, DIRTY)] and report.held == {root: "/cg/memory/pod/.runc-guard-held.ctr"}


@pytest.mark.parametrize("inside", ["child cgroup", "process"])
def test_hold_never_renames_a_directory_with_anything_in_it(tmp_path: Path, inside: str) -> None:
    """The kernel renames a v1 cgroup with its children (cgroup1_rename has no child check): the hold looks
    again right before the rename and leaves a directory with a child cgroup or a process as it is."""
    cg = _v1(tmp_path / "memory" / "pod" / "ctr1")
    if inside == "process":
        (cg / "cgroup.procs").write_text("4242\n")
    else:
        (cg / "sub").mkdir()
    assert memcg_hold.hold(str(cg), str(tmp_path / "cache"), "ctr1", "/r", TOO_LARGE) is None
    assert cg.is_dir() and list(memcg_hold.iter_held(str(tmp_path / "cache"))) == []
