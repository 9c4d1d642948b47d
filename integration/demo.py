"""``make demo``: the incident's leak with stock runc, and none with runc-guard, in a minute.

Starts a private containerd (and a private journald when the machine has one),
then runs the same short crash storm twice: host-PID tasks whose init and shim
are SIGKILLed while some children take 0.3-3 s to die (Path B, docs/background.md, the failure),
first through stock runc, then through runc-guard. Prints what each left behind
and runc-guard's journal entries for one container, then removes everything it
created.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import subprocess
import sys
import tempfile

from labkit import containerd as cl
from labkit.journald import Journald, private_journald
from labkit.journald import available as journald_available
from labkit.kernel import FREEZER, wait_reported


def _progress(label: str, i: int, total: int, crash: cl.CrashResult) -> None:
    print(
        f"  {label:<11} cycle {i:>2}/{total}: children die {crash.delay:.1f} s after the"
        f" shim; {len(crash.left)} cgroup dirs left",
        flush=True,
    )


def _runc_label() -> str:
    """``runc 1.1.5``: the stock runtime's own version line."""
    out = subprocess.run([cl.STOCK_RUNC, "--version"], capture_output=True, text=True,
                         check=False, timeout=10).stdout
    words = out.split()
    if len(words) > 2 and words[:2] == ["runc", "version"]:
        return "runc " + words[2].split("+")[0]  # Debian: 1.1.5+ds1
    return "runc"


def _ms(values: list[int]) -> str:
    return f"{int(statistics.median(values))} ms" if values else "-"


def table(results: list[cl.StormResult]) -> str:
    header = ("runtime", "cycles", "cgroup dirs leaked", "containers leaking", "wait p50",
              "wait max")
    rows = [header]
    for r in results:
        rows.append((
            r.runtime, str(r.cycles), str(r.leaked_dirs), str(r.leaking_containers),
            _ms(r.waited_ms), f"{max(r.waited_ms)} ms" if r.waited_ms else "- (no wait)",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def journal_lines(journald_namespace: str, container_id: str) -> str:
    """The container's entries as ``journalctl`` prints them, then the canonical entry's fields."""
    short = subprocess.run(
        ["journalctl", f"--namespace={journald_namespace}", "--no-pager", "-o", "short-iso",
         f"CONTAINER_ID={container_id}"],
        capture_output=True, text=True, check=False, timeout=30,
    ).stdout
    out = subprocess.run(
        ["journalctl", f"--namespace={journald_namespace}", "--no-pager", "-o", "verbose",
         f"CONTAINER_ID={container_id}"],
        capture_output=True, text=True, check=False, timeout=30,
    ).stdout
    keep = ("OUTCOME=", "WAITED_MS=", "REMOVED=", "EXIT_STATUS=", "FORCE=", "TOTAL_MS=",
            "STRAGGLERS_KILLED=", "PRIORITY=")
    lines = [line.strip() for line in out.splitlines()]
    picked = [line for line in lines if line.startswith(keep)]
    shown = [line for line in short.splitlines() if not line.startswith("--")]
    return "\n".join("    " + line for line in [*shown, *("  " + p for p in picked)])


def run(cycles: int, seed: int) -> int:
    if os.geteuid() != 0:
        print("make demo needs root (cgroups, containerd)", file=sys.stderr)
        return 1
    if not os.path.isdir(FREEZER):
        print(f"make demo needs the cgroup v1 freezer at {FREEZER}", file=sys.stderr)
        return 1
    binary = cl.guard_binary()
    rng = random.Random(seed)
    delays = [round(rng.uniform(0.3, 3.0), 2) for _ in range(cycles)]
    with tempfile.TemporaryDirectory(prefix="rgctd-demo-") as workdir, \
            _maybe_journald() as jd:
        extra = {"RUNC_GUARD_JOURNAL_SOCKET": jd.socket} if jd is not None else {}
        settings = cl.guard_settings(workdir, **extra)
        print(f"private containerd in {workdir}; journald: "
              f"{'namespace ' + jd.namespace if jd else 'not available (JSON lines file)'}")
        print(f"{cycles} Path B crash cycles per runtime (init and shim SIGKILLed, "
              f"2 of 3 children dying 0.3-3 s later)\n", flush=True)
        with cl.running_containerd(workdir, settings) as lab, cl.namespace(lab, "rgctd-demo") as ns:
            stock = cl.crash_storm(lab, ns, cl.STOCK_RUNC, _runc_label(), delays, _progress)
            guard = cl.crash_storm(lab, ns, binary, "runc-guard", delays, _progress)
            stats = cl.delete_stats(settings, set(guard.task_ids))
            guard.waited_ms = [int(str(s["waited_ms"])) for s in stats]
            outcomes = sorted({str(s["outcome"]) for s in stats})
            print("\n" + table([stock, guard]))
            print(f"\nrunc-guard outcomes: {', '.join(outcomes)}; pending records left: "
                  f"{len(cl.pending_records(settings))}")
            one = stock.task_ids[-1]
            print(f"\ncontainerd's log for stock-runc container {one} (all there is):")
            for line in lab.log_lines_for(one):
                if "shim disconnected" in line or "level=error" in line or "failed" in line:
                    print("    " + line)
            one = guard.task_ids[-1]
            wait_reported(settings["RUNC_GUARD_CACHE_DIR"])  # entries are sent after the delete returns
            if jd is not None:
                print(f"\njournalctl --namespace={jd.namespace} CONTAINER_ID={one}:")
                print(journal_lines(jd.namespace, one))
            else:
                print(f"\nrunc-guard's entry for {one} ({settings['RUNC_GUARD_LOG_FILE']}):")
                with open(settings["RUNC_GUARD_LOG_FILE"]) as f:
                    print("".join("    " + line for line in f if one in line))
    leaked = guard.leaked_dirs
    print("\ncleaned up: containerd, journald, tasks, cgroups and temp files removed")
    return 0 if leaked == 0 and stock.leaked_dirs > 0 else 1


def _maybe_journald() -> contextlib.AbstractContextManager[Journald | None]:
    """A private journald if this machine has one; otherwise entries go to the JSON-lines file."""
    if not journald_available():
        return contextlib.nullcontext()
    return private_journald("rgctd-demo")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    return run(args.cycles, args.seed)


if __name__ == "__main__":
    sys.exit(main())
