"""Find the view that hard-codes the example batch, which fails when traced on a micro-batch.

A model is traced on one micro-batch (the example's rows divided by the micro-batches), so
``x.view(8, -1)`` written for an example of 8 rows asks a micro-batch of 4 rows for 8: the view
fails, or the op after it. ``batch_view`` runs the model twice on fake tensors (no compute, the
model untouched): on the whole example and on the micro-batch. A ``view`` or ``reshape`` whose
first size is the example's rows in both runs, on a tensor of that many rows in the first and
of the micro-batch's in the second, is a constant where the batch's size belongs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode

from pipecompile.frontend.quiet_logs import quiet_logs
from pipecompile.ir.graph.swapped_call import functional_call

__all__ = ["BatchView", "batch_view", "constant_view"]

_VIEWS: dict[Callable[..., Any], str] = {
    torch.Tensor.view: "view",
    torch.Tensor.reshape: "reshape",
    torch.reshape: "reshape",
}


@dataclass(frozen=True)
class BatchView:
    """The first view sized by the example's ``example_rows`` traced on ``rows``: its
    ``call`` (view or reshape), the ``sizes`` it asks for, and ``error``, raised at the call
    (its traceback holds the model's line)."""

    call: str
    sizes: tuple[int, ...]
    rows: int
    example_rows: int
    error: BaseException


class _Found(Exception):
    pass


class _Views(TorchFunctionMode):
    """Numbers each view call; ``constant`` collects those asking for ``example_rows`` rows of
    a tensor of as many; with ``stop_at``, a call of that set on a tensor of ``rows`` rows
    raises ``_Found`` (the model's frame is in its traceback)."""

    def __init__(self, rows: int, example_rows: int, stop_at: set[int] | None = None) -> None:
        super().__init__()
        self.rows, self.example_rows, self.stop_at = rows, example_rows, stop_at
        self.calls = 0
        self.constant: set[int] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        call = _VIEWS.get(func)
        sizes = _sizes(args[1:], kwargs or {}) if call is not None else None
        if call is not None and sizes and isinstance(args[0], torch.Tensor) and args[0].dim():
            index, self.calls = self.calls, self.calls + 1
            if sizes[0] == self.example_rows:
                rows = args[0].shape[0]
                if self.stop_at is None and rows == self.example_rows:
                    self.constant.add(index)
                elif self.stop_at is not None and index in self.stop_at and rows == self.rows:
                    raise _Found(call, sizes)
        return func(*args, **(kwargs or {}))


def _sizes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, ...] | None:
    """The sizes a view or reshape asks for, when they are plain ints (else None)."""
    given = kwargs.get("shape", kwargs.get("size", args[0] if len(args) == 1 else args))
    if isinstance(given, int):
        given = (given,)
    if not isinstance(given, (tuple, list, torch.Size)) or not given:
        return None
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in given):
        return None
    return tuple(given)


def batch_view(
    model: nn.Module, inputs: dict[str, torch.Tensor], microbatches: int
) -> BatchView | None:
    """The view of ``model`` that hard-codes the example batch, when one does: ``inputs`` is
    one of ``microbatches`` micro-batches split along dim 0. None when nothing is found (or
    ``microbatches`` is 1)."""
    rows = next((t.shape[0] for t in inputs.values() if t.dim()), 0)
    example_rows = rows * microbatches
    if microbatches <= 1 or rows == 0:
        return None
    return constant_view(model, inputs, example_rows, rows)


def constant_view(
    model: nn.Module, inputs: dict[str, torch.Tensor], constant: int, other: int
) -> BatchView | None:
    """The first view of ``model`` that asks for ``constant`` rows of a tensor of as many when
    ``inputs`` have ``constant`` rows, and still does when they have ``other``: a batch size
    written into the model. None when there is none (or the model fails otherwise)."""
    whole = _Views(other, constant)
    try:
        _run(model, inputs, constant, whole)
    except Exception:  # the model fails on its own example: another mistake
        return None
    if not whole.constant:
        return None
    try:
        _run(model, inputs, other, _Views(other, constant, stop_at=whole.constant))
    except _Found as found:
        call, sizes = found.args
        return BatchView(call, sizes, other, constant, found)
    except Exception:  # it fails before such a view: not this mistake
        return None
    return None


def _run(model: nn.Module, inputs: dict[str, torch.Tensor], rows: int, views: _Views) -> None:
    """Run ``model`` on fake inputs of ``rows`` rows with ``views`` watching."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    with quiet_logs("torch._subclasses.fake_tensor"), mode:
        fake = {name: mode.from_tensor(t) for name, t in tensors.items()}
        shown = {k: _resized(v, rows) for k, v in inputs.items()}
        with views:
            functional_call(model, fake, (), shown)


def _resized(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """A fake tensor like ``tensor`` with ``rows`` rows (made inside the fake mode)."""
    if not tensor.dim():
        return torch.empty_like(tensor)
    shape = (rows, *tensor.shape[1:])
    return torch.zeros(shape, dtype=tensor.dtype, device=tensor.device)
