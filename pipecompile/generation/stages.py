"""One decode stage: a slice of the model's blocks, with the embedding on the first stage and
the head on the last, and the KV cache of its own blocks (``StageCache``).

A call runs one lane's turn: the prefill of the rows that start a sequence (each alone, its
prompt's tokens at positions 0..P-1) and the decode of the rows that continue one (together,
one token each at its own position). The first stage takes token ids, the others the
previous stage's hidden states; the last gives each row's logits at its last position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipecompile.generation.cache import Rows, StageCache, causal_mask
from pipecompile.generation.families import Family

__all__ = ["Call", "DecodeStage"]


@dataclass(frozen=True)
class Call:
    """One batch of a lane's turn: its rows and their positions."""

    rows: Rows

    @property
    def tokens(self) -> int:
        return int(self.rows.positions.shape[1])


class DecodeStage:
    """Stage ``index`` of ``count``: blocks ``blocks`` of ``family``'s model."""

    def __init__(
        self,
        family: Family,
        index: int,
        count: int,
        blocks: range,
        *,
        lanes: int,
        rows: int,
        max_length: int,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.family = family
        self.index, self.count, self.blocks = index, count, blocks
        self.max_length, self.lanes, self.rows = max_length, lanes, rows
        self.dtype = dtype
        heads, size = family.kv_shape()
        self.cache = StageCache(blocks, lanes, rows, heads, max_length, size, dtype)

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    @torch.no_grad()
    def run(self, lane: int, calls: list[Call], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each call's output: hidden states (rows, tokens, width), or on the last stage the
        logits at each row's last position (rows, vocabulary), in float32."""
        outs = []
        for call, x in zip(calls, inputs):
            positions = call.rows.positions
            h = self.family.embed(x, positions) if self.first else x
            mask = causal_mask(positions, self.max_length, h.dtype)
            self.cache.select(lane, call.rows)
            for i in self.blocks:
                h = self.family.block(i, h, positions, mask, self.cache)
            if self.last:
                h = self.family.head(h[:, -1:, :])[:, -1, :].float()
            outs.append(h)
        return outs
