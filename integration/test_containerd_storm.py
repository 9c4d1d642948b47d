"""The incident as a storm: 50 Path B crashes in a row, teardowns taking 0.3-3 s."""

from __future__ import annotations

import os
import random
import statistics
from collections.abc import Iterator

import pytest

from labkit import containerd as cl
from labkit.journald import Journald

pytestmark = pytest.mark.kernel

CYCLES = int(os.environ.get("RGCTD_STORM_CYCLES", "50"))
#: Stock runc's control runs the storm's first crashes only. It shows the harness still
#: reproduces the incident in this run; that stock runc 1.1.5 leaks on Path B is proven
#: cell by cell elsewhere (integration/test_matrix.py, tests/test_delete_kernel.py, make
#: demo), and 40 more stock crashes cost ~90 s of a worker's time for nothing new.
CONTROL_CYCLES = min(CYCLES, int(os.environ.get("RGCTD_STORM_CONTROL_CYCLES", "10")))
#: Replays a storm: the seed of the teardown delays (printed in the summary of every run).
SEED_ENV = "RGCTD_STORM_SEED"
#: The storm is about removal under random teardowns, not about the deadline edge
#: (test_containerd_deadline covers that). With the default 3 s and teardowns of up
#: to 3 s after the shim's death, only containerd's reaction time (~0.1-0.3 s) stands
#: between the last exit and the deadline; 4 s, still inside containerd's 5 s cleanup
#: budget, keeps the storm from measuring the CI machine's scheduling instead.
STORM_DELETE_TIMEOUT = "4"


@pytest.fixture(scope="module")
def storm_lab(
    tmp_path_factory: pytest.TempPathFactory, journal: Journald | None
) -> Iterator[cl.GuardedLab]:
    """A containerd of its own whose runc-guard waits up to STORM_DELETE_TIMEOUT."""
    socket = journal.socket if journal is not None else None
    with cl.guarded_containerd_in(
        tmp_path_factory, "rgctd-storm", cl.HYBRID, socket, RUNC_GUARD_DELETE_TIMEOUT=STORM_DELETE_TIMEOUT
    ) as lab:
        yield lab


def test_storm_leaves_nothing_where_stock_runc_leaks(summary: list[str], storm_lab: cl.GuardedLab) -> None:
    """50 crashes: runc-guard leaves 0 directories, or says why; stock runc leaks in the first 10.

    A delete the host starved past its deadline exits 75 and keeps its record (for
    the finisher or the sweep); no container may leak without one.
    """
    with cl.namespace(storm_lab.containerd) as ns:
        _storm(summary, storm_lab, storm_lab.containerd, ns)


def _storm(summary: list[str], guarded: cl.GuardedLab, ctd: cl.Containerd, ns: str) -> None:
    given = os.environ.get(SEED_ENV)
    seed = int(given) if given else random.SystemRandom().randrange(1 << 30)
    rng = random.Random(seed)
    delays = [round(rng.uniform(0.3, 3.0), 2) for _ in range(CYCLES)]
    stock = cl.crash_storm(ctd, ns, cl.STOCK_RUNC, "runc 1.1.5", delays[:CONTROL_CYCLES])
    guard = cl.crash_storm(ctd, ns, cl.guard_binary(), "runc-guard", delays)
    stats = cl.delete_stats(guarded.settings, set(guard.task_ids))
    waited = [int(str(s["waited_ms"])) for s in stats]
    outcomes = sorted(str(s["outcome"]) for s in stats)
    records = [r for r in cl.pending_records(guarded.settings)
               if r.split("@")[0] in set(guard.task_ids)]
    summary.extend([
        f"storm of {CYCLES} Path B crashes, teardown delays 0.3-3 s, delete_timeout "
        f"{STORM_DELETE_TIMEOUT} s (seed {seed}, replay with {SEED_ENV}={seed}):",
        f"  runc 1.1.5 (the first {CONTROL_CYCLES}): {stock.leaked_dirs} cgroup dirs leaked by "
        f"{stock.leaking_containers}/{CONTROL_CYCLES} containers",
        f"  runc-guard: {guard.leaked_dirs} cgroup dirs leaked by "
        f"{guard.leaking_containers}/{CYCLES} containers; pending records {len(records)}; "
        f"outcomes {dict((o, outcomes.count(o)) for o in set(outcomes))}; "
        f"wait p50 {int(statistics.median(waited)) if waited else '-'} ms, "
        f"max {max(waited) if waited else '-'} ms",
    ])
    ours = set(guard.task_ids)
    by_outcome = {str(e.get("container_id")): e for e in cl.guard_events(guarded.settings, "delete")
                  if e.get("container_id") in ours}
    reasons = [(e.get("outcome"), e.get("reason")) for e in by_outcome.values()
               if e.get("outcome") not in ("removed", "already_gone")]
    try:
        assert len(outcomes) == CYCLES
        # "already_gone": the children died inside runc's own ~150 ms rmdir window.
        # "deadline": a CI machine running other suites beside this one can starve a
        # delete past its 4 s; then it must say so (exit 75) and keep its record for
        # the sweep -- a leak without a record is the incident itself.
        assert set(outcomes) <= {"removed", "already_gone", "deadline"}, reasons
        # The stats line is written by the delete itself, before it exits; the journal entry
        # comes later from a reporter at nice 19, which a saturated node (the VM lab on the
        # other worker) can hold back past any wait: the outcome is read from the former.
        cut_short = {str(s["container_id"]) for s in stats if s["outcome"] == "deadline"}
        assert set(guard.leaking_ids) <= cut_short, (guard.leaking_ids, reasons)
        assert {r.split("@")[0] for r in records} == cut_short, (records, reasons)
        reported = cut_short & set(by_outcome)
        assert all(by_outcome[cid].get("exit_status") == 75 for cid in reported), reasons
        # Removal, not the deadline, is what the storm is about: most deletes finish.
        assert len(cut_short) < CYCLES // 4, reasons
    finally:
        for name in records:
            os.unlink(os.path.join(guarded.settings["RUNC_GUARD_PENDING_DIR"], name))
    # The control: the harness still reproduces the incident for most crashes.
    assert stock.leaking_containers >= CONTROL_CYCLES // 2, stock
