"""Names of parameters: the original model's aliases of a tensor, and stage attribute names."""

from __future__ import annotations

import re

from torch import nn

__all__ = ["alias_names", "attribute_name"]


def alias_names(model: nn.Module) -> dict[int, tuple[str, ...]]:
    """id(tensor) -> every name under which ``model`` holds it (several for tied parameters)."""
    names: dict[int, list[str]] = {}
    for name, tensor in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(tensor), []).append(name)
    for name, buffer in model.named_buffers(remove_duplicate=False):
        names.setdefault(id(buffer), []).append(name)
    return {key: tuple(value) for key, value in names.items()}


def attribute_name(target: str, *, taken: set[str]) -> str:
    """A Python identifier for an original dotted name, distinct from those in ``taken``."""
    base = re.sub(r"\W", "_", target).strip("_") or "attr"
    if base[0].isdigit():
        base = "p_" + base
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    return name
