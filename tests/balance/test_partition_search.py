"""The modelled partition solver against brute force, and its building blocks."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from pipecompile.balance import partition_search
from pipecompile.balance.partition_search import (
    Limit,
    Problem,
    interval_max,
    part_times,
    solve,
)
from tests.conftest import SAMPLED_OUT


def _prefix(values):
    return np.array([0, *itertools.accumulate(values)], dtype=np.int64)


def _brute_force(problem: Problem) -> int | None:
    """The least bottleneck over every split and replica assignment that fits."""
    n, p = problem.items, problem.parts
    best = None
    for cuts in itertools.combinations(range(1, n), p - 1):
        starts = (0, *cuts)
        if any(f not in starts for f in problem.forced):
            continue
        ends = [*starts[1:], n]
        fits = all(
            limit.mem[b] - limit.mem[a] + limit.at_start[a] <= limit.limit
            for j, (a, b) in enumerate(zip(starts, ends))
            for limit in (problem.limits[j] if problem.limits else ())
        )
        if not fits:
            continue
        choices = [(1,) * p]
        if problem.workers is not None:
            choices = [
                r for r in itertools.product(range(1, problem.workers + 1), repeat=p)
                if sum(r) <= problem.workers
            ]  # fmt: skip
        for replicas in choices:
            value = max(part_times(problem, starts, replicas))
            best = value if best is None else min(best, value)
    return best


def _random_problem(rng: random.Random) -> Problem:
    n = rng.randint(1, 9)
    p = rng.randint(1, min(n, 4))
    base = _prefix(rng.randint(0, 20) for _ in range(n))
    work = tuple(base * rng.choice([1, 1, 2, 3]) for _ in range(p))
    cut = np.array([0, *(rng.randint(0, 8) for _ in range(n - 1)), 0], dtype=np.int64)
    limits: tuple = ()
    if rng.random() < 0.5:
        limits = tuple(
            (Limit(_prefix(rng.randint(0, 5) for _ in range(n)),
                   np.array([rng.randint(0, 4) for _ in range(n + 1)], dtype=np.int64),
                   rng.randint(3, 20)),)
            for _ in range(p)
        )  # fmt: skip
    forced: tuple[int, ...] = ()
    if n > 1 and rng.random() < 0.3:
        forced = tuple(sorted(rng.sample(range(1, n), min(n - 1, rng.randint(0, p - 1)))))
    workers, param = None, None
    if n <= 7 and rng.random() < 0.4:
        workers = rng.randint(p, p + 3)
        param = _prefix(rng.randint(0, 10) for _ in range(n))
    return Problem(work, cut, limits, forced, workers, param, rng.randint(1, 4))


@pytest.mark.parametrize("monotone", [True, False], ids=["monotone-path", "general-path"])
@pytest.mark.parametrize("seed", [0, 1, *(pytest.param(s, marks=SAMPLED_OUT) for s in (2, 3))])
def test_solver_matches_brute_force(seed, monotone, monkeypatch):
    """Exact against brute force; the layers whose fewest workers never fall along the atoms
    (most of these small problems) take their own path, so the general one is checked with
    that path off too. The default run draws 200 problems a path (seeds 2 and 3, sampled out for
    time, 200 more each: ``PIPECOMPILE_ALL_CASES=1``)."""
    monkeypatch.setattr(partition_search, "MONOTONE_PATH", monotone)
    rng = random.Random(seed)
    for _ in range(100):
        problem = _random_problem(rng)
        found = solve(problem)
        best = _brute_force(problem)
        assert (found.bottleneck if found else None) == best, problem
        if found:
            assert max(part_times(problem, found.starts, found.replicas)) == best
            assert all(f in found.starts for f in problem.forced)
            # a guess anywhere (at, near or far from the optimum) leaves the result alone
            guesses = {0, best - 2, best - 1, best, best + 1, best + 3, 3 * best + 7}
            for guess in guesses if monotone else ():
                again = solve(problem, guess=guess)
                assert again is not None and again.bottleneck == best, (guess, problem)
            # so does a caller's bracket: a bound met (within) and one not met (least - 1)
            for least, within in ((best, best), (best - 3, best + 5), (1, 2 * best + 1)):
                again = solve(problem, within=max(within, best), least=max(least, 1))
                assert again is not None and again.bottleneck == best, (least, within, problem)
                assert max(part_times(problem, again.starts, again.replicas)) == best


def test_communication_moves_the_cut_to_the_thin_boundary():
    # equal compute on both sides of boundary 2, but boundary 2 is expensive to cross
    work = (_prefix([5, 5, 5, 5]),) * 2
    cheap = solve(Problem(work, np.array([0, 0, 0, 0, 0], dtype=np.int64)))
    costly = solve(Problem(work, np.array([0, 1, 50, 1, 0], dtype=np.int64)))
    assert cheap.starts == (0, 2) and cheap.bottleneck == 10
    assert costly.starts in ((0, 1), (0, 3)) and costly.bottleneck == 16


def test_a_slow_device_gets_less_work():
    base = _prefix([1] * 12)
    found = solve(Problem((base * 1, base * 2), np.zeros(13, dtype=np.int64)))
    assert found.starts == (0, 8) and found.bottleneck == 8


def test_replication_goes_to_the_heavy_part():
    base = _prefix([10, 10, 40])
    found = solve(Problem((base,) * 2, np.zeros(4, dtype=np.int64), workers=3,
                          param=_prefix([0, 0, 0]), microbatches=2))  # fmt: skip
    assert found.starts == (0, 2) and found.replicas == (1, 2) and found.bottleneck == 20


@pytest.mark.parametrize(("microbatches", "workers", "replicas", "bottleneck"),
                         [(1, 4, 1, 60), (2, 4, 2, 30), (3, 4, 3, 20), (4, 3, 2, 30),
                          (5, 3, 3, 24), (8, 4, 4, 15)])  # fmt: skip
def test_replicas_are_worth_only_the_share_of_micro_batches_they_take(
    microbatches, workers, replicas, bottleneck
):
    """r replicas of m micro-batches run ceil(m / r) each: one micro-batch keeps one replica
    busy, and 3 replicas of 4 micro-batches finish no sooner than 2 (so 2 are used)."""
    found = solve(Problem((_prefix([20, 20, 20]),), np.zeros(4, dtype=np.int64), workers=workers,
                          param=_prefix([0, 0, 0]), microbatches=microbatches))  # fmt: skip
    assert found.replicas == (replicas,) and found.bottleneck == bottleneck


def test_no_split_fits_the_memory():
    base = _prefix([1, 1, 1])
    tight = (Limit(_prefix([5, 5, 5]), np.zeros(4, dtype=np.int64), 4),) * 2
    assert solve(Problem((base,) * 2, np.zeros(4, dtype=np.int64), (tight, tight))) is None


def test_interval_max_against_a_loop():
    rng = np.random.default_rng(0)
    size = 50
    lo = rng.integers(0, size, 200)
    hi = np.minimum(size - 1, lo + rng.integers(0, 20, 200))
    value = rng.integers(-100, 100, 200)
    got = interval_max(lo, hi, value, size)
    for b in range(size):
        covering = [v for lo_, hi_, v in zip(lo, hi, value) if lo_ <= b <= hi_]
        assert (got[b] == max(covering)) if covering else got[b] < -(10**15)


def test_chains_cover_the_reached_positions_without_a_fall():
    """``_chains`` splits a layer's reached positions into chains along which the fewest
    workers never fall (each position in exactly one), or gives up past the cap."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        fewest = rng.integers(0, 6, size=rng.integers(1, 30))
        reached = rng.random(len(fewest)) < 0.7
        fewest = np.where(reached, fewest, partition_search._FAR)
        chains = partition_search._chains(fewest, reached)
        if chains is None:  # more than the cap: a strictly falling run longer than it
            assert len(set(fewest[reached].tolist())) > partition_search._CHAINS
            continue
        assert (np.sum(chains, axis=0) == reached).all()
        assert all((np.diff(fewest[c]) >= 0).all() for c in chains)


def _larger_problem(rng: random.Random) -> Problem:
    """A problem of up to 80 items, 8 parts and 24 workers: wide enough that a met bound's
    band leaves most positions out."""
    n = rng.randint(8, 80)
    p = rng.randint(1, 8)
    base = _prefix(rng.randint(1, 30) for _ in range(n))
    work = tuple(base * rng.choice([1, 1, 2]) for _ in range(p))
    cut = np.array([0, *(rng.randint(0, 10) for _ in range(n - 1)), 0], dtype=np.int64)
    forced = (
        tuple(sorted(rng.sample(range(1, n), rng.randint(0, p - 1)))) if rng.random() < 0.2 else ()
    )
    workers, param = None, None
    if rng.random() < 0.7:
        workers = rng.randint(p, 3 * p)
        param = _prefix(rng.randint(0, 6) for _ in range(n))
    return Problem(work, cut, (), forced, workers, param, rng.randint(1, 16))


@pytest.mark.parametrize("seed", range(3))
def test_bands_leave_every_result_alone(seed, monkeypatch):
    """A probe within a met bound's band (the positions the later parts can still finish
    from) gives the same answer and the same split as a probe over every position, under
    every bound ``solve`` and ``fits_under`` try, also where a ``fits_under`` leaves its
    layers to the ``solve`` after it (as the plan search does); and the bands are made."""
    rng = random.Random(seed)
    made = []
    needs = partition_search._needs
    monkeypatch.setattr(partition_search, "_needs", lambda *a: made.append(1) or needs(*a))
    for _ in range(60):
        problem = _larger_problem(rng) if rng.random() < 0.7 else _random_problem(rng)
        monkeypatch.setattr(partition_search, "BANDS", False)
        plain = solve(problem)
        bounds = [] if plain is None else [plain.bottleneck + d for d in (5, 1, 0, -1, -2)]
        fits = [partition_search.fits_under(problem, b) for b in bounds]
        partition_search.forget(problem)
        monkeypatch.setattr(partition_search, "BANDS", True)
        assert solve(problem) == plain, problem
        assert [partition_search.fits_under(problem, b) for b in bounds] == fits
        partition_search.forget(problem)
        if plain is not None:
            assert partition_search.fits_under(problem, bounds[0])
            assert solve(problem, within=bounds[0]) == plain, problem
    assert len(made) > 20


def test_the_even_load_replicas_have_the_most_capacity_and_are_the_most_even():
    """``_spread`` against every replica vector: the most micro-batch capacity (m / ceil(m /
    r) a part), then the least sum of squares, with replica counts the probes offer."""
    for parts, workers, m in itertools.product(range(1, 5), range(1, 10), (1, 2, 3, 4, 6, 8)):
        if workers < parts:
            continue
        offered = [r for r in range(1, m + 1) if r == 1 or -(-m // (r - 1)) > -(-m // r)]
        vectors = [v for v in itertools.product(offered, repeat=parts) if sum(v) <= workers]
        score = max((sum(m / -(-m // r) for r in v), -sum(r * r for r in v)) for v in vectors)
        got = partition_search._spread(parts, workers, m)
        assert len(got) == parts and sum(got) <= workers and set(got) <= set(offered)
        assert (sum(m / -(-m // r) for r in got), -sum(r * r for r in got)) == score
