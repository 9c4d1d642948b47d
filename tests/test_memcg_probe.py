"""node.memcg_probe: how a probe memcg's parent tells a kernel that reparents from one that pins."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runc_guard.delete import reclaim
from runc_guard.node import memcg_probe

MIB = 1 << 20


def test_v1_reparented_pages_show_in_the_parents_own_cache() -> None:
    """v1: the parent's own ``cache`` holds them once moved (7.x); a pinned child keeps them in its
    own, counted in the parent's ``total_cache`` only; gone from both (proactive reclaim): unknown."""
    assert memcg_probe.decide_v1(own_cache=MIB, total_cache=MIB, charged=MIB) is True
    assert memcg_probe.decide_v1(own_cache=0, total_cache=MIB, charged=MIB) is False
    assert memcg_probe.decide_v1(own_cache=0, total_cache=0, charged=MIB) is None


def test_v2_a_dying_child_is_a_pinning_kernel() -> None:
    """v2: a dying descendant after the rmdir pins; none, with the pages still charged to the parent,
    reparents; none and the pages gone says nothing."""
    assert memcg_probe.decide_v2(nr_dying=1, current=MIB, charged=MIB) is False
    assert memcg_probe.decide_v2(nr_dying=0, current=MIB, charged=MIB) is True
    assert memcg_probe.decide_v2(nr_dying=0, current=0, charged=MIB) is None


def test_the_answer_is_cached_once_per_kernel_and_unknown_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A definite answer is cached for this kernel release (the deletes read it: delete.reclaim); an
    unknown one is not, so the next start-up probes again; a cached one is not probed again."""
    answers = [(None, "cannot tell"), (False, "stayed dying")]
    calls: list[object] = []

    def probe(mounts: object, *a: object, **kw: object) -> tuple[bool | None, str]:
        calls.append(mounts)
        return answers.pop(0)

    monkeypatch.setattr(memcg_probe, "probe", probe)
    cache = str(tmp_path / "cache")
    assert memcg_probe.ensure_probed(cache, {})[0] is None
    assert not os.path.exists(os.path.join(cache, reclaim.PROBE_FILE))
    assert memcg_probe.ensure_probed(cache, {})[0] is False
    assert reclaim.kernel_reparents(os.path.join(cache, reclaim.PROBE_FILE)) is False
    assert memcg_probe.ensure_probed(cache, {}) == (False, f"cached in {cache}/{reclaim.PROBE_FILE}")
    assert len(calls) == 2


def test_each_answer_says_what_runc_guard_does() -> None:
    assert "reclaims nothing" in memcg_probe.describe(True)
    assert "reclaims its cold page cache" in memcg_probe.describe(False)
    assert "reclaims as on a kernel that keeps it dying" in memcg_probe.describe(None)
