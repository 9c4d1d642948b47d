"""Start-up slots: a crash storm's deletes load the delete path a few at a time (stdlib only).

Starting a delete costs ~20 ms of CPU (an interpreter, then ~6 ms of imports;
100-150 ms before it stopped importing structlog, json and re ahead of its
reply). When a node's pods
die together (dozens of dead-shim cleanups at once, each under containerd's 5 s
budget), all of them loading at once on a small node share the CPU so evenly
that none finishes in time: on 2 cores, 49 of 50 simultaneous deletes ran out of
their deadline (docs/storm.md); with these slots, 1 leaked (stock runc: 24).

So only ``2 x CPUs`` deletes load at once: each holds an flock on one slot file
while it imports and lets go once loaded (the waiting for cgroups that follows
costs no CPU). The others sleep until a slot frees up, for at most MAX_WAIT:
past that the node is overloaded and runc-guard steps aside, exec'ing the
runtime exactly as it would have run alone (never more harm than the runtime;
the sweep finishes what it leaks). Waiting until the deadline instead made
every dead-shim cleanup of a storm take ~4 s. One delete at a time, the common
case, takes its slot with one open and one flock.

The launcher (launcher/admit.c) applies this same rule in C before any
interpreter starts, and hands the slot it took to the Python entry; these
constants are restated there (tests/test_launcher_admit.py compares them).
"""

from __future__ import annotations

import os
import time

#: How often a delete waiting for a slot looks again: each look tries every slot
#: (open + flock), and in a storm hundreds of deletes look at once.
POLL = 0.05
#: Longest wait for a slot before stepping aside (seconds): a quarter of the
#: default deadline, so a delete that got a slot late still has time to finish.
MAX_WAIT = 1.0
#: No slot wait goes past this share of the deadline, counted from containerd's start of the
#: budget: a delete that steps aside later leaves the runtime alone too little of containerd's
#: 5 s. In a 200-crash storm on 2 busy cores, 100 deletes that stepped aside 1.7-3.8 s into
#: the budget were all SIGKILLed at 5 s with their runtime still running, and containerd never
#: finished those tasks (docs/storm.md).
WAIT_SHARE = 0.5
#: Less than this share of the deadline left when a delete starts (its shim waited for
#: a CPU that long; 1 s of the default 4): step aside at once. Killed by containerd at
#: 5 s, a shim's delete leaves the task behind for good; the runtime alone is faster.
MIN_BUDGET_SHARE = 0.25


def reply_margin(timeout: float, finishing: bool, lag: float, left: float) -> float:
    """How much earlier than ``timeout`` a delete replies when a finisher completes the rest.

    ``lag``: how long containerd's budget ran before the delete could begin (the
    shim's start, the interpreter, a start-up slot); the work containerd's shim
    still does after the reply waits for a CPU that long too, so half of it moves
    the reply earlier. ``left``: what is left of the un-margined budget. The
    margin never leaves the runtime less than MIN_BUDGET_SHARE of ``timeout``
    (nor moves the reply by more than half of it): a margin that ate the runtime's
    share spawned it and stopped it at once (exit 75, issue 30 case 3).
    """
    if not finishing or lag <= 0:
        return 0.0
    room = left - timeout * MIN_BUDGET_SHARE
    return max(0.0, min(lag / 2, timeout / 2, room))


def delete_deadline(origin: float, now: float, timeout: float, finishing: bool) -> tuple[float, float]:
    """(deadline, margin) of a delete whose budget started at ``origin`` (time.monotonic).

    The one rule for both the start-up admission (step aside when less than
    MIN_BUDGET_SHARE is left *of this deadline*) and the delete itself, so the two
    never disagree about how much time the runtime has.
    """
    margin = reply_margin(timeout, finishing, now - origin, origin + timeout - now)
    return origin + timeout - margin, margin


def slots() -> int:
    """Deletes allowed to load at once: two per CPU this process may run on."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except OSError:
        cpus = os.cpu_count() or 1
    return max(2, 2 * cpus)


def acquire(directory: str, deadline: float, count: int | None = None) -> int | None:
    """An fd holding one slot's flock (close it to let go); -1 when slots cannot be used
    here (no writable directory: go on without); None when ``deadline`` (time.monotonic)
    passed first."""
    import fcntl

    count = slots() if count is None else count
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fds = [
            os.open(os.path.join(directory, f"slot-{i}"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            for i in range(count)
        ]
    except OSError:
        return -1
    try:
        while True:
            for fd in fds:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                fds.remove(fd)
                return fd
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL)
    finally:
        for fd in fds:
            os.close(fd)
