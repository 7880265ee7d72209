"""The search's lower bounds hold against brute force and the simulator: a bound above a
plan's simulated step would skip a plan that belongs among the best."""

from __future__ import annotations

import itertools
import random

import pytest

from pipecompile.ir.programs.simulate import Costs, simulate
from pipecompile.ir.programs.topology import Topology
from pipecompile.planner.bounds import fill_and_drain, least_forwards, replica_counts, within
from pipecompile.schedules import compute_program


def _brute_least(total: float, bottleneck: float, stages: int, workers: int, m: int) -> float:
    """min over every replica vector (each 1..m, summing to at most ``workers``) and every
    work split (by the greedy fill, exact for a fixed vector) of sum w_j / r_j."""
    best = float("inf")
    for counts in itertools.product(range(1, m + 1), repeat=stages):
        if sum(counts) <= workers:
            best = min(best, least_forwards(total, bottleneck, sorted(counts, reverse=True)))
    return best


@pytest.mark.parametrize("seed", range(3))
def test_concentrated_replicas_give_the_least_forward_path(seed) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    for _ in range(40):
        stages = rng.randint(1, 4)
        workers = rng.randint(stages, stages + 5)
        m = rng.randint(1, 6)
        total = rng.uniform(1, 100)
        bottleneck = rng.uniform(total / workers, total)
        counts = replica_counts(stages, workers, m)
        assert sum(counts) <= workers and all(1 <= r <= m for r in counts)
        got = least_forwards(total, bottleneck, counts)
        assert got == pytest.approx(_brute_least(total, bottleneck, stages, workers, m))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb1p", "zb2p"])
def test_fill_and_drain_never_exceeds_the_simulated_makespan(schedule) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(schedule)
    for _ in range(25):
        stages, m = rng.randint(1, 6), rng.randint(1, 9)
        program = compute_program(schedule, stages, m)
        forward = tuple(rng.uniform(0.1, 3) for _ in range(stages))
        costs = Costs(
            forward,
            tuple(f * rng.uniform(1.5, 2.5) for f in forward),
            rng.uniform(0, 0.5),
            tuple(rng.uniform(0, 0.3) for _ in range(stages)),
        )
        makespan = simulate(program, Topology.chain(stages), costs).makespan
        bound = fill_and_drain(costs, m, schedule in ("gpipe", "1f1b"))
        assert bound <= makespan * (1 + 1e-9), (stages, m)
        assert bound >= 0.5 * makespan  # not vacuous


def test_within_finds_every_point_of_a_convex_function_under_a_limit() -> None:
    rng = random.Random(7)
    for _ in range(300):
        lines = [(rng.uniform(-5, 5), rng.uniform(-50, 50)) for _ in range(rng.randint(1, 4))]

        def convex(x: int, lines=lines) -> float:  # noqa: E306 - a max of lines is convex
            return max(a * x + b for a, b in lines)

        lo = rng.randint(-20, 20)
        hi = lo + rng.randint(0, 40)
        limit = rng.uniform(-30, 60)
        under = [x for x in range(lo, hi + 1) if convex(x) <= limit]
        assert within(convex, lo, hi, limit) == ((under[0], under[-1]) if under else None)
