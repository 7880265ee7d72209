"""Whether the model file's loss function mixes the samples of its batch, found at compile.

The compile command has the model file's ``loss_fn`` and ``example_targets()``: it runs the
model once on the example (no autograd; its buffers and torch's random state as before) and
asks ``loss_mix`` (``runtime/state/loss_split``) whether the loss of the whole batch is the
rows' mean of its halves' losses. One that is not (a contrastive loss) is recorded as the
manifest's ``loss`` coupling, and every run computes it once a step on all micro-batches'
outputs joined.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from pipecompile.ir.records.batch_coupling import Coupling
from pipecompile.model.init_recipe import is_meta_model
from pipecompile.runtime.executor import call_loss_fn, defined_at
from pipecompile.runtime.state.loss_split import loss_mix

__all__ = ["loss_coupling"]


def loss_coupling(
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    loss_fn: Callable[..., torch.Tensor] | None,
    targets: Sequence[Any] | None,
) -> Coupling | None:
    """The ``loss`` coupling of ``loss_fn`` on ``model``'s outputs for ``inputs`` and
    ``targets``, or None: no loss, a model without weights, a loss that is a mean over the
    samples, or a model or loss that fails here (the compile and the run report those)."""
    if loss_fn is None or targets is None or is_meta_model(model):
        return None
    saved = {k: b.detach().clone() for k, b in model.named_buffers()}
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            output = model(**inputs)
            mix = loss_mix(lambda o, t: call_loss_fn(loss_fn, o, t), output, targets)
    except Exception:  # the compile's own trace and proof say what fails, and where
        return None
    finally:
        with torch.no_grad():
            for k, b in model.named_buffers():
                if k in saved:
                    b.copy_(saved[k])
    if mix is None:
        return None
    return Coupling("loss", f"loss_fn ({defined_at(loss_fn)}; {mix})")
