"""Whether a loss function mixes the samples of its batch.

A run that splits its batch (micro-batches, ``--dp`` copies, ``--accumulate`` parts) calls
``loss_fn`` on each part and averages the parts' losses by their rows: that equals the loss of
the whole batch only when the loss is a mean of per-sample terms. A contrastive loss (CLIP's
logits of every image against every text of the batch) or a loss summed over the batch is not:
the run would train another objective. ``loss_mix`` calls the loss on a batch's outputs and on
their two halves and says how the whole batch's loss differs from the rows' mean of the
halves' (the compile asks it of the model file's loss, ``surfaces/loss_probe``; a pipeline's
first step of a split batch asks it of the loss it is given, ``Pipeline.train_step``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = ["loss_mix", "RTOL"]

RTOL = 1e-4  # of the loss: far above rounding (~1e-7), far below a mixed loss's change
LossCall = Callable[[Any, Sequence[Any]], torch.Tensor]  # (output, targets) -> the loss


def loss_mix(call: LossCall, output: Any, targets: Sequence[Any]) -> str | None:
    """How the loss ``call(output, targets)`` of a batch (batch first) differs from the rows'
    mean of its two halves' losses, or None where it is that mean (or the batch has one
    row, or the loss fails on a half: no claim is made)."""
    rows = _rows(output)
    if rows is None or rows < 2:
        return None
    half = rows // 2
    with torch.no_grad():
        whole = _loss(call, output, targets, rows, slice(0, rows))
        first = _loss(call, output, targets, rows, slice(0, half))
        second = _loss(call, output, targets, rows, slice(half, rows))
    if whole is None or first is None or second is None:
        return None
    mean = (first * half + second * (rows - half)) / rows
    bound = RTOL * max(abs(whole), abs(first), abs(second), 1e-12)
    if abs(whole - mean) <= bound:
        return None
    what = "sums" if abs(whole - (first + second)) <= bound else "mixes"
    return (
        f"on {rows} rows it gives {whole:.6g}, and the rows' mean of its two halves' losses "
        f"is {mean:.6g}: it {what} {'over the batch' if what == 'sums' else 'the samples'}"
    )


def _rows(output: Any) -> int | None:
    sizes = [t.shape[0] for t in pytree.tree_leaves(output) if _batched(t)]
    return sizes[0] if sizes else None


def _batched(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0


def _loss(
    call: LossCall, output: Any, targets: Sequence[Any], rows: int, part: slice
) -> float | None:
    """The loss of the rows ``part`` of every value of ``rows`` rows (None where it fails
    on a part: the step itself called it on the whole, so no claim is made)."""

    def cut(value: Any) -> Any:
        if _batched(value) and value.shape[0] == rows:
            return value[part]
        return value

    try:
        loss = call(pytree.tree_map(cut, output), [cut(t) for t in targets])
    except Exception:  # a loss that cannot take a part (a fixed batch size): no claim
        return None
    return float(loss.detach().float())
