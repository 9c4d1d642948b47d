"""A CRI sandbox's reply on Path B while a sibling's children are still dying (issue 30 case 1).

Per round (labkit.scenario.pod_teardown, real runc 1.1.5, host cgroups): a sandbox
and one sibling (CRI annotations, host PID), both inits SIGKILLed, the sibling's 5
children held 5 s in a frozen v1 freezer; ``delete --force <sandbox>`` is timed as
containerd's dead-shim cleanup runs it (its budget: 5 s). Fronts, interleaved:
stock runc; runc-guard with the finisher on (``finish_window = 40``); and, with
``--before PATH``, another runc-guard build (e.g. main before this change). After
each round, ``--settle`` s after the kill: the sibling's dirs and state.

Run as root: ``python -m bench.sandbox_reply [--rounds 5] [--settle 30] [--before PATH]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

from bench.common import median_ms, print_table
from labkit.kernel import RUNC
from labkit.scenario import guard_env, pod_teardown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--settle", type=float, default=30.0)
    parser.add_argument("--before", help="another runc-guard front to compare (its finisher on too)")
    args = parser.parse_args()
    guard = os.path.join(os.path.dirname(sys.executable), "runc-guard")
    fronts = {"stock runc 1.1.5": RUNC, "runc-guard": guard}
    if args.before:
        fronts["runc-guard --before"] = args.before
    results: dict[str, list[dict[str, object]]] = {name: [] for name in fronts}
    for _ in range(args.rounds):
        for name, front in fronts.items():
            workdir = tempfile.mkdtemp(prefix="rgbench-sandbox-")
            try:
                env = dict(os.environ) if front == RUNC else guard_env(
                    workdir, RUNC_GUARD_RUNTIME=RUNC, RUNC_GUARD_FINISH_WINDOW="40")
                results[name].append(pod_teardown(front, workdir, env, args.settle, prefix="rgbench"))
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
    rows = []
    for name, runs in results.items():
        replies = [float(r["reply_s"]) for r in runs]  # type: ignore[arg-type]
        statuses = sorted({int(r["status"]) for r in runs})  # type: ignore[call-overload]
        left = sum(1 for r in runs if r["sibling_dirs"] or r["sibling_state"])
        each = " ".join(f"{r * 1000:.0f}" for r in replies)
        rows.append([name, f"{median_ms(replies):.0f}", each, statuses, f"{left}/{len(runs)}"])
    print_table(f"sandbox delete --force, sibling's children held 5 s, {args.rounds} rounds",
                ["front", "reply p50 ms", "each round ms", "exit", f"sibling left {args.settle:g} s after"],
                rows)


if __name__ == "__main__":
    main()
