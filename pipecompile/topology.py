"""What a program is checked against: which stages feed which, which share parameters."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Topology"]


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
