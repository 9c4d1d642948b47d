"""Stall a program in one syscall with strace (``-e inject=all:delay_enter=USEC:when=1``).

A deterministic window inside a program's start-up (an import, a stat), where a timed
signal or install would race the machine's load. Used by the safety and packaging tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

from labkit.kernel import wait_for

STRACE = "/usr/bin/strace"


@contextlib.contextmanager
def traced(argv: list[str], **popen: Any) -> Iterator[subprocess.Popen[str]]:
    """Start ``argv`` (an strace command line) in a session of its own; on the way out, SIGKILL
    what is left in it: strace, the tracee and its children, and strace's start-up probes,
    which a SIGKILLed strace would leave stopped forever."""
    proc: subprocess.Popen[str] = subprocess.Popen(argv, start_new_session=True, text=True, **popen)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def tracee(strace_pid: int, program: str, timeout: float = 10.0) -> int:
    """The child of strace that exec'd ``program``: its tracee.

    Not merely its first child: strace forks probe children at start-up (its PTRACE_SEIZE and
    PTRACE_GET_SYSCALL_INFO checks) that sit in pause() until killed, and on a loaded machine
    the tracee's fork is seen while a probe lives (seen in CI). A probe never execs: its
    cmdline is strace's own, which names ``program`` too, so the test is the exec itself.
    """
    found: list[int] = []

    def look() -> bool:
        for tid in os.listdir(f"/proc/{strace_pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{strace_pid}/task/{tid}/children") as f:
                for pid in map(int, f.read().split()):
                    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as g:
                        argv = g.read().split(b"\0")
                        if argv[0] != STRACE.encode() and program.encode() in argv:
                            found.append(pid)
        return bool(found)

    assert wait_for(look, timeout), f"strace (pid {strace_pid}) never ran {program}"
    return found[0]


def held_in_a_syscall(pid: int, timeout: float = 20.0) -> bool:
    """True once ``pid`` sits in one syscall entry for 150 ms: strace's injected delay, not the
    brief stops strace makes at every syscall. (``/proc/<pid>/syscall``: number and arguments;
    state ``t``: stopped by its tracer.)"""
    end = time.monotonic() + timeout
    last, since = "", time.monotonic()
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/syscall") as f:
                call = f.read().strip()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        now = f"{state} {call}"
        if now != last or state != "t" or call in ("running", "") or call.startswith("-1"):
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 0.15:
            return True
        time.sleep(0.01)
    return False
