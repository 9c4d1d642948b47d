"""The detached finisher process: its start-up, its lock, its passes in a loop for its window, its exit.

``report.detach_finisher`` (or the launcher's step-aside) starts it in its own
session, /dev/null for stdio, none of containerd's pipes; one serves a whole
storm, niced, for ``finish_window`` seconds after the last record it saw
appear. What one pass does to a record is node.finisher's; this module decides
when passes run (not while a storm's deletes still need the CPU), how long it
sleeps between them, and when it exits.
"""

from __future__ import annotations

import os

from runc_guard.atomic import json_records
from runc_guard.delete.aside import OVERLOAD, SIBLING, iter_aside
from runc_guard.delete.cgroupfs import RealCgroupFs, cgroup_mounts
from runc_guard.delete.memcg_hold import held_dir
from runc_guard.delete.report import EventLog, deliver
from runc_guard.delete.stepaside import pending as step_asides
from runc_guard.node.finisher import HOLD_MAX, Finisher
from runc_guard.node.orphans import cleanups_running
from runc_guard.settings import Settings, load
from runc_guard.spool import keep_only_stdio_and, spool_dir, step_back

#: How long one pass waits for a recorded cgroup to change before looking again.
POLL = 0.5
#: No record acted on while deletes are still cutting short: a crash storm's deletes all
#: reply within containerd's 5 s cleanup budget, and the finisher must not take the CPU
#: they (and the runtimes they run) need. So it acts once no new record appeared for this long.
QUIET = 5.0
#: A sandbox's dead siblings are tried this long after the last new record, whatever finish_window
#: says (run): longer than HOLD_MAX, so a storm's cleanups cannot outlast it.
SIBLING_WINDOW = 60.0


def _work(settings: Settings, kinds: tuple[str, ...] = (OVERLOAD, SIBLING), pending: bool = True) -> set[str]:
    """The files a finisher is for: pending records, overload and sibling aside records (and the
    launcher's step-asides, until the reporter has made them aside records: runc_guard.delete.stepaside)."""
    names = set(json_records(settings.pending_dir)) if pending else set()
    if pending:
        names.update(step_asides(spool_dir(settings.cache_dir)))
    for path, doc in iter_aside(settings.cache_dir):
        if doc is not None and doc.get("kind") in kinds:
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

    A sandbox's dead siblings are deleted at once, without the ``quiet`` wait or the
    hold on other containers' cleanups (they ran inline, on containerd's time,
    before; now niced and after the reply), each as soon as no shim names it or its
    sandbox (the sandbox's own cleanup ends right after its reply), and with
    ``window`` 0 too, for SIBLING_WINDOW s: deleting them is the sandbox's delete's
    own job moved after its reply, not the opt-in finishing of what a deadline cut
    short (which ``window`` 0 turns off).
    """
    finisher = finisher or Finisher(settings)
    seen = set() if seen is None else seen
    last_new = last_busy = finisher.now()
    while True:
        names = _work(settings)
        siblings = _work(settings, (SIBLING,), pending=False)
        # held memcgs: a paced step each loop, storm or not (niced, no I/O of its own), until all are gone
        held = finisher.reclaim_held()
        now = finisher.now()
        if names - seen:
            last_new = now
        seen |= names
        if not names or now - last_new >= max(quiet + window, SIBLING_WINDOW if siblings else 0.0):
            if not held:
                return finisher
            finisher.fs.wait_for_change([], POLL, POLL)
            continue
        if siblings:
            finisher.pass_once(siblings_only=True)
        if now - last_new < HOLD_MAX and cleanups_running(finisher.proc):
            last_busy = now
        calm = min(now - last_new, now - last_busy)
        if window <= 0 or now - last_new >= quiet + window or calm < quiet:
            wait = min(POLL, quiet - calm) if calm < quiet else POLL
            finisher.fs.wait_for_change([], wait, wait)
            continue
        pending, populated = finisher.pass_once()
        if pending == 0 and not held:
            return finisher
        finisher.fs.wait_for_change(populated, POLL, POLL * 4)


def finisher_main(held: int) -> None:
    """The detached finisher (``report.detach_finisher`` starts it); ``held`` is its lock, taken for it.

    Closes every other inherited fd but stdio (/dev/null), lowers its priority
    (it must never compete with containerd's own work), and judges liveness only
    from the runtime's PID namespace (node.pidns: otherwise every init looks
    dead); then runs. Before it exits it lets go of the lock and looks once
    more: a delete that found the lock held started no finisher of its own, so
    a record it has not seen yet means another round. Only one it has not seen:
    what it gave up on (or cannot read) stays for the sweep, and another round
    for it would be a pass without a sleep, again and again (issue 42). One
    Finisher serves every round, so each record gets at most one entry.
    """
    keep_only_stdio_and(held)
    landing = step_back()
    from runc_guard.delete.report import FINISHER_LOCK
    from runc_guard.node.pidns import pid_namespace_view
    from runc_guard.spool import HELPER_STAYED, STAYED_REASON, note_once, try_lock

    settings = load()
    if landing is None and note_once(settings.cache_dir, HELPER_STAYED):
        log = EventLog(settings.log_level, {})
        log.warning("helper_cgroup_unknown", helper="finisher", reason=STAYED_REASON)
        deliver(log, settings, spool_dir(settings.cache_dir))
    if not pid_namespace_view().trusted:
        os.close(held)
        return  # what it leaves, the sweep (which refuses there too, loudly) and audit report
    from runc_guard.delete.reclaim import PROBE_FILE
    from runc_guard.node.memcg_probe import ensure_probed

    # once per boot (cached in the cache directory): does this kernel free a removed memcg itself?
    reparents, _ = ensure_probed(settings.cache_dir, cgroup_mounts())
    fs = RealCgroupFs(os.path.join(settings.cache_dir, PROBE_FILE))
    finisher = Finisher(settings, fs=fs, kernel_reparents=reparents)
    seen: set[str] = set()
    lock: int | None = held
    while lock is not None:
        try:
            run(settings, settings.finish_window, finisher, seen)
        finally:
            os.close(lock)
        unseen_held = set(json_records(held_dir(settings.cache_dir))) - finisher.held_since.keys()
        if not _work(settings) - seen and not unseen_held:
            return
        lock = try_lock(settings.cache_dir, FINISHER_LOCK)
