"""Delete slots: in a crash storm at most ``2 x CPUs`` deletes take runc-guard's path at once
(fewer where that path's measured cost says so: :func:`slots`).

Starting a delete costs ~45 ms of CPU (an interpreter, the delete path's imports,
the runtime as a child, the cgroup reads). When a node's pods die together
(hundreds of dead-shim cleanups at once, each under containerd's 5 s budget), a
2-core node is already saturated by the runtimes alone: stock runc keeps 8-10 of
its 10 CPU seconds busy in those 5 s (docs/storm.md). Whatever runc-guard adds
comes out of the runtimes' budget.

So each delete of a known container holds an flock on one slot file for its whole
run (closed with the process), and a delete that finds every slot taken steps
aside at once and marks a storm (the mtime of ``<slots>/storm``): for STORM_HOLD
seconds after that every delete steps aside without trying the slots, each
dead-shim cleanup among them renewing the mark, so that a storm puts only its
first few deletes on the full path, not one more each time a slot frees up. A
step-aside execs the runtime exactly as it would have run alone (never more harm
than the runtime) and leaves an aside record, which the finisher completes once
containerd is done. Waiting for a slot instead cost the stepped-aside
runtimes their budget: with slots held only while loading and a wait of up to
1 s, runc-guard left containerd more unfinished tasks than stock in 4 of 7
200-crash storms, almost all of them deletes that stepped aside after 1.1-1.6 s
of waiting. One delete at a time, the common case, takes its slot with one open
and one flock per slot file it tries.

The launcher (launcher/runc-guard.c) applies this same rule in C before any
interpreter starts, and hands the slot it took to the Python entry; these
constants are restated there (tests/test_launcher_admit.py compares them). Its
step-aside names only why (``overload_reason``'s words): the text is this module's.
"""

from __future__ import annotations

import os
import time

from runc_guard.overload import STORM_HOLD

#: The mark's name among the slot files.
STORM_MARK = "storm"


def storm_marked(directory: str, now: float | None = None) -> bool:
    """Did a delete find every slot held within STORM_HOLD? (``now``: time.time())

    The mark is a file's mtime, against the wall clock: a mark in the future (the clock
    stepped back) or unreadable counts as no storm, which is runc-guard's usual path.
    """
    try:
        marked = os.stat(os.path.join(directory, STORM_MARK)).st_mtime
    except OSError:
        return False
    age = (time.time() if now is None else now) - marked
    return 0.0 <= age < STORM_HOLD


def mark_storm(directory: str) -> None:
    """Every slot was held: the deletes of the next STORM_HOLD seconds step aside at once."""
    try:
        fd = os.open(os.path.join(directory, STORM_MARK), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        os.utime(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


#: The share of the node's CPU over one ``delete_timeout`` that the deletes taking the full path
#: at once may cost together. 2 x CPUs slots of a ~45 ms path stay far below it (2 % of the 2-core
#: host's 8 CPU s at the default 4 s); a path that takes 0.4-0.65 s of CPU (an interpreter on an
#: emulated or throttled CPU) gets none beside another: one alone, with CPU to spare (:func:`cpu_to_spare`),
#: so that a storm's runtimes keep the CPU.
COST_SHARE = 1 / 16


def cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except OSError:
        return os.cpu_count() or 1


def slots(cost_ms: int | None = None, timeout: float = 0.0) -> int:
    """Deletes allowed to load at once: two per CPU this process may run on, fewer when the
    measured ``cost_ms`` of each would take more than COST_SHARE of the node's CPU over
    ``timeout`` s; 0 when one alone would: then :func:`cpu_to_spare` decides."""
    n = cpus()
    most = max(2, 2 * n)
    if cost_ms is None:
        return most
    return min(most, int(COST_SHARE * n * timeout * 1000) // cost_ms)


#: The kernel's count of tasks runnable now (this one included): ``/proc/loadavg``'s fourth field.
LOADAVG = "/proc/loadavg"


def runnable(path: str = LOADAVG) -> int | None:
    """Tasks runnable right now, node-wide (the ``R`` of ``R/T``); None when unreadable."""
    try:
        with open(path, "rb") as f:
            field = f.read(256).split()[3]
        running, _, total = field.partition(b"/")
        return int(running) if running.isdigit() and total.isdigit() else None
    except (OSError, IndexError, ValueError):
        return None


def cpu_to_spare(running: int | None) -> bool:
    """Where one delete's path costs more than COST_SHARE (:func:`slots` 0): it is admitted alone,
    and only while at most 2 tasks per CPU are runnable. A crash storm's shims and runtimes are
    many more, so on such a node a storm is left to the runtimes, as without runc-guard; unknown
    load steps aside as well."""
    return running is not None and running <= 2 * cpus()


def acquire(directory: str, count: int | None = None) -> int | None:
    """An fd holding one free slot's flock (close it to let go; close-on-exec, so no
    runtime or helper inherits it); -1 when slots cannot be used here (no writable
    directory: go on without); None when every slot is held."""
    import fcntl

    count = slots() if count is None else count
    fd = -1
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        for i in range(count):
            fd = os.open(os.path.join(directory, f"slot-{i}"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                fd = -1
                continue
            return fd
    except OSError:
        if fd >= 0:
            os.close(fd)
        return -1
    return None
