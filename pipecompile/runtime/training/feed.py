"""The mini-batches a run reads, in order across epochs (``Feed``), held to what the data
promised; how many steps they make; and the sizes the ranks agree a batch has."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from pipecompile.errors import PipecompileError
from pipecompile.ir.graph.dynamic import DynamicDims
from pipecompile.model.data_hooks import Batch, BatchSource
from pipecompile.options.run import TrainFlags
from pipecompile.runtime.training.batch_agreement import agree_on_batch
from pipecompile.runtime.training.group import Group, LocalGroup

__all__ = ["Feed", "agreed_sizes", "empty_data", "epoch_length", "first_only", "total_steps"]


class Feed:
    """Mini-batches in order across epochs; ``read`` counts them. A rank without data only
    keeps count (the epoch length comes from the ranks that read); where no rank knows the
    length, the ranks agree after each batch on whether the data went on.

    The data is held to what it promised: an epoch that yields no batch (a used-up iterable
    returned again), or a number of batches other than its ``len()`` (either way), stops the
    run with an error instead of training on less than asked."""

    def __init__(
        self,
        source: BatchSource | None,
        length: int | None,
        group: Group,
        *,
        epochs: int | None,
        skip: int,
        device: torch.device | None = None,
    ) -> None:
        self.source, self.length, self.group, self.epochs = source, length, group, epochs
        self.device = device
        self.epoch, self.read, self.in_epoch = 1, 0, 0
        self.gave = 0  # batches the first epoch gave (for the message of an empty one)
        self._it: Iterator[Batch] | None = None
        self.at_epoch_end = False
        for _ in range(skip):  # resuming: the batches the saved steps used
            if self.next() is None:
                break

    def next(self) -> Batch | None:
        """The next mini-batch (an empty one on a rank without data), None when the data
        has ended ``epochs`` times."""
        if self.length is not None and self.in_epoch == self.length:
            if self.epochs is not None and self.epoch >= self.epochs:
                return None
            self._new_epoch()
        batch = self._next_local()
        if self.length is None:
            more = self.group.max([1.0 if batch is not None else 0.0])[0] > 0
            if not more:
                return None
        self.read += 1
        self.in_epoch += 1
        self.at_epoch_end = self.length is not None and self.in_epoch == self.length
        if self.at_epoch_end and self.source is not None:
            self._check_no_more()
        if batch is None or batch is _NO_DATA:
            return _NO_DATA
        if self.device is not None and self.device.type != "cpu":
            inputs = {k: v.to(self.device) for k, v in batch.inputs.items()}
            return Batch(inputs, tuple(t.to(self.device) for t in batch.targets))
        return batch

    def _new_epoch(self) -> None:
        if self.epoch == 1:
            self.gave = self.in_epoch
        self.epoch, self.in_epoch, self._it = self.epoch + 1, 0, None

    def _next_local(self) -> Batch | None:
        if self.source is None:
            return None if self.length is None else _NO_DATA
        if self._it is None:
            self._it = self.source.epoch()
        batch = next(self._it, None)
        if (
            batch is None
            and self.length is None
            and self.in_epoch > 0
            and (self.epochs is None or self.epoch < self.epochs)
        ):
            self._new_epoch()
            self._it = self.source.epoch()
            batch = next(self._it, None)
        if batch is None and self.in_epoch == 0:
            raise PipecompileError(empty_data(self.source, self.epoch, self.gave))
        if batch is None and self.length is not None:
            raise PipecompileError(_length_mismatch(self.source, self.epoch, self.in_epoch))
        return batch

    def _check_no_more(self) -> None:
        """At the end of an epoch of known length: the data must end there too."""
        assert self._it is not None and self.source is not None
        extra = 0
        while extra < _COUNT_AT_MOST and next(self._it, None) is not None:
            extra += 1
        if extra:
            yielded = self.in_epoch + extra
            more = "at least " if extra == _COUNT_AT_MOST else ""
            raise PipecompileError(_length_mismatch(self.source, self.epoch, yielded, more))


_NO_DATA = Batch({}, ())


_COUNT_AT_MOST = 10_000  # batches past its len() counted for the message


def empty_data(source: BatchSource, epoch: int, first_gave: int) -> str:
    """The message for an epoch of ``source`` that yielded no batch."""
    if epoch == 1:
        return (
            f"{source.label} yielded no batches; it must give at least one (inputs, targets) "
            "mini-batch"
        )
    return (
        f"{source.label} yielded no batches in epoch {epoch} (epoch 1 gave {first_gave}): the "
        f"iterable was used up by the first pass; {source.again}"
    )


def _length_mismatch(source: BatchSource, epoch: int, yielded: int, more: str = "") -> str:
    return (
        f"{source.label} yielded {more}{yielded} batches in epoch {epoch} but its len() is "
        f"{source.length}; make __len__ return the number of batches __iter__ yields (or drop "
        "__len__)"
    )


def epoch_length(data: BatchSource | None, group: Group) -> int | None:
    """Batches per epoch, agreed by every rank (ranks without data learn it from the others);
    None if the hook's iterable has no length."""
    mine = data.length if data is not None and data.length is not None else -1
    agreed = int(group.max([float(mine)])[0])
    return agreed if agreed >= 0 else None


def total_steps(options: TrainFlags, length: int | None) -> int | None:
    if options.epochs is None:
        return options.steps if options.steps is not None else 1
    if length is None:
        return options.steps  # None: until the data ends --epochs times
    by_epochs = math.ceil(options.epochs * length / options.accumulate)
    return min(by_epochs, options.steps) if options.steps is not None else by_epochs


def first_only(source: BatchSource | None) -> BatchSource | None:
    """``source``'s first batch as a source of its own (None on a rank without data)."""
    if source is None:
        return None
    first = source.peek()
    if first is None:
        raise PipecompileError(empty_data(source, 1, 0))
    return BatchSource(lambda: iter([first]), 1, source.label, source.again)


def agreed_sizes(
    batch: Batch | None, feed: Any, group: Group, dynamic: DynamicDims
) -> dict[str, int] | None:
    """Under --nproc, the ranks that read ``feed``'s last batch must have read the same one
    (None: this copy has none this time). Returns the batch's sizes of the dimensions
    compiled ``--dynamic`` as its readers saw them (None: none, or one process)."""
    if isinstance(group, LocalGroup):
        return None
    mine = dynamic.sizes_of(batch.inputs) if batch is not None else {}
    sizes = [mine.get(s, 0) for s in dynamic.symbols]
    found = agree_on_batch(batch, feed.source, feed.in_epoch - 1, feed.epoch, group, sizes)
    return dict(zip(dynamic.symbols, found)) if found and dynamic.symbols else None
