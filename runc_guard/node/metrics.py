"""Prometheus metrics for node_exporter's textfile collector, without a daemon.

Exposition is prometheus-client's: custom collectors turn the saved counters,
the audit's report and the kernel's own cgroup counters (:mod:`kernelstats`)
into metric families, and its ``write_to_textfile`` replaces the file by
rename, so node_exporter never reads half of it. prometheus-client is only
imported when rendering; the delete path only appends its stats line.

The shim appends one JSON line per delete to ``Settings.stats_file`` (an
O_APPEND write: its hot path pays nothing more). Whoever renders metrics
(the audit timer every minute, or ``runc-guardctl metrics``) *folds* new lines
into a counters state file next to it, under an flock, and replaces that file
atomically. Exactly once: what was read is remembered as a byte offset per
inode *in the same file as the counters*, so a crash before the rename
re-reads the same bytes and a crash after it never sees them again. The stats
file is rotated by rename (the inode, and so its offset, stays valid; a shim
still holding the old file keeps appending to it) and the rotated file is
deleted only once fully read and quiet for RETIRE_AFTER seconds. The sweep's
counters land in the same state; the audit's gauges are rendered fresh.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runc_guard.atomic import write_atomic
from runc_guard.delete.outcomes import MEMCG_LINE, OUTCOMES
from runc_guard.node.sweep import KEEP_REASONS

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

#: Delete wait-time buckets in seconds: the default delete budget is 4 s (between the 3 and 5 s buckets).
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0)
#: Counters the sweep adds up (key in the state, help text).
SWEEP_COUNTERS = (
    ("runs", "Sweeps run (not dry runs)."),
    ("containers_removed", "Leaked containers whose cgroups the sweep removed."),
    ("dirs_removed", "Cgroup directories removed by the sweep."),
    ("errors", "Errors met by the sweep (unremovable cgroups, bad pending records)."),
    ("records_cleared", "Pending records of the shim finished by the sweep."),
    ("slowed_seconds", "Extra seconds the sweep waited because system CPU was high."),
    ("states_redriven", "Orphaned runtime states whose runtime delete --force the sweep re-ran."),
    ("records_restamped", "Records dated ahead of the clock (stepped back) the sweep re-stamped to now."),
)
ROTATE_BYTES = 1 << 20
RETIRE_AFTER = 60.0
MAX_FOLD_BYTES = 64 << 20
STATE_VERSION = 1
_LABEL_VALUE = re.compile(r"^[a-z_]{1,40}$")


def state_path(stats_file: str) -> str:
    """The counters state lives next to the stats file (``/run/runc-guard`` by default)."""
    return os.path.join(os.path.dirname(stats_file), "metrics-state.json")


def new_state() -> dict[str, Any]:
    return {
        "version": STATE_VERSION,
        "offsets": {},
        "retired": None,
        "deletes": {},
        "delete_dirs_removed": 0,
        "delete_killed": 0,
        "memcg_reclaimed_kb": 0,
        "memcg_left": 0,
        "delete_wait_buckets": [0] * (len(WAIT_BUCKETS) + 1),
        "delete_wait_sum": 0.0,
        "invalid_lines": 0,
        "sweep": {
            "runs": 0,
            "containers_removed": 0,
            "dirs_removed": 0,
            "kept": {},
            "errors": 0,
            "records_cleared": 0,
            "slowed_seconds": 0.0,
            "last_timestamp": 0.0,
            "last_duration": 0.0,
            "states_redriven": 0,
            "records_restamped": 0,
        },
    }


# -- pure folding -----------------------------------------------------------------


def apply_delete_line(state: dict[str, Any], line: bytes) -> bool:
    """Count one stats line; False (and counted as invalid) if it is not one the shim wrote."""
    try:
        doc = json.loads(line)
        outcome = doc["outcome"]
        waited = float(doc["waited_ms"]) / 1000.0
        removed = int(doc["removed"])
        killed = int(doc.get("killed", 0))
        reclaimed_kb = int(doc.get("reclaimed_kb", 0))
        memcg_left = int(doc.get("memcg_left", 0))
        if not isinstance(outcome, str) or not math.isfinite(waited) or waited < 0:
            raise ValueError(outcome)
    except (ValueError, KeyError, TypeError):
        state["invalid_lines"] += 1
        return False
    state["memcg_reclaimed_kb"] += max(0, reclaimed_kb)
    state["memcg_left"] += max(0, memcg_left)
    if doc.get("kind") == MEMCG_LINE:
        return True  # a held memcg's late reclaim (node.finisher): its memory counts, it is no delete
    if not _LABEL_VALUE.match(outcome):
        outcome = "other"
    state["deletes"][outcome] = state["deletes"].get(outcome, 0) + 1
    state["delete_dirs_removed"] += max(0, removed)
    state["delete_killed"] += max(0, killed)
    index = next((i for i, bound in enumerate(WAIT_BUCKETS) if waited <= bound), len(WAIT_BUCKETS))
    state["delete_wait_buckets"][index] += 1
    state["delete_wait_sum"] += waited
    return True


def record_sweep(state: dict[str, Any], report: Mapping[str, Any], now: float) -> None:
    """Add one finished (not dry-run) sweep's figures to the counters."""
    sweep = state["sweep"]
    sweep["runs"] += 1
    sweep["containers_removed"] += int(report["removed"])
    sweep["dirs_removed"] += int(report["dirs_removed"])
    sweep["errors"] += len(report["errors"])
    sweep["records_cleared"] += int(report["records_cleared"])
    sweep["slowed_seconds"] += float(report["slowed"])
    sweep["states_redriven"] = sweep.get("states_redriven", 0) + len(report.get("redriven", ()))
    sweep["records_restamped"] = sweep.get("records_restamped", 0) + int(report.get("records_restamped", 0))
    # What the sweep reclaimed from leaked memcgs counts with the deletes' own (one pair of counters).
    state["memcg_reclaimed_kb"] += int(report.get("memcg_reclaimed_kb", 0))
    state["memcg_left"] += int(report.get("memcg_left", 0))
    for reason, count in report["kept"].items():
        sweep["kept"][reason] = sweep["kept"].get(reason, 0) + int(count)
    sweep["last_timestamp"] = now
    sweep["last_duration"] = float(report["duration"])


# -- the stats file ---------------------------------------------------------------


def _key(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}"


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def _fold_file(state: dict[str, Any], path: str, offset: int) -> tuple[int, int]:
    """Fold complete lines after ``offset``; return (lines, new offset). A partial line waits."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(MAX_FOLD_BYTES)
    except FileNotFoundError:
        return 0, offset
    end = data.rfind(b"\n") + 1
    lines = 0
    for line in data[:end].splitlines():
        if line.strip():
            apply_delete_line(state, line)
            lines += 1
    return lines, offset + end


@dataclass
class FoldResult:
    lines: int = 0
    #: Unlink this only after the state that forgets it has been saved.
    unlink_after_save: str | None = None
    rotated: bool = False


def fold_stats(state: dict[str, Any], stats_file: str, now: float) -> FoldResult:
    """Fold new lines of ``stats_file`` (and its rotated ``.1``) into ``state``; rotate if large."""
    result = FoldResult()
    offsets: dict[str, int] = state["offsets"]
    rotated = stats_file + ".1"
    current, old = _stat(stats_file), _stat(rotated)
    if old is None:
        state["retired"] = None
    elif state.get("retired") == _key(old):
        # Retired (fully counted) last time, but we stopped before unlinking it.
        result.unlink_after_save = rotated
        old = None
    live = {_key(st) for st in (current, old) if st is not None}
    for key in [k for k in offsets if k not in live]:
        del offsets[key]  # the file is gone: its inode number may be reused
    for path, st in ((rotated, old), (stats_file, current)):
        if st is None:
            continue
        offset = offsets.get(_key(st), 0)
        if st.st_size < offset:
            offset = 0  # truncated by someone: start over
        lines, offsets[_key(st)] = _fold_file(state, path, offset)
        result.lines += lines
    if old is not None and offsets.get(_key(old)) == old.st_size and now - old.st_mtime > RETIRE_AFTER:
        state["retired"] = _key(old)
        del offsets[_key(old)]
        result.unlink_after_save = rotated
    elif old is None and current is not None and current.st_size > ROTATE_BYTES:
        os.rename(stats_file, rotated)  # same inode: its offset stays right
        result.rotated = True
    return result


# -- the state file -----------------------------------------------------------------


def _load(path: str) -> dict[str, Any]:
    state = new_state()
    try:
        with open(path, "rb") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return state
    except ValueError:
        return state  # a corrupt state restarts the counters (Prometheus handles resets)
    if isinstance(doc, dict) and doc.get("version") == STATE_VERSION:
        state.update(doc)
    return state


@contextlib.contextmanager
def locked_state(path: str) -> Iterator[dict[str, Any]]:
    """Load the counters under an exclusive flock and save them atomically on success."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = _load(path)
        yield state
        write_atomic(path, json.dumps(state, sort_keys=True).encode(), 0o600)
    finally:
        os.close(lock)


def fold(stats_file: str, state_file: str, now: float) -> FoldResult:
    """Fold the shim's new stats lines into the saved counters (exactly once)."""
    with locked_state(state_file) as state:
        result = fold_stats(state, stats_file, now)
    if result.unlink_after_save is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(result.unlink_after_save)
    return result


def add_sweep(state_file: str, report: Mapping[str, Any], now: float) -> None:
    with locked_state(state_file) as state:
        record_sweep(state, report, now)


def load_state(state_file: str) -> dict[str, Any]:
    return _load(state_file)


# -- exposition (prometheus-client) ----------------------------------------------------


def _counted_by(name: str, doc: str, label: str, known: Iterable[str], counts: Mapping[str, int]) -> Any:
    """A counter with one series per ``label`` value: each known value from 0 (an alert's series
    exists before its first count), then any other the state counted."""
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(name, doc, labels=[label])
    for value, count in sorted((dict.fromkeys(known, 0) | dict(counts)).items()):
        family.add_metric([value], count)
    return family


class CountersCollector:
    """The folded delete and sweep counters of one saved state, as metric families."""

    def __init__(self, state: Mapping[str, Any]) -> None:
        self.state = state

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        state = self.state
        yield _counted_by("runc_guard_deletes", "Interposed deletes by outcome.", "outcome", OUTCOMES,
                          state["deletes"])
        yield CounterMetricFamily(
            "runc_guard_delete_dirs_removed",
            "Cgroup directories removed by interposed deletes.",
            value=state["delete_dirs_removed"],
        )
        yield CounterMetricFamily(
            "runc_guard_delete_stragglers_killed",
            "Processes SIGKILLed by deletes because they were still in the container's cgroups.",
            value=state["delete_killed"],
        )
        yield CounterMetricFamily(
            "runc_guard_memcg_reclaimed_bytes",
            "Page cache reclaimed from deleted containers' empty memory cgroups before their rmdir.",
            value=state["memcg_reclaimed_kb"] * 1024,
        )
        yield CounterMetricFamily(
            "runc_guard_memcg_left_charged",
            "Memory cgroups removed with pages still charged (the kernel keeps them dying until reclaimed).",
            value=state["memcg_left"],
        )
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip((*WAIT_BUCKETS, math.inf), state["delete_wait_buckets"], strict=True):
            cumulative += count
            buckets.append(("+Inf" if math.isinf(bound) else repr(bound), cumulative))
        yield HistogramMetricFamily(
            "runc_guard_delete_wait_seconds",
            "Time deletes waited for the container's cgroups to empty and go.",
            buckets=buckets,
            sum_value=round(state["delete_wait_sum"], 6),
        )
        yield CounterMetricFamily(
            "runc_guard_stats_invalid_lines",
            "Lines of the shim's stats file that were not valid delete records.",
            value=state["invalid_lines"],
        )
        sweep = state["sweep"]
        for key, help_text in SWEEP_COUNTERS:
            yield CounterMetricFamily(f"runc_guard_sweep_{key}", help_text, value=sweep.get(key, 0))
        yield _counted_by("runc_guard_sweep_kept", "Container cgroups the sweep left in place, by reason.",
                          "reason", KEEP_REASONS, sweep["kept"])
        yield GaugeMetricFamily(
            "runc_guard_sweep_last_run_timestamp_seconds",
            "When the last sweep finished (0: never).",
            value=sweep["last_timestamp"],
        )
        yield GaugeMetricFamily(
            "runc_guard_sweep_last_duration_seconds",
            "How long the last sweep took.",
            value=sweep["last_duration"],
        )


@dataclass(frozen=True)
class Family:
    """One gauge family with its samples (label values -> value); rendered by :class:`GaugesCollector`."""

    name: str
    help: str
    samples: tuple[tuple[tuple[tuple[str, str], ...], float], ...]

    @classmethod
    def one(cls, metric: str, help_text: str, value: float, /, **labels: str) -> Family:
        return cls(metric, help_text, ((tuple(labels.items()), float(value)),))


class GaugesCollector:
    """Gauges computed fresh on every run (audit, kernel, settings), never stored."""

    def __init__(self, families: Iterable[Family]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        for family in self.families:
            label_names = [k for k, _ in family.samples[0][0]] if family.samples else []
            gauge = GaugeMetricFamily(family.name, family.help, labels=label_names)
            for labels, value in family.samples:
                gauge.add_metric([v for _, v in labels], value)
            yield gauge


def registry_of(collectors: Iterable[Collector]) -> Any:
    """A fresh registry (never the process-global one) holding ``collectors``."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return registry


def render(state: Mapping[str, Any], families: Iterable[Family] = ()) -> str:
    """The text exposition of the counters in ``state`` plus fresh gauge ``families``."""
    from prometheus_client import generate_latest

    registry = registry_of([CountersCollector(state), GaugesCollector(families)])
    return bytes(generate_latest(registry)).decode()


def write_textfile(path: str, state: Mapping[str, Any], families: Iterable[Family] = ()) -> None:
    """node_exporter reads ``*.prom``: prometheus-client writes a temp file and renames it over ``path``."""
    from prometheus_client import write_to_textfile

    if path == "-":
        raise ValueError("write_textfile needs a path")
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    write_to_textfile(path, registry_of([CountersCollector(state), GaugesCollector(families)]))


def export(stats_file: str, families: Iterable[Family], now: float, output: str | None) -> str:
    """Fold the shim's new lines, render everything, and write ``output`` atomically (if given)."""
    state_file = state_path(stats_file)
    fold(stats_file, state_file, now)
    state = load_state(state_file)
    families = list(families)
    if output is not None:
        write_textfile(output, state, families)
    return render(state, families)
