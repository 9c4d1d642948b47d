"""Concurrency: 50 containers deleted at once, every one with a slow teardown.

Each container is a real host-PID runc container (busybox) whose children sit in
one frozen v1 freezer cgroup (docs/background.md, the labs): after init is SIGKILLed they cannot
die until the freezer is thawed, ``--hold`` seconds after all the deletes were
launched at once (containerd's dead-shim path for a whole node's worth of OOMed
pods). We report whether every delete ended clean (exit 0, no directory left),
the total time from launch to the last exit, and what the runc-guard processes
cost: CPU (exactly: its main thread's schedstat read from the zombie, and
wait4's rusage for it plus the runtime it ran)
and memory (peak RSS of one process, and the peak over time of all live ones
together, shared file pages counted once, sampled every 20 ms). The same is
done with stock runc as the control (which leaks the held containers' cgroups),
one after the other in one run.

Run as root: ``python -m bench.concurrency [--containers 50] [--hold 1.0]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
import uuid
from typing import Any

from bench.common import PREFIX, print_table, remove_everywhere
from labkit.kernel import FREEZER, RUNC, FreezerHold, RuncContainer, wait_for
from labkit.scenario import guard_env

PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def cpu_ns(pid: int) -> int:
    """Exact CPU time of ``pid``'s main thread (schedstat; still readable while it is a zombie)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def rss_kb(pid: int) -> tuple[int, int]:
    """(resident, of which shared file-backed) KiB from /proc/<pid>/statm; (0, 0) once gone."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            fields = f.read().split()
        return int(fields[1]) * PAGE_KB, int(fields[2]) * PAGE_KB
    except (OSError, IndexError):
        return 0, 0


def start_containers(workdir: str, count: int, parent: str) -> list[RuncContainer]:
    containers: list[RuncContainer] = []
    try:
        for _ in range(count):
            containers.append(RuncContainer.start(workdir, children=2, parent=parent))
    except BaseException:
        for ctr in containers:
            ctr.destroy()
        raise
    return containers


def delete_all(binary: str, containers: list[RuncContainer], hold: FreezerHold, release_after: float,
               env: dict[str, str], workdir: str) -> dict[str, Any]:
    """Launch every delete at once, thaw the hold after ``release_after`` s, collect every exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    running: dict[int, RuncContainer] = {}
    statuses: list[int] = []
    own_cpu = child_cpu = 0.0
    peak_one = peak_sum = 0
    rss_seen: dict[int, int] = {}
    try:
        started = time.monotonic()
        for ctr in containers:
            argv = [binary, "--root", ctr.root, "--log", os.path.join(workdir, f"{ctr.id}.log.json"),
                    "--log-format", "json", "delete", "--force", ctr.id]
            pid = os.posix_spawn(binary, argv, env,
                                 file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 1),
                                               (os.POSIX_SPAWN_DUP2, devnull, 2)])
            running[pid] = ctr
        released = False
        while running:
            if not released and time.monotonic() - started >= release_after:
                hold.release()
                released = True
            private = shared = 0
            for pid in running:
                rss, file_backed = rss_kb(pid)
                rss_seen[pid] = max(rss_seen.get(pid, 0), rss)
                private += rss - file_backed
                shared = max(shared, file_backed)
            # the interpreter and libraries are the same files for all: count them once
            peak_sum = max(peak_sum, private + shared)
            while True:  # collect every zombie: read its times first (WNOWAIT), then reap
                if not running:
                    break
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                if info is None or info.si_pid not in running:
                    break
                own = cpu_ns(info.si_pid) / 1e9
                _, status, usage = os.wait4(info.si_pid, 0)
                total = usage.ru_utime + usage.ru_stime  # itself and the children it reaped
                own_cpu += own
                child_cpu += max(0.0, total - own)
                statuses.append(os.waitstatus_to_exitcode(status))
                del running[info.si_pid]
            if running:
                time.sleep(0.02)
        elapsed = time.monotonic() - started
    finally:
        os.close(devnull)
        for pid in running:  # only on error: stop what we started, by pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    peak_one = max(rss_seen.values(), default=0)
    leaked = sum(bool(ctr.cgroup_dirs()) for ctr in containers)
    return {"elapsed": elapsed, "statuses": statuses, "own_cpu": own_cpu, "child_cpu": child_cpu,
            "peak_one_kb": peak_one, "peak_sum_kb": peak_sum, "leaked": leaked}


def scenario(binary: str, count: int, release_after: float, workdir: str) -> dict[str, Any]:
    """``count`` held containers, init killed, all deleted at once through ``binary``."""
    parent = f"{PREFIX}-conc-{uuid.uuid4().hex[:8]}"
    hold_path = os.path.join(FREEZER, f"{PREFIX}-hold-{uuid.uuid4().hex[:8]}")
    os.mkdir(hold_path)
    hold = FreezerHold(hold_path)
    containers: list[RuncContainer] = []
    try:
        t = time.monotonic()
        containers = start_containers(workdir, count, parent)
        print(f"  {count} containers started in {time.monotonic() - t:.1f} s", file=sys.stderr)
        hold.hold([pid for ctr in containers for pid in ctr.children()])
        inits = [ctr.init_pid() for ctr in containers]
        for pid in inits:
            os.kill(pid, signal.SIGKILL)
        for ctr, init in zip(containers, inits, strict=True):
            wait_for(lambda c=ctr, i=init: i not in c.pids(), 10)
        env = guard_env(workdir)
        with open(env["RUNC_GUARD_CONFIG"], "w") as f:
            f.write('runtime = "runc"\n')
        return delete_all(binary, containers, hold, release_after, env, workdir)
    finally:
        hold.destroy()
        for ctr in containers:
            ctr.destroy()
        remove_everywhere(parent)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--containers", type=int, default=50)
    parser.add_argument("--hold", type=float, default=1.0, help="seconds until the teardowns can finish")
    parser.add_argument("--no-control", action="store_true", help="skip the stock runc control")
    parser.add_argument("--shim", default=os.path.join(os.path.dirname(sys.executable), "runc-guard"))
    parser.add_argument("--extra", action="append", default=[], metavar="NAME=PATH",
                        help="another runc-guard build to run the same storm with")
    args = parser.parse_args()
    candidates = [("runc-guard", args.shim)] + [(n, p) for n, _, p in (e.partition("=") for e in args.extra)]
    candidates += [] if args.no_control else [("runc (control)", RUNC)]
    rows = []
    for name, binary in candidates:
        with tempfile.TemporaryDirectory(prefix=f"{PREFIX}-") as workdir:
            r = scenario(binary, args.containers, args.hold, workdir)
        rows.append((
            name, args.containers, f"{args.containers - r['leaked']}/{args.containers}",
            f"{sum(s == 0 for s in r['statuses'])}/{args.containers}",
            r["elapsed"], r["own_cpu"], r["child_cpu"], r["own_cpu"] / args.containers * 1000,
            r["peak_one_kb"] / 1024, r["peak_sum_kb"] / 1024,
        ))
    print_table(
        f"Concurrency: {args.containers} deletes at once, teardowns held {args.hold:g} s",
        ["binary", "containers", "clean (no dir left)", "exit 0", "total s", "own CPU s (all)",
         "runtime-child / other threads CPU s (all)", "own CPU ms per delete", "peak RSS one (MiB)",
         "peak RSS all (MiB)"],
        rows,
    )
    print("\nown CPU: the main thread of each listed process (schedstat); runtime-child: the rest "
          "of wait4's total, i.e. the runc each runc-guard ran (for Go's runc itself: its other "
          "threads). Peak RSS all: the largest sum over live processes of their private pages, "
          "plus their shared file pages once (sampled every 20 ms).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
