"""``torch.func.functional_call`` that leaves recurrent modules as it found them.

An ``nn.RNN``/``LSTM``/``GRU`` keeps its weights a second time, in ``_flat_weights``, which it
refreshes when a weight is assigned. ``functional_call`` assigns the swapped-in tensors (so the
call itself is right) but puts the module's own back without that refresh: afterwards the module
still computes with the tensors of the call (fake ones after fake propagation, a copy after the
proof, an old version after a weight-stashed forward). Every functional call in pipecompile goes
through this one, which refreshes them after.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["functional_call"]


def functional_call(
    module: nn.Module,
    tensors: dict[str, torch.Tensor],
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    """``torch.func.functional_call(module, tensors, args, kwargs, **options)``, with every
    recurrent submodule's flat weights its own again afterwards."""
    try:
        return torch.func.functional_call(module, tensors, args, kwargs, **options)
    finally:
        for sub in module.modules():
            if isinstance(sub, nn.RNNBase):
                sub._init_flat_weights()
