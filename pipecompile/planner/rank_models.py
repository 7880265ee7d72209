"""The cost model of each rank count a plan search may use: a plan is priced by the model of
the ranks it runs on, so that one plan has one price whatever ``--devices`` offered (ranks
take their share of the cores, and messages cost what they cost between that many ranks:
``calibrate.calibrated_ranks``)."""

from __future__ import annotations

from dataclasses import dataclass

from pipecompile.ir.programs.cost_model import CostModel

__all__ = ["EXACT_RANKS", "RankModels", "rank_ladder"]

EXACT_RANKS = 8  # rank counts are each priced up to this; above it, the powers of two and N


def rank_ladder(devices: int) -> list[int]:
    """The rank counts a search offered ``devices`` devices offers a replicable schedule's
    stages (from their stage count up): every count up to ``EXACT_RANKS``, the powers of
    two above it and ``devices`` itself. A search offered N is never worse than one offered
    any of these counts; all of them up to ``EXACT_RANKS`` (the counts in between would
    multiply a 64-device search's work for little: a split the partitioner spreads over
    fewer ranks than offered is priced at its own count only where that count is offered)."""
    counts = set(range(1, min(devices, EXACT_RANKS) + 1)) | {devices}
    power = 2 * EXACT_RANKS
    while power < devices:
        counts.add(power)
        power *= 2
    return sorted(counts)


@dataclass(frozen=True)
class RankModels:
    """``models[k - 1]``: the cost model of a plan on k ranks, for k from 1 to ``devices``;
    ``sources[k - 1]``: the key of the calibration it was made from ("" where none)."""

    models: tuple[CostModel, ...]
    sources: tuple[str, ...] = ()

    @classmethod
    def same(cls, machine: CostModel, devices: int) -> RankModels:
        """One model for every count (an uncalibrated search: the flags' model)."""
        return cls((machine,) * max(devices, 1))

    def at(self, ranks: int) -> CostModel:
        """The model of a plan on ``ranks`` ranks."""
        return self.models[ranks - 1]

    def source(self, ranks: int) -> str | None:
        """The key of the calibration of ``ranks`` ranks (None: not calibrated)."""
        found = self.sources[ranks - 1] if self.sources else ""
        return found or None
