"""A fast crash loop through the CRI (issue 23): kubelet restarting a crashing container every second.

KEP-5593 lets kubelet restart a crashing container after 1 s: one OOM-looping pod is
then a delete per second. ``bench.crashloop`` plays kubelet at that floor against the
CRI lab's default containerd (Debian's 1.6.20 + runc 1.1.5), for a stock and a
runc-guard handler at once with the same seeded teardowns (each container's last
processes die 0.3-3 s after its init, from a freezer hold). The full-size figures
(10 pods, 10 minutes, containerd 2.2.2 + runc 1.3.4 too, measured with crictl before it
left the project) are in docs/crashloop.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from bench import crashloop
from labkit import containerd as cl
from labkit import cri as cr
from runc_guard.settings import Settings

pytestmark = pytest.mark.kernel

#: Pods per handler, and how long they loop: ~8 restarts per pod at 2-5 s per cycle.
PODS, SECONDS = 2, 30.0
#: Counted again this long after the last attempt was removed (no sweep).
SETTLE = 5.0
#: runc-guard's helpers alive at once in a sample: one reporter, at times a second one
#: starting as the first lingers out, and a finisher; more means one is spawned per delete.
MAX_HELPERS = 4


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cr.CriLab]:
    # The node's reporter linger (the labs' 0 would start a reporter per delete).
    linger = str(Settings().reporter_linger)
    with cr.lab_for(cl.CONTAINERD_16, tmp_path_factory, RUNC_GUARD_REPORTER_LINGER=linger) as lab:
        yield lab


def test_crash_loop(
    lab: cr.CriLab, summary: list[str], record_property: Callable[[str, object], None]
) -> None:
    """Two pods per handler restarted every second for 30 s: stock runc 1.1.5 leaks cgroups,
    runc-guard leaves no dirs, states or records, and its background processes stay few."""
    result = crashloop.crash_loops(lab, PODS, SECONDS, seed=23, settle=SETTLE, interval=1.0)
    restarts = {h: sum(loop.restarts for loop in loops) for h, loops in result.loops.items()}
    helpers = [s["helpers"]["reporter"][0] + s["helpers"]["finisher"][0] for s in result.samples]
    figure = (
        f"crash loop cri 1.6 {PODS} pods x {SECONDS:g} s: restarts {restarts}; "
        f"left at the end {result.at_end[cr.STOCK_HANDLER]} (stock) {result.at_end[cr.GUARD_HANDLER]} "
        f"(runc-guard); helpers alive max {max(helpers)}; "
        f"runc-guard outcomes {sorted({str(s.get('outcome')) for s in result.stats})}"
    )
    summary.append(figure)
    record_property("figure", figure)
    errors = [e for loops in result.loops.values() for loop in loops for e in loop.errors]
    detail = f"{figure} errors={errors[:5]} samples={result.samples[-3:]}"
    # A removal that fails is runc-guard's business; an attempt that failed to start under a
    # loaded CI machine (runc's "procReady not received", seen once in ~7500 starts) is not:
    # kubelet retries it, and so does the loop.
    assert not [e for e in errors if e.startswith("rm ")], detail
    for handler in (cr.STOCK_HANDLER, cr.GUARD_HANDLER):
        assert restarts[handler] >= 2 * PODS, detail
        assert sum(loop.stuck for loop in result.loops[handler]) == 0, detail
    # The control: runc 1.1.5's delete exits 0 while the held processes still pin the cgroups.
    assert result.at_end[cr.STOCK_HANDLER]["dirs"] > 0, detail
    assert result.settled[cr.STOCK_HANDLER]["dirs"] > 0, detail
    nothing = {"dirs": 0, "containers": 0, "states": 0, "records": 0}
    for when in (result.at_end, result.settled):
        assert {k: when[cr.GUARD_HANDLER][k] for k in nothing} == nothing, detail
    assert len(result.stats) >= restarts[cr.GUARD_HANDLER], detail  # every delete went through it
    assert max(helpers) <= MAX_HELPERS, detail
    assert result.settled["spool"][0] == 0 and result.settled["pending"][0] == 0, detail
