"""Values that may cross a stage boundary: tensors (sent) and literals (written into code)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = [
    "tensor_leaves",
    "is_literal",
    "is_transferable",
    "literal",
    "non_tensor_input",
    "NoneField",
    "without_nones",
]

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


class NoneField:
    """An output field that is None (a Hugging Face output's unset ``hidden_states``): in a
    pytree spec, a node of no leaves whose value is None, so that the graph returns computed
    values only and the spec puts the Nones back."""


pytree.register_pytree_node(
    NoneField,
    lambda _: ([], None),
    lambda _values, _context: None,
    serialized_type_name=f"{__name__}.NoneField",
)


def tensor_leaves(output: Any) -> list[torch.Tensor]:
    """A model output's tensors, in pytree order: its fields left None are no values (the
    stages return the computed ones only, see ``NoneField``)."""
    return [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]


def without_nones(flat: list[Any], spec: pytree.TreeSpec) -> tuple[list[Any], pytree.TreeSpec]:
    """``flat`` (a graph's outputs, as ``spec`` orders them) without its None leaves, and the
    spec that puts them back (``NoneField``)."""
    if not any(value is None for value in flat):
        return flat, spec
    marked = [NoneField() if value is None else value for value in flat]
    leaves, new = pytree.tree_flatten(pytree.tree_unflatten(marked, spec))
    return leaves, new
