"""A stage's KV cache: for each of its blocks, keys and values of shape
(lanes, rows, heads, max_length, head size), allocated once, zeroed, and written in place at
the positions each step gives. A lane is one group of sequences in flight; a row one sequence
of it. Positions past a row's own are masked, so what an earlier sequence left there is never
read (and, zeroed or finite, never poisons the attention's sums)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["StageCache", "Rows", "causal_mask"]


@dataclass(frozen=True)
class Rows:
    """The rows of one lane a call runs, and each one's positions (rows x tokens)."""

    rows: tuple[int, ...]
    positions: torch.Tensor  # int64 (len(rows), tokens)

    def index(self) -> slice | torch.Tensor:
        """A slice where the rows are consecutive (a view of the cache, no copy)."""
        first, n = self.rows[0], len(self.rows)
        if self.rows == tuple(range(first, first + n)):
            return slice(first, first + n)
        return torch.tensor(self.rows, dtype=torch.long)


def causal_mask(positions: torch.Tensor, max_length: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask (rows, 1, tokens, max_length): 0 where key position j <= the query's
    position, the dtype's lowest value elsewhere."""
    keys = torch.arange(max_length, device=positions.device)
    seen = keys.view(1, 1, 1, -1) <= positions[:, None, :, None]
    mask = torch.zeros(seen.shape, dtype=dtype, device=positions.device)
    return mask.masked_fill_(~seen, torch.finfo(dtype).min)


class StageCache:
    """The keys and values of blocks ``first..first+count-1`` for every lane; ``select``
    points ``update`` at one lane's rows for the next call. ``update`` has the signature
    Hugging Face layers call (``cache.update(k, v, layer_idx, ...)``)."""

    def __init__(
        self,
        blocks: range,
        lanes: int,
        rows: int,
        heads: int,
        max_length: int,
        head_size: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (lanes, rows, heads, max_length, head_size)
        self.blocks = blocks
        self.max_length = max_length
        self.keys = {i: torch.zeros(shape, dtype=dtype, device=device) for i in blocks}
        self.values = {i: torch.zeros(shape, dtype=dtype, device=device) for i in blocks}
        self._lane = 0
        self._rows: Rows | None = None

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.keys.values(), *self.values.values()))

    def select(self, lane: int, rows: Rows) -> None:
        self._lane, self._rows = lane, rows

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``key``/``value`` (rows, heads, tokens, size) at the selected rows'
        positions; return the rows' whole cache of that block (rows, heads, max_length, size)."""
        assert self._rows is not None, "select a lane's rows before a call"
        index = self._rows.index()
        keys = self.keys[layer_idx][self._lane]
        values = self.values[layer_idx][self._lane]
        pos = self._rows.positions
        ids = torch.tensor(self._rows.rows, dtype=torch.long)[:, None].expand_as(pos)
        keys[ids, :, pos] = key.transpose(1, 2)  # (rows, tokens, heads, size) at each
        values[ids, :, pos] = value.transpose(1, 2)
        return keys[index], values[index]
