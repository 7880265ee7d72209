"""Mixed precision: autocast inside each stage, fp32 master weights, low-precision traffic,
and dynamic loss scaling for fp16.

Parameters and optimizer state stay fp32; each stage forward (and its recomputation, and the
loss) runs under ``torch.autocast`` in the run's dtype. Floating-point values crossing a
stage boundary are sent in that dtype, and so are their gradients, which halves the traffic;
the sender's cast stays in its autograd graph, so the gradient reaches fp32 again there.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pipecompile.options.run import PRECISION_NAMES

__all__ = ["PRECISIONS", "LossScaler", "autocast", "device_of", "for_wire"]

PRECISIONS: dict[str, torch.dtype | None] = dict(
    zip(PRECISION_NAMES, (None, torch.bfloat16, torch.float16))
)


def autocast(dtype: torch.dtype | None, device: torch.device) -> AbstractContextManager[Any]:
    """``torch.autocast`` for ``dtype`` on ``device``'s type, or nothing for fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def device_of(module: nn.Module | None) -> torch.device:
    """Where ``module``'s parameters live (the CPU for none): the device autocast is for."""
    param = next(module.parameters(), None) if module is not None else None
    return param.device if param is not None else torch.device("cpu")


def for_wire(value: Any, dtype: torch.dtype | None) -> Any:
    """``value`` as it crosses a stage boundary: a wider floating-point tensor in ``dtype``."""
    if (
        dtype is not None
        and isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.element_size() > dtype.itemsize
    ):
        return value.to(dtype)
    return value


@dataclass
class LossScaler:
    """fp16's dynamic loss scale: the loss is multiplied by ``scale`` before backward and the
    gradients divided by it after. A step whose gradients overflow (on any rank) is skipped
    and the scale halved; after ``interval`` clean steps in a row it doubles."""

    scale: float = 2.0**16
    interval: int = 2000
    clean: int = 0

    def update(self, overflow: bool) -> None:
        if overflow:
            self.scale = max(self.scale / 2, 1.0)
            self.clean = 0
            return
        self.clean += 1
        if self.clean >= self.interval:
            self.scale *= 2
            self.clean = 0

    def state_dict(self) -> dict[str, float]:
        return {"scale": self.scale, "clean": self.clean}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.scale, self.clean = float(state["scale"]), int(state["clean"])
