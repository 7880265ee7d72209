"""Exact min-max split of a fork-join graph onto devices: branches side by side, a stage graph.

A *graph split* of a ``ForkJoin`` (prefix, branches, suffix) onto ``p`` devices gives each of
its segments a number of devices of its own, summing to ``p``, at least two branches among
them, and cuts each such segment into that many contiguous pieces, one a device (the exact
min-max chain split). A segment given no device runs whole, as a stage of its own, on a
device of a neighbour that runs before or after it:

- the prefix on the first device of a branch;
- a branch on the last device of the prefix, the first device of the suffix, or the last
  device of another branch;
- the suffix on the last device of a branch or of the prefix.

A device's load is the summed cost of what it runs; the split minimises the largest load.
Every such split is tried (the device counts, then where each segment without devices goes,
each host's chain solved exactly with the guest's cost added to its first or last piece), so
the result is the optimum over these splits; ``tests/balance/test_graph_partition.py`` checks
it against every assignment of items to devices on small graphs. Ties go to the split with
fewer segments running on another's device.

The pieces come in stage order (prefix, branches, suffix, each in order), so every value
flows from a lower stage to a higher one. A graph with no prefix gets an *input* piece with
no items first (the stage that reads the batch and hands each branch its inputs), one with
no suffix an *output* piece last (the stage that returns the branches' values), each on the
device of its neighbour.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pipecompile.balance.fork_join import ForkJoin
from pipecompile.balance.min_max_partition import min_max_partition

__all__ = ["GraphSplit", "Piece", "best_split", "graph_split"]

_FIRST, _LAST = "first", "last"


@dataclass(frozen=True)
class Piece:
    """One stage of a graph split: the items of one segment (``segment``: 0 the prefix, 1..k
    the branches, k + 1 the suffix) it runs, and the device it runs on."""

    segment: int
    items: tuple[int, ...]
    device: int


@dataclass(frozen=True)
class GraphSplit:
    """The pieces in stage order, each device's load and the largest of them."""

    pieces: tuple[Piece, ...]
    loads: tuple[int, ...]

    @property
    def bottleneck(self) -> int:
        return max(self.loads)

    @property
    def stage_device(self) -> tuple[int, ...]:
        return tuple(p.device for p in self.pieces)

    def edges(
        self, reads: Sequence[Sequence[int]], readers: Sequence[int] = ()
    ) -> frozenset[tuple[int, int]]:
        """(producer, consumer) stage pairs, given which items each item reads and which
        read the batch (``readers``): an item's reads across stages, the batch from stage 0
        to each stage that reads it or that no other feeds, and each stage that feeds none
        to the last (its values are the model's outputs)."""
        stage = {a: j for j, p in enumerate(self.pieces) for a in p.items}
        edges = {(stage[r], stage[a]) for a in stage for r in reads[a] if stage[r] != stage[a]}
        edges |= {(0, stage[a]) for a in readers if stage[a] != 0}
        last = len(self.pieces) - 1
        for j in range(1, last + 1):
            if not any(t == j for _, t in edges):
                edges.add((0, j))
        for j in range(last):
            if not any(s == j for s, _ in edges):
                edges.add((j, last))
        return frozenset(edges)


def graph_split(weights: Sequence[int], fork: ForkJoin, devices: int) -> GraphSplit | None:
    """The optimal graph split of ``fork`` (items weighted by ``weights``) onto ``devices``
    devices, or None when there is none (fewer than two devices, or too few items)."""
    segments = fork.segments
    totals = [sum(weights[k] for k in s) for s in segments]
    best: tuple[tuple[int, int], GraphSplit] | None = None
    for counts in _counts(segments, devices):
        guests = [s for s, seg in enumerate(segments) if seg and not counts[s]]
        for hosts in itertools.product(*(_hosts(s, counts, len(segments)) for s in guests)):
            split = _solve(weights, segments, totals, counts, dict(zip(guests, hosts)))
            if split is None:
                continue
            key = (split.bottleneck, len(guests))
            if best is None or key < best[0]:
                best = (key, split)
    return best[1] if best else None


def best_split(
    weights: Sequence[int], blocks: Sequence[ForkJoin], devices: int
) -> GraphSplit | None:
    """The split of least bottleneck over the graph splits of each of ``blocks`` (the
    model's parallel blocks), or None when none has one."""
    splits = [s for f in blocks if (s := graph_split(weights, f, devices)) is not None]
    return min(splits, key=lambda s: s.bottleneck, default=None)


def _counts(segments: tuple[tuple[int, ...], ...], devices: int) -> Iterator[tuple[int, ...]]:
    """Devices of their own for each segment: summing to ``devices``, none for an empty
    segment, no more than its items, and at least one for two branches or more."""
    last = len(segments) - 1
    for cut in itertools.combinations(range(devices + last), last):
        counts = tuple(b - a - 1 for a, b in zip((-1, *cut), (*cut, devices + last)))
        if any(c > len(s) for c, s in zip(counts, segments)):
            continue
        if sum(1 for c in counts[1:last] if c) >= 2:
            yield counts


def _hosts(s: int, counts: tuple[int, ...], n: int) -> list[tuple[int, str]]:
    """Where segment ``s``, given no device, may run: (host segment, its first or last
    piece)."""
    suffix = n - 1
    branches = [b for b in range(1, suffix) if counts[b]]
    if s == 0:
        return [(b, _FIRST) for b in branches]
    if s == suffix:
        return [(b, _LAST) for b in branches] + [(0, _LAST)] * bool(counts[0])
    return (
        [(0, _LAST)] * bool(counts[0])
        + [(suffix, _FIRST)] * bool(counts[suffix])
        + [(b, _LAST) for b in branches if b != s]
    )


def _solve(
    weights: Sequence[int],
    segments: tuple[tuple[int, ...], ...],
    totals: list[int],
    counts: tuple[int, ...],
    guests: dict[int, tuple[int, str]],
) -> GraphSplit | None:
    """Each host chain split exactly with its guests' costs on its first and last pieces;
    the pieces and loads in stage order."""
    extra = {(s, end): 0 for s in range(len(segments)) for end in (_FIRST, _LAST)}
    for guest, place in guests.items():
        extra[place] += totals[guest]
    owned: dict[int, list[tuple[int, ...]]] = {}  # segment -> its pieces, one a device
    loads_of: dict[int, list[int]] = {}
    for s, seg in enumerate(segments):
        if not counts[s]:
            continue
        before, after = extra[(s, _FIRST)], extra[(s, _LAST)]
        costs = [before] * bool(before) + [weights[k] for k in seg] + [after] * bool(after)
        if counts[s] > len(costs):
            return None
        starts = min_max_partition(costs, counts[s])
        ends = [*starts[1:], len(costs)]
        shift = bool(before)
        owned[s] = [
            tuple(seg[max(a - shift, 0) : max(min(b - shift, len(seg)), 0)])
            for a, b in zip(starts, ends)
        ]
        loads_of[s] = [sum(costs[a:b]) for a, b in zip(starts, ends)]
    return _pieces(segments, counts, guests, owned, loads_of)


def _pieces(
    segments: tuple[tuple[int, ...], ...],
    counts: tuple[int, ...],
    guests: dict[int, tuple[int, str]],
    owned: dict[int, list[tuple[int, ...]]],
    loads_of: dict[int, list[int]],
) -> GraphSplit:
    """Number the devices in stage order and list the pieces (input and output pieces
    added where the graph has no prefix or no suffix)."""
    slot: dict[tuple[int, int], int] = {}  # (segment, its k-th own device) -> device
    order = [s for s in range(len(segments)) if counts[s]]
    for s in order:
        for k in range(counts[s]):
            slot[(s, k)] = len(slot)

    def device_of(place: tuple[int, str]) -> int:
        host, end = place
        return slot[(host, 0 if end == _FIRST else counts[host] - 1)]

    pieces: list[Piece] = []
    for s, seg in enumerate(segments):
        if s in guests:
            pieces.append(Piece(s, seg, device_of(guests[s])))
        elif counts[s]:
            pieces += [Piece(s, p, slot[(s, k)]) for k, p in enumerate(owned[s]) if p]
    if not segments[0]:
        pieces.insert(0, Piece(0, (), pieces[0].device))
    if not segments[-1]:
        pieces.append(Piece(len(segments) - 1, (), pieces[-1].device))
    loads = [0] * len(slot)
    for s in order:
        for k, load in enumerate(loads_of[s]):
            loads[slot[(s, k)]] = load
    renamed: dict[int, int] = {}  # devices numbered as the stages first use them
    for piece in pieces:
        renamed.setdefault(piece.device, len(renamed))
    return GraphSplit(
        tuple(Piece(p.segment, p.items, renamed[p.device]) for p in pieces),
        tuple(loads[d] for d in sorted(renamed, key=renamed.__getitem__)),
    )
