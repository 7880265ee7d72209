"""What a program is checked against: which stages feed which, which share parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipecompile.ir.graph.ties import tied_groups

if TYPE_CHECKING:
    from pipecompile.ir.graph.stage_graph import StageGraph
    from pipecompile.ir.records.manifest import Manifest

__all__ = ["Topology", "side_by_side", "topology", "topology_from_manifest"]


@dataclass(frozen=True)
class Topology:
    """Stage count, producer -> consumer stage pairs, and groups of stages holding a tied
    parameter."""

    num_stages: int
    edges: frozenset[tuple[int, int]]  # (producer stage, consumer stage)
    tie_groups: tuple[tuple[int, ...], ...] = ()

    @classmethod
    def chain(cls, stages: int) -> Topology:
        """Stage j feeds stage j + 1 and nothing else: the plain pipeline."""
        return cls(stages, frozenset((j, j + 1) for j in range(stages - 1)))


def topology(graph: StageGraph) -> Topology:
    """The facts about ``graph`` that a program is checked against."""
    edges = frozenset((e.src, e.dst) for e in graph.edges)
    groups = tuple(tied_groups([s.params for s in graph.stages]))
    return Topology(len(graph.stages), edges, groups)


def topology_from_manifest(manifest: Manifest) -> Topology:
    """The same facts, read from an emitted manifest."""
    edges = frozenset((e.src, e.dst) for e in manifest.edges)
    groups = tuple(tied_groups([s.params for s in manifest.stages]))
    return Topology(len(manifest.stages), edges, groups)


def side_by_side(topology: Topology, stage_device: tuple[int, ...]) -> list[int]:
    """The stages that run at the same time as another on another device: neither feeds the
    other, directly or through other stages (a stage graph's branches; none in a chain)."""
    n = topology.num_stages
    below = [0] * n  # each stage's ancestors, as bit sets
    for s, t in sorted(topology.edges):
        below[t] |= below[s] | (1 << s)
    for t in range(n):  # edges go forward: one pass in order closes them
        for s in range(t):
            if below[t] >> s & 1:
                below[t] |= below[s]
    related = [below[j] | (1 << j) for j in range(n)]
    for j in range(n):
        for k in range(n):
            if below[k] >> j & 1:
                related[j] |= 1 << k
    return [
        j
        for j in range(n)
        if any(not related[j] >> k & 1 and stage_device[k] != stage_device[j] for k in range(n))
    ]
