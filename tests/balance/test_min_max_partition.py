"""The balancer is exact: it matches brute force on hundreds of random cost vectors."""

from __future__ import annotations

import itertools
import random

import pytest

from pipecompile.balance.min_max_partition import bottleneck, min_max_partition


def _brute_force(costs: list[int], parts: int) -> int:
    return min(
        bottleneck(costs, [0, *cuts])
        for cuts in itertools.combinations(range(1, len(costs)), parts - 1)
    )


@pytest.mark.parametrize("seed", range(6))
def test_matches_brute_force_on_random_vectors(seed):
    rng = random.Random(seed)
    for case in range(100):
        n = rng.randint(1, 12)
        parts = rng.randint(1, n)
        style = case % 4
        if style == 0:
            costs = [rng.randint(0, 10) for _ in range(n)]
        elif style == 1:
            costs = [rng.randint(0, 10**9) for _ in range(n)]
        elif style == 2:
            costs = [rng.choice([0, 0, 1, 100]) for _ in range(n)]  # many ties and zeros
        else:
            costs = sorted(rng.randint(1, 1000) for _ in range(n))  # skewed
        starts = min_max_partition(costs, parts)
        assert len(starts) == parts and starts[0] == 0 and starts == sorted(set(starts))
        assert starts[-1] < n  # every part non-empty
        assert bottleneck(costs, starts) == _brute_force(costs, parts), (costs, parts, starts)


def test_example_from_docstring():
    assert min_max_partition([5, 1, 1, 1, 5, 1], 3) == [0, 2, 4]


def test_large_input_is_exact_on_a_known_optimum():
    costs = [7] * 20_000
    starts = min_max_partition(costs, 8)
    assert bottleneck(costs, starts) == 7 * 2500


@pytest.mark.parametrize("costs, parts", [([1, 2], 3), ([1], 0), ([-1, 2], 1)])
def test_rejects_impossible_requests(costs, parts):
    with pytest.raises(ValueError):
        min_max_partition(costs, parts)
