"""A batch-coupled tail cut off a model (``frontend/tail_cut``): run once a step on the
micro-batches' values joined, on the last stage's device."""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx
from torch.utils import _pytree as pytree

__all__ = ["Tail"]


@dataclass(frozen=True)
class Tail:
    """The graph run once a step on the joined values ``inputs`` (the body's outputs, in
    order), returning the model's flat outputs (named ``outputs``), which ``output_spec``
    rebuilds."""

    module: fx.GraphModule
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    output_spec: pytree.TreeSpec
