"""Values that may cross a stage boundary: tensors (sent) and literals (written into code)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["is_literal", "is_transferable", "literal", "non_tensor_input"]

_SCALARS = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.memory_format)


def is_literal(value: Any) -> bool:
    """A value codegen can write into source: scalars, dtypes, devices, sizes and tuples of them."""
    if isinstance(value, (tuple, list, torch.Size)):
        return all(is_literal(v) for v in value)
    return isinstance(value, _SCALARS)


def is_transferable(value: Any) -> bool:
    """A value a stage boundary can carry: one tensor, or a literal."""
    return isinstance(value, torch.Tensor) or is_literal(value)


def literal(value: Any) -> Any:
    """The value as plain Python (a torch.Size becomes a tuple) for use as an fx argument."""
    if isinstance(value, torch.Size):
        return tuple(int(v) for v in value)
    if isinstance(value, (tuple, list)):
        return type(value)(literal(v) for v in value)
    return value


def non_tensor_input(named: dict[str, Any]) -> str | None:
    """What is wrong with the first example input that is not a tensor, or None."""
    for name, value in named.items():
        if not isinstance(value, torch.Tensor):
            return (
                f"example input {name!r} is a {type(value).__name__}, not a tensor; pass only "
                "tensors (fix options such as use_cache when building the model)"
            )
    return None
