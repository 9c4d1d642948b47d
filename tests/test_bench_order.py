"""bench.common.balanced_order: every candidate follows every candidate equally often."""

import itertools
from collections import Counter

import pytest

from bench.common import balanced_order


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5])
def test_each_ordered_pair_once_per_cycle(count: int) -> None:
    names = [f"c{i}" for i in range(count)]
    order = balanced_order(names, count * 4)  # four cycles
    assert Counter(order) == dict.fromkeys(names, count * 4)
    pairs = Counter(itertools.pairwise(order))
    # every ordered pair (a candidate after itself included) 4 times, but the one that
    # closes the cycle: the last cycle is not followed by another
    assert sorted(pairs.values()) == [3] + [4] * (count * count - 1)


def test_rounds_up_to_whole_cycles() -> None:
    assert Counter(balanced_order(["a", "b", "c"], 4)) == {"a": 6, "b": 6, "c": 6}
