"""Shared benchmark helpers: interleaved timing of whole commands and a table printer.

These machines are noisy, so every benchmark runs its candidates round-robin in
one process (each round runs every candidate once, in rotating order) and
reports medians and ratios measured side by side, never one absolute time.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Sequence


def spawn_time(argv: Sequence[str], env: dict[str, str] | None = None) -> float:
    """Wall time of one run of ``argv`` (posix_spawn + waitpid), stdout/stderr to /dev/null."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        actions = [
            (os.POSIX_SPAWN_DUP2, devnull, 1),
            (os.POSIX_SPAWN_DUP2, devnull, 2),
        ]
        start = time.perf_counter()
        pid = os.posix_spawn(argv[0], list(argv), env if env is not None else dict(os.environ),
                             file_actions=actions)
        _, status = os.waitpid(pid, 0)
        elapsed = time.perf_counter() - start
    finally:
        os.close(devnull)
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise RuntimeError(f"{argv} exited with {os.waitstatus_to_exitcode(status)}")
    return elapsed


def interleaved(candidates: dict[str, Sequence[str]], rounds: int,
                env: dict[str, str] | None = None) -> dict[str, list[float]]:
    """Run every candidate once per round, rotating the order; return all samples."""
    names = list(candidates)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for name in names:  # warm caches (page cache, settings cache, bytecode)
        for _ in range(3):
            spawn_time(candidates[name], env)
    for i in range(rounds):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            samples[name].append(spawn_time(candidates[name], env))
    return samples


def median_ms(values: Sequence[float]) -> float:
    return statistics.median(values) * 1000


def percentile_ms(values: Sequence[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))] * 1000


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A GitHub-markdown table, so it can be pasted into the README as printed."""
    out = sys.stdout
    out.write(f"\n### {title}\n\n")
    out.write("| " + " | ".join(headers) + " |\n")
    out.write("|" + "|".join("---" for _ in headers) + "|\n")
    for row in rows:
        out.write("| " + " | ".join(f"{c:.2f}" if isinstance(c, float) else str(c) for c in row) + " |\n")
    out.flush()
