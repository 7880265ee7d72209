"""Evaluation during a run: when it is due, and the mean loss over an epoch of
``eval_batches()``, forward only, the stages in eval mode."""

from __future__ import annotations

import math

from pipecompile.errors import PipecompileError
from pipecompile.options.run import TrainFlags
from pipecompile.runtime.executor import LossFn
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.training.diagnosis import in_batch
from pipecompile.runtime.training.eval_loss import batch_loss
from pipecompile.runtime.training.feed import Feed, agreed_sizes
from pipecompile.runtime.training.group import Group

__all__ = ["eval_due", "evaluate"]


def eval_due(options: TrainFlags, step: int, total: int | None, feed: Feed) -> bool:
    if options.eval_every:
        return step % options.eval_every == 0 or step == total
    return feed.at_epoch_end or step == total


def evaluate(
    pipe: Pipeline,
    loss_fn: LossFn,
    data: Feed,
    group: Group,
    reads: tuple[bool, bool],
    when: str,
) -> float:
    """Mean loss over ``data`` (one epoch of eval_batches()) with the stages in eval mode (no
    dropout), forward only. A failure names the batch and ``when`` it was evaluated."""
    modes = [(m, m.training) for m in pipe.modules if m is not None]
    for module, _ in modes:
        module.eval()
    total = count = 0.0
    try:
        while (batch := data.next()) is not None:
            sizes = agreed_sizes(batch, data, group, pipe.manifest.dynamic)
            try:
                output = pipe(batch.inputs if reads[0] else None, sizes=sizes)
                if reads[1]:
                    part, counted = batch_loss(pipe, loss_fn, output, batch)
                    total, count = total + part, count + counted
            except PipecompileError as err:
                raise in_batch(err, pipe, data, batch, when) from err
    finally:
        for module, training in modes:
            module.train(training)
    total, count = group.sum([total, count])
    return total / count if count else math.nan
