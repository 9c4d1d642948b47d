"""Run every benchmark in sequence (``make bench``); ``--quick`` for a smaller run (< 3 min).

Each benchmark runs as its own interpreter, one after the other (never two at
once: they would disturb each other's timings), and prints its markdown tables;
``--output FILE`` also collects them in one file for docs/benchmarks.md. A benchmark
that fails is reported and the others still run; the exit status is non-zero
if any failed. Nothing here asserts a timing: the tables are the result.
Run as root from the repository root: ``python -m bench.run_all [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

#: (module, arguments for the full run, arguments for --quick)
BENCHMARKS: list[tuple[str, list[str], list[str]]] = [
    ("passthrough", ["--rounds", "60"], ["--rounds", "15"]),
    ("launcher", ["--rounds", "150"], ["--rounds", "15"]),
    ("delete_clean", ["--rounds", "30"], ["--rounds", "8", "--import-rounds", "20"]),
    ("wakeup", ["--runs", "100"], ["--runs", "20", "--long-runs", "2", "--long", "1"]),
    ("concurrency", ["--containers", "50"], ["--containers", "10"]),
    ("sweep_gentleness", ["--idle", "5"], ["--containers", "1000", "--idle", "3"]),
    ("kubelet_walk", [], ["--children", "0,1000"]),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller runs, under 3 minutes")
    parser.add_argument("--only", default="", help="comma-separated benchmark names")
    parser.add_argument("--output", help="also write every table to this markdown file")
    parser.add_argument("--shim", action="append", default=[], metavar="NAME=PATH[@PYTHON]",
                        help="another runc-guard build for the passthrough and delete benchmarks "
                             "(e.g. an extracted .deb or a single-file build outside dist/)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("the benchmarks create cgroups and containers: run them as root", file=sys.stderr)
        return 77
    wanted = set(args.only.split(",")) if args.only else None
    collected: list[str] = []
    failed: list[str] = []
    started = time.monotonic()
    for name, full, quick in BENCHMARKS:
        if wanted is not None and name not in wanted:
            continue
        argv = [sys.executable, "-m", f"bench.{name}", *(quick if args.quick else full)]
        for shim in args.shim:
            if name == "passthrough":
                argv += ["--extra-shim", shim]
            elif name == "delete_clean":
                argv += ["--extra", shim.partition("@")[0]]
        print(f"\n## {name}: {' '.join(argv[1:])}", flush=True)
        t = time.monotonic()
        proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
        sys.stdout.write(proc.stdout)
        print(f"\n({name}: {time.monotonic() - t:.0f} s, exit {proc.returncode})", flush=True)
        collected.append(f"## {name}\n\n`python -m bench.{name} {' '.join(argv[3:])}`\n{proc.stdout}")
        if proc.returncode != 0:
            failed.append(name)
    if args.output:
        with open(args.output, "w") as f:
            f.write("\n".join(collected))
    print(f"\nall benchmarks: {time.monotonic() - started:.0f} s; failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
