"""Pictures of the benchmarks' samples, as PNG files that docs/ embeds.

matplotlib is a bench-only extra (``pip install '.[bench]'``) and is imported
here alone, inside each function: nothing on runc-guard's delete path, and no
other bench module, pays for it, and a bench run without ``--plot`` does not
need it. The Agg backend draws without a display.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

#: One series: (x, y) points, x usually seconds since the run started.
Series = Sequence[tuple[float, float]]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    _pyplot().close(fig)


def plot_leftovers_over_time(
    path: str, series: Mapping[str, Series], title: str, ylabel: str = "cgroup dirs left",
    xlabel: str = "seconds",
) -> None:
    """What was left over time, one line per runtime (e.g. stock runc vs runc-guard).

    The storm and the crash-loop benches call this with their samples; a step line,
    because a count holds until the next sample.
    """
    plot_panels(path, [(ylabel, series)], title, xlabel)


def plot_panels(
    path: str, panels: Sequence[tuple[str, Mapping[str, Series]]], title: str, xlabel: str = "seconds",
    marks: Mapping[str, float] | None = None,
) -> None:
    """Several step-line panels stacked on one shared x axis, each with its own legend.

    ``marks`` are moments drawn as dashed vertical lines in every panel (e.g. "loops stop").
    """
    plt = _pyplot()
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False, layout="constrained",
                             figsize=(9, 1.9 * len(panels) + 0.6))
    for ax, (ylabel, series) in zip(axes[:, 0], panels, strict=True):
        for label, points in series.items():
            if points:
                xs, ys = zip(*points, strict=True)
                ax.step(xs, ys, where="post", label=label)
        ax.set_ylabel(ylabel, fontsize=8)
        top = max((y for points in series.values() for _x, y in points), default=0)
        ax.set_ylim(0, max(1.0, top * 1.1))  # a flat zero shows as zero, not as noise
        ax.grid(alpha=0.3)
        for mark_label, x in (marks or {}).items():
            ax.axvline(x, color="grey", linestyle="--", linewidth=1)
            ax.annotate(mark_label, (x, 1), xycoords=("data", "axes fraction"), fontsize=7,
                        color="grey", xytext=(3, -10), textcoords="offset points")
        if series:
            ax.legend(fontsize=7, loc="upper left")
    axes[-1, 0].set_xlabel(xlabel)
    fig.suptitle(title, fontsize=9)
    _save(fig, path)


def plot_latency_percentiles(
    path: str, phases: Mapping[str, Sequence[float]], title: str, baseline: str = "idle",
) -> None:
    """Latency by percentile (p50 ... max), one line per phase, log scale; ``baseline`` in black.

    The sweep bench's probe: how much each way of removing leftovers delays a cgroup
    mkdir+rmdir elsewhere on the node, against the same probe on an idle node.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    marks = [50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 100.0]
    for label, samples in phases.items():
        if not samples:
            continue
        ordered = sorted(samples)
        ys = [ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] * 1000 for q in marks]
        style = {"color": "black", "linewidth": 2.5} if label.startswith(baseline) else {}
        ax.plot(range(len(marks)), ys, marker="o", label=label, **style)
    ax.set_xticks(range(len(marks)), [f"p{q:g}" if q < 100 else "max" for q in marks])
    ax.set_yscale("log")
    ax.set_ylabel("probe mkdir+rmdir, ms")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    _save(fig, path)
