"""Whether the loss function mixes the samples of its batch, checked on a run's first step.

A run that splits its batch (micro-batches, ``--dp`` copies, ``--accumulate`` parts) calls
``loss_fn`` on each part and averages the parts' losses by their rows: that equals the loss of
the whole batch only when the loss is a mean of per-sample terms. A contrastive loss (CLIP's
logits of every image against every text of the batch) or a loss summed over the batch is not:
the run would train another objective. The rank holding the last stage calls ``loss_fn`` on
its first step's outputs joined (the values it computed anyway) and on their two halves; a
whole-batch loss that is not the rows' mean of the halves' is refused, naming ``loss_fn``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from pipecompile.errors import ModelFileError
from pipecompile.runtime.executor import LossFn, call_loss_fn, defined_at

__all__ = ["check_loss_split", "loss_mix", "RTOL"]

RTOL = 1e-4  # of the loss: far above rounding (~1e-7), far below a mixed loss's change


def loss_mix(loss_fn: LossFn, output: Any, targets: Sequence[Any]) -> str | None:
    """How ``loss_fn``'s loss over ``output`` and ``targets`` (a batch, batch first) differs
    from the rows' mean of its two halves' losses, or None where it is that mean (or the
    batch has one row, or ``loss_fn`` fails on a half: no claim is made)."""
    rows = _rows(output)
    if rows is None or rows < 2:
        return None
    half = rows // 2
    with torch.no_grad():
        whole = _loss(loss_fn, output, targets, rows, slice(0, rows))
        first = _loss(loss_fn, output, targets, rows, slice(0, half))
        second = _loss(loss_fn, output, targets, rows, slice(half, rows))
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


def check_loss_split(loss_fn: LossFn, output: Any, targets: Sequence[Any], *, split: str) -> None:
    """Refuse a ``loss_fn`` that is not a mean over the samples of its batch (``loss_mix``)
    in a run that splits the batch as ``split`` says (``4 micro-batches``).

    Raises:
        ModelFileError: naming ``loss_fn``'s file and line, the losses, and what to do.
    """
    mix = loss_mix(loss_fn, output, targets)
    if mix is None:
        return
    why = (
        "return the mean over the batch instead of the sum"
        if "sums" in mix
        else "a loss over the whole batch (a contrastive loss) runs exactly when the model "
        "file defines loss_fn and example_targets() at compile: the compile then computes it "
        "once a step on all micro-batches' outputs (--schedule gpipe or looped_bfs); or "
        "compute the whole batch in one part (--microbatches 1, no --dp or --accumulate)"
    )
    raise ModelFileError(
        f"loss_fn ({defined_at(loss_fn)}) is not a mean over the samples of its batch: {mix}. "
        f"The run splits each batch ({split}) and averages the parts' losses, so it would "
        f"train another objective than the model's; {why}"
    )


def _rows(output: Any) -> int | None:
    sizes = [t.shape[0] for t in pytree.tree_leaves(output) if _batched(t)]
    return sizes[0] if sizes else None


def _batched(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0


def _loss(
    loss_fn: LossFn, output: Any, targets: Sequence[Any], rows: int, part: slice
) -> float | None:
    """``loss_fn`` on the rows ``part`` of every value of ``rows`` rows (None where it fails
    on a part: the step itself called it on the whole, so no claim is made)."""

    def cut(value: Any) -> Any:
        if _batched(value) and value.shape[0] == rows:
            return value[part]
        return value

    try:
        loss = call_loss_fn(loss_fn, pytree.tree_map(cut, output), [cut(t) for t in targets])
    except ModelFileError:
        return None
    return float(loss.detach().float())
