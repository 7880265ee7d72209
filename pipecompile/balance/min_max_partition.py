"""Exact min-max partition of a sequence of non-negative integer costs into contiguous parts.

The optimum bottleneck B* is found by parametric search (Nicol's method): for the first part,
binary-search the smallest end ``e`` whose prefix sum is a feasible bottleneck (a greedy probe
answers feasibility in O(parts · log n)); either that sum is B*, or the first part ends just
before ``e`` and the rest is solved the same way with one part fewer. Integer arithmetic keeps
every comparison exact. Total cost O(parts² · log² n) after an O(n) prefix sum.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

__all__ = ["min_max_partition", "min_max_partition_with_cuts", "bottleneck"]


def min_max_partition(costs: Sequence[int], parts: int) -> list[int]:
    """Start index of each part of the optimal split of ``costs`` into ``parts`` non-empty parts.

    Example:
        >>> min_max_partition([5, 1, 1, 1, 5, 1], 3)
        [0, 2, 4]
    """
    if not 1 <= parts <= len(costs):
        raise ValueError(f"cannot split {len(costs)} items into {parts} non-empty parts")
    if any(c < 0 for c in costs):
        raise ValueError("costs must be non-negative")
    prefix = [0, *itertools.accumulate(costs)]
    best = _optimum(prefix, parts)
    return _starts_for(prefix, parts, best)


def bottleneck(costs: Sequence[int], starts: Sequence[int]) -> int:
    """The largest part sum of the split of ``costs`` that starts parts at ``starts``."""
    ends = [*starts[1:], len(costs)]
    return max(sum(costs[s:e]) for s, e in zip(starts, ends))


def _feasible(prefix: list[int], start: int, parts: int, limit: int) -> bool:
    """Can ``prefix``'s items from ``start`` on be packed into ``parts`` parts of sum <= limit?"""
    n = len(prefix) - 1
    for _ in range(parts):
        if start == n:
            return True
        end = bisect.bisect_right(prefix, prefix[start] + limit, lo=start) - 1
        if end == start:
            return False
        start = end
    return start == n


def _optimum(prefix: list[int], parts: int) -> int:
    n = len(prefix) - 1
    best, floor, start = prefix[n], 0, 0
    for remaining in range(parts, 1, -1):
        lo, hi = start + 1, n  # smallest e with a feasible first-part sum prefix[e] - prefix[start]
        while lo < hi:
            mid = (lo + hi) // 2
            if _feasible(prefix, start, remaining, prefix[mid] - prefix[start]):
                hi = mid
            else:
                lo = mid + 1
        best = min(best, max(floor, prefix[lo] - prefix[start]))
        floor = max(floor, prefix[lo - 1] - prefix[start])
        start = lo - 1
        if start == n or floor >= best:
            return best
    return min(best, max(floor, prefix[n] - prefix[start]))


def _starts_for(prefix: list[int], parts: int, limit: int) -> list[int]:
    """Greedy split with every part <= limit, leaving at least one item for each later part."""
    n = len(prefix) - 1
    starts, start = [], 0
    for j in range(parts):
        starts.append(start)
        last_allowed = n - (parts - j - 1)
        end = bisect.bisect_right(prefix, prefix[start] + limit, lo=start) - 1
        start = max(start + 1, min(end, last_allowed))
    assert start == n and all(
        prefix[e] - prefix[s] <= limit for s, e in zip(starts, starts[1:] + [n])
    )
    return starts


def min_max_partition_with_cuts(costs: Sequence[int], parts: int, cuts: Sequence[int]) -> list[int]:
    """Like ``min_max_partition``, but a part must start at every index in ``cuts``.

    The cuts split ``costs`` into segments; the smallest bottleneck B for which the segments'
    greedy part counts sum to at most ``parts`` is found by binary search over integers (the
    count is monotone in B), each segment gets at least its count (spare parts go to the
    segments with the largest optimum), and each is then split optimally.

    Example:
        >>> min_max_partition_with_cuts([5, 1, 1, 1, 5, 1], 3, [1])
        [0, 1, 4]
    """
    bounds = sorted({0, *cuts, len(costs)})
    if bounds[0] != 0 or bounds[-1] != len(costs) or any(c <= 0 or c >= len(costs) for c in cuts):
        raise ValueError(f"cuts {list(cuts)} must lie strictly inside 0..{len(costs)}")
    segments = [list(costs[a:b]) for a, b in zip(bounds, bounds[1:])]
    if not len(segments) <= parts <= len(costs):
        raise ValueError(
            f"cannot split {len(costs)} items into {parts} parts with {len(cuts)} cuts"
        )
    lo, hi = max(costs, default=0), max(sum(s) for s in segments)
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(_parts_needed(s, mid) for s in segments) <= parts:
            hi = mid
        else:
            lo = mid + 1
    counts = [_parts_needed(s, lo) for s in segments]
    for _ in range(parts - sum(counts)):
        room = [k for k, s in enumerate(segments) if counts[k] < len(s)]
        worst = max(
            room, key=lambda k: _optimum([0, *itertools.accumulate(segments[k])], counts[k])
        )
        counts[worst] += 1
    starts: list[int] = []
    for offset, segment, count in zip(bounds, segments, counts):
        starts += [offset + s for s in min_max_partition(segment, count)]
    return starts


def _parts_needed(segment: list[int], limit: int) -> int:
    """How many parts of sum <= ``limit`` a greedy split of ``segment`` needs (all costs are
    at most ``limit``)."""
    prefix = [0, *itertools.accumulate(segment)]
    count, start = 0, 0
    while start < len(segment):
        start = max(start + 1, bisect.bisect_right(prefix, prefix[start] + limit, lo=start) - 1)
        count += 1
    return count
