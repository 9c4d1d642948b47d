"""Finish what a delete's deadline cut short, after the reply, without waiting for the sweep.

A delete that reaches its deadline (exit 75) replies in time for containerd and
keeps its pending record. On the dead-shim path containerd never asks again, so
until now those cgroups (and runc >= 1.2's kept state) waited for the sweep's
timer. The delete now starts this finisher, detached (``report.detach_finisher``:
its own session, /dev/null for stdio, none of containerd's pipes); one serves a
whole storm, niced, for ``finish_window`` seconds after the last record it saw
appear (its start-up, lock and loop: node.finisher_process; here, its passes).
Every record it reads, pending or aside, is held to the one trust rule
(``pending.RecordRule``: our file, a cgroup's shape and the container's ownership for
every path, a routed runtime), again under the claim right before it acts; one that
fails is left with one ``finisher_left`` entry and audit counts it. For each pending
record it:

1. waits until every recorded cgroup is empty (woken by ``cgroup.events`` where
   the kernel has it), killing nothing, and the record's init is provably dead;
2. takes the record's claim and, under it, right before acting, looks again
   (:meth:`Finisher._not_now`): no other delete holds the id, no containerd
   shim (serving, or a dead-shim cleanup still running) names the container or
   its sandbox, its bundle is gone, and any runtime state of that id is still
   the recorded container (init pid and start time): a container re-created
   under the same id (fixed ctr/nerdctl names, Docker's restart) is never touched;
3. re-runs the runtime's own ``delete --force`` when it kept its state;
4. removes what is left, leaf-first (the identity looked at once more), and
   resets a *failed* scope of the systemd driver (never stops an active one);
5. drops the record and logs one ``delete`` entry, ``outcome=finished_late``.

It also finishes what a delete that stepped aside at start-up overload left to
the runtime alone (an aside record of kind ``overload``: nothing was judged there,
only the load was too high). Such a container is acted on only once containerd is
done with it (its bundle is gone), its init is provably dead, no serving shim
names it, and the cgroups its runtime state names pass the delete's own
ownership checks (``paths.check_container_paths``); then as above, from step 2.
Every other aside record (runc-guard could not prove something) stays for the
sweep's own rules and audit.

A CRI sandbox's delete records the pod's dead siblings (aside records of kind
``sibling``) instead of deleting them before its reply; each gets its own
delete here (``DeleteRun.run_sibling``: the same decision table, its own
canonical entry and stats line, its failure its own), once no shim names it or
its sandbox, no other delete holds it, and its state is still the recorded one
(looked at again right before each runtime run: node.late_sibling). The
sandbox's delete starts the finisher for these even with ``finish_window = 0``
(deleting them was its own job before, inline), and they get neither the quiet
wait nor the hold on other containers' cleanups (node.finisher_process.run).

A delete that held a container's memory cgroup aside (cgroup v1, a page cache too
large to reclaim on the reply's time: delete.memcg_hold) leaves it here too: each
pass takes one paced step of its reclaim (node.late_reclaim), storm or not (niced,
no I/O of its own), and the finisher does not exit while one is held: at most
HELD_GIVE_UP s after it first saw it, then it is the sweep's (as is a record it
cannot read).

What it cannot finish in its window stays for ``runc-guardctl sweep`` and audit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from runc_guard.delete.aside import OVERLOAD, SIBLING, iter_aside
from runc_guard.delete.cgroupfs import CgroupFsOps, RealCgroupFs, cgroup_mounts
from runc_guard.delete.cleanup import drain, populated_dirs
from runc_guard.delete.memcg_hold import iter_held
from runc_guard.delete.outcomes import MEMCG_LINE
from runc_guard.delete.paths import check_container_paths, init_started_wall
from runc_guard.delete.pending import (
    BUSY,
    Claim,
    PendingRecord,
    RecordRule,
    UntrustedRecord,
    iter_records,
    remove_record,
)
from runc_guard.delete.reclaim import SWEEP_BUDGET as RECLAIM_BUDGET
from runc_guard.delete.report import EventLog, deliver
from runc_guard.delete.run import Outcome
from runc_guard.delete.runtime_child import run_runtime_child
from runc_guard.delete.state import ContainerState, read_state, runtime_state_exists
from runc_guard.delete.stats import append_stats
from runc_guard.errors import (
    EXIT_INTERNAL,
    CgroupBusy,
    CgroupRemovalFailed,
    CleanupReport,
    RuncGuardError,
    StateMissing,
    StateUnreadable,
)
from runc_guard.invocation import parse, valid_container_id
from runc_guard.node.late_reclaim import LATE_MAX
from runc_guard.node.late_reclaim import Step as LateStep
from runc_guard.node.late_reclaim import step as late_step
from runc_guard.node.late_sibling import LateSibling, SiblingWork, sibling_work
from runc_guard.node.orphans import live_shim_ids
from runc_guard.procinfo import DEAD, init_liveness
from runc_guard.settings import Settings
from runc_guard.spool import spool_dir

#: Dead-shim cleanups still running hold the finisher back at most this long after the last new record.
HOLD_MAX = 30.0
#: What one pass reclaims from held memcgs at most, all of them together (a storm of large caches
#: is reclaimed at this pace, ~2 passes a second, not a step per memcg per pass).
HELD_PASS_BYTES = 256 << 20
#: A held memcg still not done this long after its hold (a process moved into it, a path the finisher
#: may not touch) is the sweep's and audit's: the finisher gives up, the sweep takes over.
HELD_GIVE_UP = LATE_MAX + HOLD_MAX
#: A runtime's delete gets this long; the removal after it, this long.
RUNTIME_BUDGET = 10.0
REMOVE_BUDGET = 2.0
#: Re-runs of one record's runtime delete that failed before the finisher leaves it to the sweep.
MAX_ATTEMPTS = 3


#: A record's work: a pending record, a sibling to delete, or why it is not ready yet.
Work = PendingRecord | SiblingWork | str


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
    #: Bytes reclaimed so far per held-memcg record (a held memcg takes several steps).
    reclaimed_held: dict[str, int] = field(default_factory=dict)
    #: When this finisher first looked at each held-memcg record (its clock): the records it has seen,
    #: and a give-up bound that no record's ``created`` (a stepped clock, hostile input) can stretch.
    held_since: dict[str, float] = field(default_factory=dict)
    #: Whether the kernel reparents a removed memcg's page cache (node.memcg_probe, at start-up):
    #: a held memcg is then removed without a reclaim. None: not known, reclaimed as before.
    kernel_reparents: bool | None = None

    def now(self) -> float:
        return self.clock()

    def pass_once(self, siblings_only: bool = False) -> tuple[int, list[str]]:
        """Try every record once; returns (records still pending, populated cgroups to wait on)."""
        pending = 0
        populated: list[str] = []
        for path, record in self._candidates(siblings_only):
            pending += 1
            if isinstance(record, str):
                continue  # not ready yet (why: the string), looked at again next pass
            try:
                if isinstance(record, SiblingWork):
                    done = self._delete_sibling(path, record)
                else:
                    done = self._try(path, record, populated)
            except Exception as exc:  # noqa: BLE001 - one record's failure is its own, never the pass's
                self.attempts[path] = self.attempts.get(path, 0) + 1
                self._log_left(record.container_id, record.runtime_root, f"{type(exc).__name__}: {exc}")
                continue
            if done:
                pending -= 1
        return pending, populated

    def _try(self, path: str, record: PendingRecord, populated: list[str]) -> bool:
        """A record whose cgroups are empty (child cgroups included) and whose init is dead is finished;
        else waited for."""
        busy = populated_dirs(record.cgroup_paths, self.fs)
        if busy:
            populated.extend(busy)
            return False
        if init_liveness(record.init_pid, record.init_start, self.proc) != DEAD:
            return False
        return self._finish(path, record)

    def rule(self) -> RecordRule:
        """The trust rule (pending.RecordRule) for every record, with today's mounts and routing."""
        return RecordRule.of(self.settings, self.fs, self.mounts())

    def _candidates(self, siblings_only: bool = False) -> list[tuple[str, Work]]:
        """Pending records, then overload aside records as records (or why not yet), then siblings.

        Each must pass the trust rule (a pending record as it is read, an aside
        record once turned into work); one that does not is left for good, with
        one ``finisher_left`` entry, and audit counts it.
        """
        found: list[tuple[str, Work]] = []
        rule = self.rule()
        for path, record in [] if siblings_only else iter_records(self.settings.pending_dir, rule):
            if self.attempts.get(path, 0) >= MAX_ATTEMPTS:
                continue
            if isinstance(record, ValueError):
                cid = record.container_id if isinstance(record, UntrustedRecord) else None
                self._leave(path, cid or "", "", f"untrusted pending record: {record}")
            else:
                found.append((path, record))
        for path, doc in iter_aside(self.settings.cache_dir):
            kind = doc.get("kind") if doc is not None else None
            kinds = (SIBLING,) if siblings_only else (OVERLOAD, SIBLING)
            if doc is None or kind not in kinds or self.attempts.get(path, 0) >= MAX_ATTEMPTS:
                continue
            judged = self._judge_overload(doc) if kind == OVERLOAD else sibling_work(doc)
            if judged is None:
                self.attempts[path] = MAX_ATTEMPTS  # nothing for the finisher: the sweep and audit judge it
                continue
            problem = None if isinstance(judged, str) else _aside_problem(rule, judged)
            if problem is None:
                found.append((path, judged))
            else:
                assert not isinstance(judged, str)
                reason = f"untrusted aside record: {problem}"
                self._leave(path, judged.container_id, judged.runtime_root, reason)
        return found

    def _leave(self, path: str, container_id: str, runtime_root: str, reason: str) -> None:
        """A record left for good: never looked at again by this finisher, one entry."""
        self.attempts[path] = MAX_ATTEMPTS
        self._log_left(container_id, runtime_root, reason, path)

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
            float(created) if isinstance(created, (int, float)) else time.time(), bundle, state.sandbox_id,
        )

    def _not_now(self, record: PendingRecord) -> tuple[str, bool] | None:
        """Why the finisher must not act on ``record`` right now (and whether for good); None: act.

        Looked at under the record's claim, right before acting, per record (a
        pass can take a while: no snapshot of an earlier look serves): containerd
        still working on the container (a shim, serving or a dead-shim cleanup
        still running, names it or its sandbox; its bundle still exists), or the
        runtime state of that id is no longer the recorded container's (re-created:
        for good, the new container's own delete owns the id), or its init is not
        provably dead. The bundle does not hold a pod's container whose sandbox's
        state is gone (the sandbox's siblings): containerd's dead-shim cleanup
        removes the sandbox's bundle only, the sibling's stays until the CRI
        removes the container (whose delete then finds the runtime's state gone:
        "does not exist", success); the shim check still holds it.
        """
        sandbox, bundles = record.sandbox_id, [record.bundle]
        if os.path.lexists(os.path.join(record.runtime_root, record.container_id)):
            try:
                state = read_state(record.runtime_root, record.container_id, self.mounts)
            except StateMissing:
                return "a container of this id is being created (state directory without state)", False
            except StateUnreadable as exc:
                return f"cannot prove the state is still the recorded container's: {exc}", True
            if (state.init_pid, state.init_start) != (record.init_pid, record.init_start):
                return (f"re-created: the state's init is {state.init_pid}/{state.init_start}, the record's"
                        f" {record.init_pid}/{record.init_start}"), True  # fmt: skip
            sandbox = sandbox or state.sandbox_id
            bundles.append(state.labels.get("bundle", ""))
        held = live_shim_ids(self.proc) & {record.container_id, sandbox}
        if held:
            return f"a containerd shim still names {sorted(held)[0]}", False
        bundle = next((b for b in bundles if b and os.path.lexists(b)), None)
        if bundle is not None and not _sandbox_gone(record.runtime_root, record.container_id, sandbox):
            return f"containerd still holds the bundle {bundle}", False
        if init_liveness(record.init_pid, record.init_start, self.proc) != DEAD:
            return "init not provably dead", False
        return None

    def _finish(self, path: str, record: PendingRecord) -> bool:
        """Steps 2-5 for one record whose cgroups are empty; True when it is done."""
        started = self.now()
        claim = Claim(self.settings.pending_dir, record.runtime_root, record.container_id, started, self.now)
        with claim as held:
            if held == BUSY or not os.path.exists(path):
                return False
            problem = self.rule().problem(record)  # right before the runtime runs and anything is removed
            if problem is not None:
                self._leave(path, record.container_id, record.runtime_root, f"untrusted record: {problem}")
                return False
            if not self._clear(path, record):
                return False
            reruns = 0
            if runtime_state_exists(record.runtime_root, record.container_id):
                reruns = 1
                args = ["--root", record.runtime_root, "delete", "--force", record.container_id]
                run = run_runtime_child(record.runtime, args, started + RUNTIME_BUDGET, self.now)
                if run.status != 0 and runtime_state_exists(record.runtime_root, record.container_id):
                    self.attempts[path] = self.attempts.get(path, 0) + 1
                    return False
                if not self._clear(path, record):  # re-created while the runtime ran: not ours to remove
                    return False
            try:
                report = drain(
                    record.cgroup_paths, self.fs, self.now() + REMOVE_BUDGET, self.settings.poll_interval,
                    may_kill=False, remove=True, clock=self.now, reclaim_budget=RECLAIM_BUDGET,
                )
            except (CgroupBusy, CgroupRemovalFailed):
                self.attempts[path] = self.attempts.get(path, 0) + 1
                return False
            scope = _reset_scope(record, self.fs, self.now() + REMOVE_BUDGET)
            remove_record(path)
        in_pending = os.path.dirname(path) == os.path.normpath(self.settings.pending_dir)
        left_by = "deadline" if in_pending else "overload"
        self._report(record, reruns, report, scope, left_by)
        self.finished.append(record.container_id)
        return True

    def _clear(self, path: str, record: PendingRecord) -> bool:
        """:meth:`_not_now` says act; otherwise the record waits (or, for good, is left and logged)."""
        why = self._not_now(record)
        if why is None:
            return True
        reason, for_good = why
        if for_good:
            self.attempts[path] = MAX_ATTEMPTS
            self._log_left(record.container_id, record.runtime_root, reason)
        return False

    def _delete_sibling(self, path: str, work: SiblingWork) -> bool:
        """A sandbox's dead sibling: its own delete, once containerd and every other delete are off it.

        Its state must still be the recorded container's (init pid and start,
        provably dead): a container re-created under the id is left alone. The
        record goes before the delete runs: from then on the sibling's own
        pending record (or aside record, if it steps aside) speaks for it.
        """
        try:
            state = read_state(work.runtime_root, work.container_id, self.mounts)
        except StateMissing:  # deleted meanwhile (containerd, kubelet): nothing of ours left to do
            self.attempts[path] = MAX_ATTEMPTS
            remove_record(path)
            return True
        except StateUnreadable as exc:
            self.attempts[path] = MAX_ATTEMPTS
            self._log_left(work.container_id, work.runtime_root, f"sibling: {exc}")
            return False
        record = PendingRecord(work.container_id, work.runtime_root, [], work.init_pid, work.init_start,
                               work.runtime, 0.0, "", work.sandbox_id)  # fmt: skip
        if not self._clear(path, record):
            return False
        probe = Claim(self.settings.pending_dir, work.runtime_root, work.container_id, self.now(), self.now)
        with probe as held:
            if held == BUSY:
                return False  # another delete of it runs: that one finishes it
        log = EventLog(self.settings.log_level, {"container_id": work.container_id, "runtime": work.runtime,
                                                 "runtime_root": work.runtime_root})  # fmt: skip
        sibling = LateSibling(parse(work.args), list(work.args), work.runtime, self.settings, fs=self.fs,
                              mounts=self.mounts, clock=self.clock, log=log)  # fmt: skip
        sibling.identity, sibling.bundle = (work.init_pid, work.init_start), work.bundle
        sibling.sibling_of = work.sandbox_id
        sibling.canonical["sandbox_id"] = work.sandbox_id
        remove_record(path)
        try:
            sibling.run_sibling(state)
        except Exception as exc:  # noqa: BLE001 - the sibling's failure is its own entry, nothing more
            reason = f"internal error: {type(exc).__name__}: {exc}; recorded for runc-guardctl sweep"
            try:
                sibling.finish(Outcome("internal_error", EXIT_INTERNAL, reason), final=False)
            except Exception:  # noqa: BLE001 - reporting failed too: the sweep and audit see the state
                pass
        deliver(log, self.settings, spool_dir(self.settings.cache_dir))
        self.finished.append(work.container_id)
        return True

    def _log_left(self, container_id: str, runtime_root: str, reason: str, record: str = "") -> None:
        """One entry for a record left for good (to the sweep, audit, or the id's new owner)."""
        log = EventLog(self.settings.log_level, {"container_id": container_id, "runtime_root": runtime_root})
        log.warning("finisher_left", reason=reason, **({"record": record} if record else {}))
        deliver(log, self.settings, spool_dir(self.settings.cache_dir))

    def reclaim_held(self) -> int:
        """One paced step on every memory cgroup a delete held aside (node.late_reclaim); how many are left.

        A record still not done HELD_GIVE_UP s after it was written, or after this finisher first saw
        it, is left to the sweep and audit (one ``finisher_left`` entry); an unusable one at once,
        without an entry (it names nothing to report; audit lists it). Neither counts as left.
        """
        left = spent = 0
        for path, found in iter_held(self.settings.cache_dir):
            first = self.held_since.setdefault(path, self.now())
            if found is None or self.attempts.get(path, 0) >= MAX_ATTEMPTS:
                continue
            # Its age is the older of its date's and this finisher's own look: a record dated ahead
            # (a clock stepped back) still comes to late_reclaim's LATE_MAX and its give-up in time.
            created = min(float(found["created"]), time.time() - (self.now() - first))
            doc = {**found, "created": created}
            if spent >= HELD_PASS_BYTES:
                left += 1  # this pass has reclaimed its share: the next one goes on
                continue
            try:
                result = late_step(path, doc, reparents=self.kernel_reparents is True)
            except Exception as exc:  # noqa: BLE001 - one record's failure is its own
                self.attempts[path] = MAX_ATTEMPTS
                reason = f"{type(exc).__name__}: {exc}"
                self._log_left(str(doc["container_id"]), str(doc["runtime_root"]), reason)
                continue
            spent += result.reclaimed
            self.reclaimed_held[path] = self.reclaimed_held.get(path, 0) + result.reclaimed
            if result.done:
                self.held_since.pop(path)  # its record is gone: a later hold of that name is a new one
                self._report_held(doc, self.reclaimed_held.pop(path), result)
            elif time.time() - created > HELD_GIVE_UP:
                self.attempts[path] = MAX_ATTEMPTS
                self._log_left(str(doc["container_id"]), str(doc["runtime_root"]),
                               f"held memory cgroup {doc['held']}: {result.why}")
            else:
                left += 1
        return left

    def _report_held(self, doc: Mapping[str, object], reclaimed: int, result: LateStep) -> None:
        """One entry per held memcg removed, and a stats line that counts its memory, not a delete."""
        entry: dict[str, object] = {
            "held": doc["held"],
            "memcg_reclaimed_kb": reclaimed >> 10,
            "held_ms": int(max(0.0, time.time() - float(str(doc["created"]))) * 1000),
        }
        if result.left:
            entry["memcg_unreclaimed"] = {str(doc["held"]): f"{result.why} ({result.left >> 10} KiB)"}
        log = EventLog(self.settings.log_level, {"container_id": doc["container_id"],
                                                 "runtime_root": doc["runtime_root"]})
        (log.warning if result.left else log.info)("memcg_reclaimed_late", **entry)
        append_stats(self.settings.stats_file, "memcg_reclaimed_late", entry, str(doc["container_id"]),
                     kind=MEMCG_LINE)
        deliver(log, self.settings, spool_dir(self.settings.cache_dir))

    def _report(
        self, record: PendingRecord, reruns: int, cleanup: CleanupReport, scope: dict[str, object] | None,
        left_by: str,
    ) -> None:
        """One canonical entry, as a delete's, and its stats line for the metrics."""
        entry: dict[str, object] = {
            "outcome": "finished_late",
            "left_by": left_by,
            "cgroup_paths": record.cgroup_paths,
            "runtime_runs": reruns,
            "removed": len(cleanup.removed),
            "since_record_ms": int(max(0.0, time.time() - record.created) * 1000),
        }
        if cleanup.reclaimed:
            entry["memcg_reclaimed_kb"] = cleanup.reclaimed >> 10
        if cleanup.unreclaimed:
            entry["memcg_unreclaimed"] = cleanup.unreclaimed
        if scope is not None:
            entry["systemd_scope_after"] = scope
        context = {"container_id": record.container_id, "runtime": record.runtime,
                   "runtime_root": record.runtime_root}
        log = EventLog(self.settings.log_level, context)
        log.info("delete", **entry)
        append_stats(self.settings.stats_file, "finished_late", entry, record.container_id)
        deliver(log, self.settings, spool_dir(self.settings.cache_dir))


def _aside_problem(rule: RecordRule, work: PendingRecord | SiblingWork) -> str | None:
    """Why an aside record's work fails the trust rule: a sibling's runtime (its paths are its own
    delete's to prove), an overload record's everything."""
    if isinstance(work, SiblingWork):
        return rule.runtime_problem(work.runtime)
    return rule.problem(work)


def _has_init(state: ContainerState) -> bool:
    """A state that names its init (pid and start time): liveness can be proven."""
    return state.init_pid > 0 and state.init_start > 0


def _reset_scope(record: PendingRecord, fs: CgroupFsOps, deadline: float) -> dict[str, object] | None:
    """The systemd driver: a scope left *failed* by the cut-short delete is reset once empty.

    Only reset-failed, never ``systemctl stop``: an active unit of that name is
    not the finisher's (a container re-created under the id runs in it) and is
    left as it is, and so is one still deactivating (systemd's own stop job).
    """
    from runc_guard.delete.unit_name import transient_unit_loaded

    units = {os.path.basename(p) for p in record.cgroup_paths if p.endswith(".scope")}
    for unit in sorted(units):
        if transient_unit_loaded(unit) is False:
            continue
        from runc_guard.delete.systemd_scope import query, reset_failed

        current = query(unit, deadline)
        status = current.status
        if status is None or status.active_state != "failed":
            return current.as_dict()  # not loaded, inactive, active or deactivating: not ours to change
        if populated_dirs(record.cgroup_paths, fs):
            return current.as_dict()
        return reset_failed(unit, deadline).as_dict()
    return None


def _sandbox_gone(root: str, container_id: str, sandbox: str) -> bool:
    """``container_id`` belongs to a CRI pod whose sandbox (another container) has no runtime state left."""
    if not sandbox or sandbox == container_id or not valid_container_id(sandbox):
        return False
    return not os.path.lexists(os.path.join(root, sandbox))
