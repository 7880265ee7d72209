"""Whether a loss function mixes the samples of its batch.

A run that splits its batch (micro-batches, ``--dp`` copies, ``--accumulate`` parts) calls
``loss_fn`` on each part and averages the parts' losses by their rows: that equals the loss of
the whole batch only when the loss is a mean of per-sample terms. A contrastive loss (CLIP's
logits of every image against every text of the batch) or a loss summed over the batch is not:
the run would train another objective. ``loss_mix`` calls the loss on a batch's outputs and on
their two halves and says how the whole batch's loss differs from the rows' mean of the
halves' (the compile asks it of the model file's loss, ``surfaces/loss_probe``; a pipeline's
first step of a split batch asks it of the loss it is given, ``Pipeline.train_step``). The
loss is called under ``torch.no_grad()``, three times (six where it cannot run in float64).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = ["loss_mix", "RTOL", "RTOL_OWN"]

RTOL = 1e-9  # of the loss, in float64: far above its rounding (~1e-15)
RTOL_OWN = 1e-4  # in the outputs' own dtype, for a loss that cannot run in float64
LossCall = Callable[[Any, Sequence[Any]], torch.Tensor]  # (output, targets) -> the loss


def loss_mix(call: LossCall, output: Any, targets: Sequence[Any]) -> str | None:
    """How the loss ``call(output, targets)`` of a batch (batch first) differs from the rows'
    mean of its two halves' losses, or None where it is that mean (or the batch has one
    row, or the loss fails on a half: no claim is made)."""
    rows = _rows(output)
    if rows is None or rows < 2:
        return None
    found = _losses(call, _double(output), [_double(t) for t in targets], rows)
    rtol = RTOL
    if found is None:  # a loss that cannot run in float64: its own dtype, a looser bound
        found, rtol = _losses(call, output, targets, rows), RTOL_OWN
    if found is None:
        return None
    whole, first, second = found
    half = rows // 2
    mean = (first * half + second * (rows - half)) / rows
    bound = rtol * max(abs(whole), abs(first), abs(second), 1e-12)
    if abs(whole - mean) <= bound:
        return None
    what = "sums" if abs(whole - (first + second)) <= bound else "mixes"
    return (
        f"on {rows} rows it gives {whole:.6g}, and the rows' mean of its two halves' losses "
        f"is {mean:.6g}: it {what} {'over the batch' if what == 'sums' else 'the samples'}"
    )


def _losses(
    call: LossCall, output: Any, targets: Sequence[Any], rows: int
) -> tuple[float, float, float] | None:
    """The losses of the whole batch and of its two halves (None if one fails)."""
    half = rows // 2
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the loss's own warnings on a part are no news
        found = [
            _loss(call, output, targets, rows, part)
            for part in (slice(0, rows), slice(0, half), slice(half, rows))
        ]
    whole, first, second = found
    if whole is None or first is None or second is None:
        return None
    if not all(math.isfinite(v) for v in (whole, first, second)):
        return None  # a NaN or inf says nothing of how the loss weighs the samples
    return whole, first, second


def _double(value: Any) -> Any:
    """``value`` with every floating tensor in float64."""

    def up(t: Any) -> Any:
        return t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    return pytree.tree_map(up, value)


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
    return float(loss.detach())
