"""Benchmark the exact balancer: partition time for 20,000 nodes into 8 and 16 stages.

Also re-checks exactness on random small cases against brute force, so the timing is of an
algorithm known to be optimal on this run. Rerun with ``python tools/bench/balance.py``
(``--quick``: 2,000 nodes, one repeat, 50 cases; a second or two).
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time

from common import machine

from pipecompile.balance.min_max_partition import bottleneck, min_max_partition


def time_partition(nodes: int, stages: int, repeats: int, seed: int) -> float:
    """Median seconds to split ``nodes`` random FLOP-like costs into ``stages``."""
    rng = random.Random(seed)
    times = []
    for _ in range(repeats):
        costs = [
            rng.choice([0, rng.randint(1, 10**6), rng.randint(10**8, 10**10)]) for _ in range(nodes)
        ]
        start = time.perf_counter()
        min_max_partition(costs, stages)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def exact_cases(count: int, seed: int) -> int:
    """How many of ``count`` random small cases reach the brute-force optimum."""
    rng = random.Random(seed)
    hits = 0
    for _ in range(count):
        n = rng.randint(2, 11)
        parts = rng.randint(1, n)
        costs = [rng.randint(0, 1000) for _ in range(n)]
        best = min(
            bottleneck(costs, [0, *c]) for c in itertools.combinations(range(1, n), parts - 1)
        )
        hits += bottleneck(costs, min_max_partition(costs, parts)) == best
    return hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", type=int, default=500)
    if parser.parse_known_args()[0].quick:  # smaller defaults; options given still count
        parser.set_defaults(nodes=2_000, repeats=1, cases=50)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    print(f"exact on random cases: {exact_cases(args.cases, 0)}/{args.cases}")
    print("| nodes | stages | median time (ms) |\n|---:|---:|---:|")
    for stages in (8, 16):
        ms = time_partition(args.nodes, stages, args.repeats, stages) * 1000
        print(f"| {args.nodes} | {stages} | {ms:.2f} |")


if __name__ == "__main__":
    main()
