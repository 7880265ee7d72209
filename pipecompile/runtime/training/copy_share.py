"""One data-parallel copy's share of the mini-batches (`run --dp D`).

The batches are read in rounds of D, in order; copy k keeps the k-th of each round, so copy k
trains on batches k, k+D, k+2D, ... of the data (every epoch, and across epochs, as one
pipeline would read them): deterministic, each batch once, and resumable from the number of
batches read. Every copy counts every batch, so all ranks agree on epochs and on the end of
the data. A last round the data cuts short leaves the copies past its end without a batch:
they sit that part out (``SIT_OUT``) and add nothing to the step, while the others train
(under FSDP they run it on their last batch again at weight 0: ``replay``).
"""

from __future__ import annotations

from typing import Any

from pipecompile.errors import PipecompileError
from pipecompile.model.data_hooks import Batch

__all__ = ["CopyShare", "SIT_OUT"]

SIT_OUT = Batch({}, ())  # this copy has no batch in a round the data cut short


class CopyShare:
    """Copy ``index`` of ``copies``'s batches from ``feed`` (the loop's feed of every batch);
    ``in_epoch`` and ``epoch`` name the batch it last returned."""

    def __init__(self, feed: Any, index: int, copies: int) -> None:
        self.feed, self.index, self.copies = feed, index, copies
        self.source = feed.source
        self.epoch, self.in_epoch = feed.epoch, feed.in_epoch
        self.last: Batch | None = None  # the last batch this copy trained on
        self.last_sizes: dict[str, int] | None = None  # its --dynamic sizes (set by the loop)

    @property
    def read(self) -> int:
        """Batches read by every copy together (where a resumed run starts again)."""
        return int(self.feed.read)

    @property
    def at_epoch_end(self) -> bool:
        return bool(self.feed.at_epoch_end)

    def next(self) -> Batch | None:
        """This copy's batch of the next round; None once the data has ended (for every
        copy alike), ``SIT_OUT`` if the round ended before this copy's turn."""
        mine: Batch | None = None
        for k in range(self.copies):
            batch = self.feed.next()
            if batch is None:
                return None if k == 0 else (mine if mine is not None else SIT_OUT)
            if k == self.index:
                mine = self.last = batch
                self.epoch, self.in_epoch = self.feed.epoch, self.feed.in_epoch
        return mine

    def replay(self) -> Batch:
        """The batch this copy last trained on, for a part it sits out but must run (its
        weight 0): FSDP's collectives pair every copy's backwards."""
        if self.last is None:
            raise PipecompileError(
                f"--dp {self.copies} --shard: the data ended before copy {self.index} had a "
                f"batch, and a sharded copy must run every part; give train_batches() at least "
                f"{self.copies} batches"
            )
        return self.last
