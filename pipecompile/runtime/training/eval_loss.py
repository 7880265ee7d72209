"""One eval batch's loss on a process that holds the last stage, and whether it counts the batch.

Where the process ran the last stage for every micro-batch, the loss is ``loss_fn`` on the
whole batch's output, as a local run computes it. Replica k of r of a replicated last stage
(``--replicate ...,r`` under ``--nproc``) holds only the micro-batches i with i mod r == k: it
adds each one's loss weighted by its share of the batch's rows, as a training step weighs
them, so the replicas' parts sum to the batch's loss for a loss that is a mean over rows (the
loss a training step reports); the replica holding micro-batch 0 counts the batch.
"""

from __future__ import annotations

from typing import Any

import torch

from pipecompile.ir.graph.microbatch import batch_rows, row_shares, split_targets
from pipecompile.model.data_hooks import Batch
from pipecompile.runtime.executor import LossFn, call_loss_fn
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.state.precision import autocast, device_of

__all__ = ["batch_loss"]


def batch_loss(pipe: Pipeline, loss_fn: LossFn, output: Any, batch: Batch) -> tuple[float, int]:
    """(this process's part of ``batch``'s loss, 1 if it counts the batch else 0), after
    ``output = pipe(batch.inputs)`` ran here; ``batch`` holds the targets.

    Raises:
        MicrobatchError: the targets do not split in step with the inputs' rows.
        ModelFileError: ``loss_fn`` failed or returned no scalar.
    """
    last = pipe.modules[pipe.layout.last]
    with torch.no_grad(), autocast(pipe.precision, device_of(last)):
        if output is not None:
            return float(call_loss_fn(loss_fn, output, batch.targets)), 1
        held = pipe.held_outputs()
        if not held:
            return 0.0, 0
        count = pipe.program.microbatches
        rows = batch_rows(batch.inputs, pipe.manifest.batch_dim)
        assert rows is not None, "the pipeline ran this batch, so it split into rows"
        targets = split_targets(batch.targets, count, rows=rows)  # as a step splits them
        shares = row_shares(rows, count)
        part = sum(
            shares[i] / count * float(call_loss_fn(loss_fn, out, targets[i]))
            for i, out in held.items()
        )
    return part, int(0 in held)
