"""What one run of a program on a mini-batch gave (``Pipeline.train_step``, and inference):
returned by the step and kept as the pipeline's ``last``, instead of loose attributes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipecompile.runtime.state.stats import RunStats

__all__ = ["StepResult"]


@dataclass(frozen=True)
class StepResult:
    """One step (or inference) of the program in this process.

    Attributes:
        loss: the mini-batch's mean loss (NaN where the last stage runs in another process,
            and for inference).
        outputs: the last stage's outputs per micro-batch, in order ([] where the last stage,
            or part of its micro-batches, runs in another process).
        losses: micro-batch -> its scaled loss, for the micro-batches whose loss this process
            computed.
        results: micro-batch -> its outputs, for those this process's last stage ran.
        stats: what the interpreter measured (in-flight micro-batches, stored bytes, compute
            time per stage).
        sent_bytes: bytes the step sent between devices.
        rng_base: the base seed of its random ops (``runtime/random_state``): a step given it
            draws the same dropout masks.
    """

    loss: torch.Tensor
    outputs: list[tuple[torch.Tensor, ...]]
    losses: dict[int, torch.Tensor]
    results: dict[int, tuple[torch.Tensor, ...]]
    stats: RunStats
    sent_bytes: int
    rng_base: int
