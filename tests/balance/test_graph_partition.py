"""The graph split is the optimum over its splits: checked against every assignment of items
to devices on small fork-join graphs; and the parallel blocks found are the graph's."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict

import pytest

from pipecompile.balance.fork_join import ForkJoin, fork_joins
from pipecompile.balance.graph_partition import graph_split


def _random_fork(rng: random.Random) -> tuple[list[list[int]], ForkJoin]:
    """A random fork-join graph: a prefix chain, 2 or 3 branch chains reading its end, a
    suffix chain reading every branch's end; each piece may be empty (the prefix, the suffix)
    or one to three items long."""
    reads: list[list[int]] = []

    def chain(length: int, start: list[int]) -> tuple[int, ...]:
        items, last = [], start
        for _ in range(length):
            reads.append(list(last))
            items.append(len(reads) - 1)
            last = [items[-1]]
        return tuple(items)

    prefix = chain(rng.randint(0, 2), [])
    ends = [prefix[-1]] if prefix else []
    branches = tuple(chain(rng.randint(1, 3), ends) for _ in range(rng.randint(2, 3)))
    suffix_len = rng.randint(0, 2)
    suffix = chain(suffix_len, [b[-1] for b in branches]) if suffix_len else ()
    return reads, ForkJoin(prefix, branches, suffix)


def _mergeable(guest: int, host: int, ends: set[str], last: int) -> bool:
    """Whether segment ``guest``, whole, may run on ``host``'s device at ``ends`` of it."""
    branch = {0: False, last: False}.get
    if guest == 0:
        return branch(host, True) and "first" in ends
    if guest == last:
        return "last" in ends and (branch(host, True) or host == 0)
    return (
        (host == 0 and "last" in ends)
        or (host == last and "first" in ends)
        or (branch(host, True) and host != guest and "last" in ends)
    )


def _legal(segments: tuple[tuple[int, ...], ...], device: dict[int, int]) -> bool:
    """The rules of a graph split, stated on an assignment of items to devices."""
    runs: dict[int, list[int]] = {}
    for s, seg in enumerate(segments):
        seq = [device[k] for k in seg]
        run = [d for i, d in enumerate(seq) if i == 0 or seq[i - 1] != d]
        if len(run) != len(set(run)):
            return False
        if run:
            runs[s] = run
    on: dict[int, list[int]] = defaultdict(list)
    for s, run in runs.items():
        for d in run:
            on[d].append(s)
    last = len(segments) - 1
    choices = []  # per shared device: the sets of guests a valid choice of host leaves
    for d, here in on.items():
        if len(here) == 1:
            continue
        partial = [s for s in here if len(runs[s]) > 1]
        if len(partial) > 1:
            return False
        valid = []
        for host in partial or here:
            ends = {e for e, at in (("first", 0), ("last", -1)) if runs[host][at] == d}
            guests = [g for g in here if g != host]
            if all(_mergeable(g, host, ends, last) for g in guests):
                valid.append(set(guests))
        if not valid:
            return False
        choices.append(valid)
    branches = {s for s in runs if 0 < s < last}
    return any(len(branches - set().union(*pick)) >= 2 for pick in itertools.product(*choices))


def _brute_force(weights: list[int], fork: ForkJoin, devices: int) -> int | None:
    items = [k for seg in fork.segments for k in seg]
    best = None
    for assigned in itertools.product(range(devices), repeat=len(items)):
        if len(set(assigned)) != devices:
            continue
        device = dict(zip(items, assigned))
        if not _legal(fork.segments, device):
            continue
        loads = [0] * devices
        for k, d in device.items():
            loads[d] += weights[k]
        best = max(loads) if best is None else min(best, max(loads))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_graph_split_is_the_optimum_of_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    reads, fork = _random_fork(rng)
    while len(reads) > 7:
        reads, fork = _random_fork(rng)
    weights = [rng.randint(1, 9) for _ in reads]
    assert fork_joins(reads, weights) == [fork]  # the block built is the block found
    for devices in (2, 3) if len(reads) <= 6 else (2,):
        split = graph_split(weights, fork, devices)
        truth = _brute_force(weights, fork, devices)
        if truth is None:
            assert split is None
            continue
        assert split is not None and split.bottleneck == truth, (seed, devices, weights)
        loads = [0] * devices
        for piece in split.pieces:
            for k in piece.items:
                loads[piece.device] += weights[k]
        assert tuple(loads) == split.loads
        placed = sorted(k for p in split.pieces for k in p.items)
        assert placed == list(range(len(reads)))  # every item once
        assert _legal(fork.segments, {k: p.device for p in split.pieces for k in p.items})


def test_two_towers_run_side_by_side() -> None:
    """Towers of 3 items joined by a product: on 2 devices a tower each, the join on the
    second; the batch enters by an input stage."""
    reads = [[], [0], [1], [], [3], [4], [2, 5], [6]]
    weights = [5, 5, 5, 5, 5, 5, 1, 1]
    (fork,) = fork_joins(reads, weights)
    assert fork == ForkJoin((), ((0, 1, 2), (3, 4, 5)), (6, 7))
    split = graph_split(weights, fork, 2)
    assert split is not None
    assert [p.items for p in split.pieces] == [(), (0, 1, 2), (3, 4, 5), (6, 7)]
    assert split.stage_device[1] != split.stage_device[2]
    assert split.bottleneck == 17
    # the towers read the batch from the input stage; the join reads the towers
    assert split.edges(reads, readers=(0, 3)) == {(0, 1), (0, 2), (1, 3), (2, 3)}
    # a join that also reads the batch (a mask) gets it from the input stage too
    assert (0, 3) in split.edges(reads, readers=(0, 3, 6))


def test_chains_and_diamonds_inside_a_branch_are_no_blocks() -> None:
    """A residual chain has no parallel block; a diamond's two arms are one (its arms read
    the same item)."""
    chain = [[], [0], [0, 1], [2], [2, 3]]
    assert fork_joins(chain) == []
    diamond = [[], [0], [0], [1, 2]]
    assert fork_joins(diamond) == [ForkJoin((0,), ((1,), (2,)), (3,))]


def test_many_branches_join_to_four() -> None:
    reads = [[] for _ in range(6)] + [[0, 1, 2, 3, 4, 5]]
    weights = [9, 1, 8, 2, 7, 3, 1]
    (fork,) = fork_joins(reads, weights)
    assert len(fork.branches) == 4
    assert sorted(k for b in fork.branches for k in b) == list(range(6))


def test_work_beside_the_towers_does_not_hide_them() -> None:
    """A mask computed from the inputs and read after the join (item 7) depends on neither
    tower, so no item before the head is a series point: the towers are found at their join,
    the mask goes with the suffix; a join of a tower and a cheap branch is no block."""
    reads = [[], [0], [], [2], [1, 3], [], [5], [4, 6]]
    weights = [5, 5, 5, 5, 1, 1, 1, 1]
    blocks = fork_joins(reads, weights)
    assert ForkJoin((), ((0, 1), (2, 3)), (4, 5, 6, 7)) in blocks
    split = graph_split(weights, ForkJoin((), ((0, 1), (2, 3)), (4, 5, 6, 7)), 2)
    assert split is not None and split.bottleneck == 14
    cheap = [[], [0], [], [1, 2], [], [3, 4]]  # a tower, one cheap op, their join, a mask
    assert ForkJoin((), ((0, 1), (2,)), (3, 4, 5)) not in fork_joins(cheap, [9, 9, 1, 1, 1, 1])
    assert ForkJoin((), ((0, 1), (2,)), (3, 4, 5)) in fork_joins(cheap, [9, 9, 9, 1, 1, 1])
