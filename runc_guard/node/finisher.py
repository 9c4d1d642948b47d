"""Finish what a delete's deadline cut short, after the reply, without waiting for the sweep.

A delete that reaches its deadline (exit 75) replies in time for containerd and
keeps its pending record. On the dead-shim path containerd never asks again, so
until now those cgroups (and runc >= 1.2's kept state) waited for the sweep's
timer. The delete now starts this finisher, detached (``report.detach_finisher``:
its own session, /dev/null for stdio, none of containerd's pipes); one serves a
whole storm, niced, for ``finish_window`` seconds after the last record it saw
appear. For each pending record it:

1. skips it while another delete holds its claim, while the record's init is
   not provably dead (alive or unknown), or while a serving containerd shim
   names the container or its sandbox (containerd's own retry owns it then);
2. waits until every recorded cgroup is empty (woken by ``cgroup.events`` where
   the kernel has it), killing nothing;
3. re-runs the runtime's own ``delete --force`` when it kept its state;
4. removes what is left, leaf-first, and resets a failed scope of the systemd driver;
5. drops the record and logs one ``delete`` entry, ``outcome=finished_late``.

It also finishes what a delete that stepped aside at start-up overload left to
the runtime alone (an aside record of kind ``overload``: nothing was judged there,
only the load was too high). Such a container is acted on only once containerd is
done with it (its bundle is gone), its init is provably dead, no serving shim
names it, and the cgroups its runtime state names pass the delete's own
ownership checks (``paths.check_container_paths``); then as above, from step 2.
Every other aside record (runc-guard could not prove something) stays for the
sweep's own rules and audit.

What it cannot finish in its window stays for ``runc-guardctl sweep`` and audit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from runc_guard.delete.aside import OVERLOAD, iter_aside
from runc_guard.delete.cgroupfs import CgroupFsOps, RealCgroupFs, cgroup_mounts
from runc_guard.delete.cleanup import CgroupBusy, CgroupRemovalFailed, drain, live_pids
from runc_guard.delete.paths import check_container_paths, init_started_wall
from runc_guard.delete.pending import BUSY, Claim, PendingRecord, iter_records, remove_record
from runc_guard.delete.report import EventLog, deliver
from runc_guard.delete.runtime_child import run_runtime_child
from runc_guard.delete.state import ContainerState, read_state, runtime_state_exists
from runc_guard.errors import RuncGuardError, StateMissing, StateUnreadable
from runc_guard.node.orphans import cleanups_running, live_shim_ids
from runc_guard.procinfo import DEAD, init_liveness
from runc_guard.settings import Settings, load
from runc_guard.shim.argv import valid_container_id
from runc_guard.spool import keep_only_stdio_and, spool_dir, step_back

#: How long one pass waits for a recorded cgroup to change before looking again.
POLL = 0.5
#: No record acted on while deletes are still cutting short: a crash storm's deletes all
#: reply within containerd's 5 s cleanup budget, and the finisher must not take the CPU
#: they (and the runtimes they run) need. So it acts once no new record appeared for this long.
QUIET = 5.0
#: Dead-shim cleanups still running hold the finisher back at most this long after the last new record.
HOLD_MAX = 30.0
#: A runtime's delete gets this long; the removal after it, this long.
RUNTIME_BUDGET = 10.0
REMOVE_BUDGET = 2.0
#: Re-runs of one record's runtime delete that failed before the finisher leaves it to the sweep.
MAX_ATTEMPTS = 3


@dataclass
class Finisher:
    """One finisher's view of the pending records; :meth:`pass_once` is one look at all of them."""

    settings: Settings
    fs: CgroupFsOps = field(default_factory=RealCgroupFs)
    clock: Callable[[], float] = time.monotonic
    proc: str = "/proc"
    mounts: Callable[[], Mapping[str, str]] = cgroup_mounts
    attempts: dict[str, int] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)

    def now(self) -> float:
        return self.clock()

    def pass_once(self) -> tuple[int, list[str]]:
        """Try every record once; returns (records still pending, populated cgroups to wait on)."""
        pending = 0
        populated: list[str] = []
        shims: frozenset[str] | None = None
        for path, record in self._candidates():
            pending += 1
            if isinstance(record, str):
                continue  # not ready yet (why: the string), looked at again next pass
            busy = [p for p in record.cgroup_paths if self.fs.exists(p) and live_pids(p, self.fs)]
            if busy:
                populated.extend(busy)
                continue
            if init_liveness(record.init_pid, record.init_start, self.proc) != DEAD:
                continue
            if shims is None:
                shims = live_shim_ids(self.proc, serving_only=True)
            if self._owned_by_a_shim(record, shims):
                continue
            if self._finish(path, record):
                pending -= 1
        return pending, populated

    def _candidates(self) -> list[tuple[str, PendingRecord | str]]:
        """Pending records, then overload aside records as records (or why not yet)."""
        found: list[tuple[str, PendingRecord | str]] = []
        for path, record in iter_records(self.settings.pending_dir):
            if not isinstance(record, ValueError) and self.attempts.get(path, 0) < MAX_ATTEMPTS:
                found.append((path, record))
        for path, doc in iter_aside(self.settings.cache_dir):
            if doc is None or doc.get("kind") != OVERLOAD or self.attempts.get(path, 0) >= MAX_ATTEMPTS:
                continue
            judged = self._judge_overload(doc)
            if judged is None:
                self.attempts[path] = MAX_ATTEMPTS  # nothing for the finisher: the sweep and audit judge it
            else:
                found.append((path, judged))
        return found

    def _judge_overload(self, doc: dict[str, object]) -> PendingRecord | str | None:
        """An overload aside record as a pending record once its runtime state proves it ours.

        A string: not yet (containerd still holds the bundle). None: never for the
        finisher (no state left, unreadable, not provably the container's own cgroups).
        """
        root, cid, runtime = str(doc.get("runtime_root", "")), str(doc["container_id"]), doc.get("runtime")
        if not isinstance(runtime, str) or not os.path.isabs(runtime) or not os.path.isabs(root):
            return None
        if not valid_container_id(cid):
            return None  # a record is input: an id that is not one never reaches a path or a runtime
        if not runtime_state_exists(root, cid):
            return None  # the runtime's own delete went through (or runc 1.1 dropped it: the sweep's)
        try:
            state = read_state(root, cid, self.mounts)
            bundle = state.labels.get("bundle", "")
            if bundle and os.path.exists(bundle):
                return "containerd still holds the bundle"
            mounts = self.mounts()
            ownership = check_container_paths(
                state, self.fs, mounts, init_started_wall(state)[0], self.settings.container_cgroup_patterns
            )
        except RuncGuardError:
            return None
        if ownership.step_aside is not None or not _has_init(state):
            return None
        created = doc.get("created")
        return PendingRecord(
            cid, root, ownership.paths, state.init_pid, state.init_start, runtime,
            float(created) if isinstance(created, (int, float)) else time.time(),
        )

    def _owned_by_a_shim(self, record: PendingRecord, shims: frozenset[str]) -> bool:
        """A serving shim for the container or its CRI sandbox: containerd's retry will come."""
        if record.container_id in shims:
            return True
        try:
            state = read_state(record.runtime_root, record.container_id)
        except (StateMissing, StateUnreadable):
            return False
        return bool(state.sandbox_id) and state.sandbox_id in shims

    def _finish(self, path: str, record: PendingRecord) -> bool:
        """Steps 3-5 for one record whose cgroups are empty; True when it is done."""
        started = self.now()
        claim = Claim(self.settings.pending_dir, record.runtime_root, record.container_id, started, self.now)
        with claim as held:
            if held == BUSY or not os.path.exists(path):
                return False
            reruns = 0
            if runtime_state_exists(record.runtime_root, record.container_id):
                reruns = 1
                args = ["--root", record.runtime_root, "delete", "--force", record.container_id]
                run = run_runtime_child(record.runtime, args, started + RUNTIME_BUDGET, self.now)
                if run.status != 0 and runtime_state_exists(record.runtime_root, record.container_id):
                    self.attempts[path] = self.attempts.get(path, 0) + 1
                    return False
            try:
                report = drain(
                    record.cgroup_paths, self.fs, self.now() + REMOVE_BUDGET, self.settings.poll_interval,
                    may_kill=False, remove=True, clock=self.now,
                )
            except (CgroupBusy, CgroupRemovalFailed):
                self.attempts[path] = self.attempts.get(path, 0) + 1
                return False
            scope = _reset_scope(record, self.fs, self.now() + REMOVE_BUDGET)
            remove_record(path)
        in_pending = os.path.dirname(path) == os.path.normpath(self.settings.pending_dir)
        left_by = "deadline" if in_pending else "overload"
        self._report(record, reruns, len(report.removed), scope, left_by)
        self.finished.append(record.container_id)
        return True

    def _report(
        self, record: PendingRecord, reruns: int, removed: int, scope: dict[str, object] | None, left_by: str
    ) -> None:
        """One canonical entry, as a delete's, and its stats line for the metrics."""
        from runc_guard.delete.run import append_stats

        entry: dict[str, object] = {
            "outcome": "finished_late",
            "left_by": left_by,
            "cgroup_paths": record.cgroup_paths,
            "runtime_runs": reruns,
            "removed": removed,
            "since_record_ms": int(max(0.0, time.time() - record.created) * 1000),
        }
        if scope is not None:
            entry["systemd_scope_after"] = scope
        context = {"container_id": record.container_id, "runtime": record.runtime,
                   "runtime_root": record.runtime_root}
        log = EventLog(self.settings.log_level, context)
        log.info("delete", **entry)
        append_stats(self.settings.stats_file, "finished_late", entry, record.container_id)
        deliver(log, self.settings, spool_dir(self.settings.cache_dir))


def _has_init(state: ContainerState) -> bool:
    """A state that names its init (pid and start time): liveness can be proven."""
    return state.init_pid > 0 and state.init_start > 0


def _reset_scope(record: PendingRecord, fs: CgroupFsOps, deadline: float) -> dict[str, object] | None:
    """The systemd driver: a scope left failed by the cut-short delete is reset once empty."""
    from runc_guard.delete.unit_name import transient_unit_loaded

    units = {os.path.basename(p) for p in record.cgroup_paths if p.endswith(".scope")}
    for unit in sorted(units):
        if transient_unit_loaded(unit) is False:
            continue
        from runc_guard.delete.systemd_scope import settle

        def empty() -> bool:
            return not any(live_pids(p, fs) for p in record.cgroup_paths if fs.exists(p))

        return settle(unit, empty, deadline).as_dict()
    return None


def _work(settings: Settings) -> set[str]:
    """The files a finisher is for: pending records and overload aside records."""
    names = {p for p, _ in iter_records(settings.pending_dir)}
    for path, doc in iter_aside(settings.cache_dir):
        if doc is not None and doc.get("kind") == OVERLOAD:
            names.add(path)
    return names


def run(
    settings: Settings, window: float, finisher: Finisher | None = None, seen: set[str] | None = None,
    quiet: float = QUIET,
) -> Finisher:
    """Pass over the records until none is left, or ``quiet`` + ``window`` s pass without a new one.

    Nothing is done until no new record has appeared, and no dead-shim cleanup of
    containerd's has run, for ``quiet`` s (those cleanups are SIGKILLed at 5 s and
    a killed one leaves its task unfinished for good: they get the CPU first); a
    steady stream of cleanups holds it back at most HOLD_MAX s after the last new
    record. ``seen`` collects the record files looked at (the caller's, across runs).
    """
    finisher = finisher or Finisher(settings)
    seen = set() if seen is None else seen
    last_new = last_busy = finisher.now()
    while True:
        names = _work(settings)
        now = finisher.now()
        if names - seen:
            last_new = now
        seen |= names
        if not names or now - last_new >= quiet + window:
            return finisher
        if now - last_new < HOLD_MAX and cleanups_running(finisher.proc):
            last_busy = now
        calm = min(now - last_new, now - last_busy)
        if calm < quiet:
            wait = min(POLL, quiet - calm)
            finisher.fs.wait_for_change([], wait, wait)
            continue
        pending, populated = finisher.pass_once()
        if pending == 0:
            return finisher
        finisher.fs.wait_for_change(populated, POLL, POLL * 4)


def finisher_main(held: int) -> None:
    """The detached finisher (``report.detach_finisher`` starts it); ``held`` is its lock, taken for it.

    Closes every other inherited fd but stdio (/dev/null), lowers its priority
    (it must never compete with containerd's own work), and judges liveness only
    from the runtime's PID namespace (node.pidns: otherwise every init looks
    dead); then runs. Before it exits it lets go of the lock and looks once
    more: a delete that found the lock held started no finisher of its own, so
    a record it has not seen yet means another round.
    """
    keep_only_stdio_and(held)
    step_back()
    from runc_guard.delete.report import FINISHER_LOCK
    from runc_guard.node.pidns import pid_namespace_view
    from runc_guard.spool import try_lock

    settings = load()
    if not pid_namespace_view().trusted:
        os.close(held)
        return  # what it leaves, the sweep (which refuses there too, loudly) and audit report
    seen: set[str] = set()
    lock: int | None = held
    while lock is not None:
        try:
            run(settings, settings.finish_window, seen=seen)
        finally:
            os.close(lock)
        if not _work(settings) - seen:
            return
        lock = try_lock(settings.cache_dir, FINISHER_LOCK)
