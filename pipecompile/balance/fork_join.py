"""Analysis: fork_join — the parallel blocks of a graph of items (the balancer's atoms).

Requires: items numbered in a topological order, each with the items it reads.
Guarantees: ``fork_joins`` lists, for every parallel block of the graph, the items before it
(the prefix), its branches and the items after it (the suffix), each in topological order
(every item of a branch before every item of the suffix that reads it).

A *series point* is an item every other item is an ancestor or a descendant of: all the work
before it feeds it and all the work after it depends on it. Between two consecutive series
points (or before the first, after the last) lies a region; a region whose items fall into
two or more weakly connected parts is a parallel block, and the parts are its branches: work
that does not depend on the other branches' work, which may run on other devices at the same
time. Towers over the model's inputs, encoders side by side, a ControlNet beside an encoder
are such blocks. Work beside the branches (a mask computed from the inputs, read after the
join) joins a region's parts without depending on them, so a block also ends at each *join*:
an item reading two items whose ancestries share no item; the join's ancestors' parts are its
branches and all else its suffix. A branch is kept as one chain of items in topological order
(a block inside a branch is not split further), and a block of more than ``MAX_BRANCHES``
branches joins its smallest ones, in order, until that many remain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MAX_BRANCHES", "ForkJoin", "fork_joins"]

MAX_BRANCHES = 4


@dataclass(frozen=True)
class ForkJoin:
    """One parallel block of a graph and the chains around it (item indices, in order)."""

    prefix: tuple[int, ...]
    branches: tuple[tuple[int, ...], ...]
    suffix: tuple[int, ...]

    @property
    def segments(self) -> tuple[tuple[int, ...], ...]:
        """The prefix, each branch, the suffix: what a plan gives devices to."""
        return (self.prefix, *self.branches, self.suffix)


def fork_joins(reads: Sequence[Sequence[int]], weights: Sequence[int] = ()) -> list[ForkJoin]:
    """Every parallel block of the graph whose item ``k`` reads the items ``reads[k]`` (each
    smaller than ``k``); ``weights`` (one per item) order the branches joined when a block
    has more than ``MAX_BRANCHES``."""
    n = len(reads)
    if n < 2:
        return []
    below = [0] * n  # ancestors, as bit sets
    for k, read in enumerate(reads):
        for r in read:
            below[k] |= below[r] | (1 << r)
    above = [0] * n  # descendants
    for k in reversed(range(n)):
        for r in reads[k]:
            above[r] |= above[k] | (1 << k)
    everything = (1 << n) - 1
    points = [k for k in range(n) if below[k] | above[k] | (1 << k) == everything]
    bounds = [None, *points, None]
    blocks = []
    for before, after in zip(bounds, bounds[1:]):
        region = (above[before] if before is not None else everything) & (
            below[after] if after is not None else everything
        )
        parts = _parts([k for k in range(n) if region >> k & 1], reads)
        if len(parts) >= 2:
            blocks.append((region, parts))
    found = []
    for region, parts in blocks:
        first = min(p[0] for p in parts)
        prefix = tuple(k for k in range(first) if not region >> k & 1)
        inside_or_before = set(prefix) | {k for k in range(n) if region >> k & 1}
        suffix = tuple(k for k in range(n) if k not in inside_or_before)
        found.append(ForkJoin(prefix, _at_most(parts, weights), suffix))
    for fork in _joins(reads, below, weights):
        if fork not in found:
            found.append(fork)
    return found


def _joins(
    reads: Sequence[Sequence[int]], below: list[int], weights: Sequence[int]
) -> list[ForkJoin]:
    """The blocks that end at a join: an item reading two items whose ancestries share no
    item. Its ancestors' weakly connected parts are the branches, everything else (the join,
    what follows it, work beside it such as a mask computed from the inputs) the suffix; kept
    when its second heaviest branch carries at least ``1 / MAX_BRANCHES ** 2`` of the
    heaviest's weight (a branch of a few cheap ops is no reason to use a device)."""
    found = []
    for k, read in enumerate(reads):
        lines = [below[r] | (1 << r) for r in read]
        if not any(a & b == 0 for i, a in enumerate(lines) for b in lines[i + 1 :]):
            continue
        region = below[k]
        parts = _parts([i for i in range(k) if region >> i & 1], reads)
        heavy = sorted(
            (sum(weights[i] for i in p) if weights else len(p) for p in parts), reverse=True
        )
        if len(parts) < 2 or heavy[1] * MAX_BRANCHES**2 < heavy[0]:
            continue
        suffix = tuple(i for i in range(len(reads)) if not region >> i & 1)
        found.append(ForkJoin((), _at_most(parts, weights), suffix))
    return found


def _parts(items: list[int], reads: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """The weakly connected parts of ``items`` (edges among them only), in order."""
    parent = {k: k for k in items}

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for k in items:
        for r in reads[k]:
            if r in parent:
                parent[root(r)] = root(k)
    groups: dict[int, list[int]] = {}
    for k in items:
        groups.setdefault(root(k), []).append(k)
    return sorted((tuple(g) for g in groups.values()), key=lambda g: g[0])


def _at_most(parts: list[tuple[int, ...]], weights: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """``parts``, the two lightest joined (as one chain, in item order) until at most
    ``MAX_BRANCHES`` remain."""
    parts = list(parts)

    def weight(part: tuple[int, ...]) -> int:
        return sum(weights[k] for k in part) if weights else len(part)

    while len(parts) > MAX_BRANCHES:
        a, b = sorted(range(len(parts)), key=lambda p: weight(parts[p]))[:2]
        joined = tuple(sorted(parts[a] + parts[b]))
        parts = [p for q, p in enumerate(parts) if q not in (a, b)] + [joined]
        parts.sort(key=lambda g: g[0])
    return tuple(parts)
