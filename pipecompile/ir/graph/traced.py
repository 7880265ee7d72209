"""The front end's result: a model captured as an fx graph, with what it takes and returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

__all__ = ["Traced"]


@dataclass(frozen=True)
class Traced:
    """A captured model. The graph's output node returns a flat tuple; ``output_spec`` rebuilds
    the model's output structure from it. Every node carries ``meta["val"]`` (fake values)."""

    module: fx.GraphModule
    tracer: str
    input_names: tuple[str, ...]
    output_spec: pytree.TreeSpec
    root: nn.Module
