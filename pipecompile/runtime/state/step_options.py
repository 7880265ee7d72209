"""What one train step is asked beyond its batch: the knobs the training loop, gradient
accumulation, data-parallel copies and the autograd bridge turn (``Pipeline.train_step``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipecompile.runtime.state.whole_loss import Gather

__all__ = ["StepOptions", "PLAIN_STEP"]


@dataclass(frozen=True)
class StepOptions:
    """``loss_scale`` overrides each micro-batch's loss scale (default: 1/m for a synchronous
    program, the update window's share for an asynchronous one); ``keep_grads`` leaves the
    gradients on the stages' parameters instead of stepping and zeroing them; ``rng_base``
    seeds every stage forward's random ops per (stage, micro-batch), and a recomputed forward
    the same (None: drawn from torch's global generator); ``on_backward(j, last)`` is called
    before each backward of stage j (``last``: its last of the step); ``rows``: the batch's
    rows where a rank reads no inputs; ``weigh_rows``: a synchronous step weighs each
    micro-batch's loss by its share of the rows (the gradient is the mean over all rows
    whatever their split); ``sizes``: the batch's sizes of the dimensions compiled
    ``--dynamic`` where a rank reads no data; ``splits``: how else the run splits its batch
    (the loop's ``--dp`` copies and ``--accumulate`` parts), for the first step's check that
    the loss is a mean over the samples (``Pipeline.train_step``); ``gather``: under --dp, how
    the last stage gathers every copy's outputs and targets for a loss over the whole batch
    (``runtime/state/whole_loss``)."""

    loss_scale: float | None = None
    keep_grads: bool = False
    rng_base: int | None = None
    on_backward: Callable[[int, bool], None] | None = None
    rows: int | None = None
    weigh_rows: bool = True
    sizes: dict[str, int] | None = None
    splits: tuple[str, ...] = ()
    gather: Gather | None = None  # --dp: every copy's values for a loss over the whole batch


PLAIN_STEP = StepOptions()  # a step as the API's user runs it
