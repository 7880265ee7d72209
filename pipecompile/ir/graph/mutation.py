"""Which values an fx node writes in place: `nn.ReLU(inplace=True)`, `x.add_(y)`, `x += y`,
`x[mask] = 0`, `F.relu(x, inplace=True)`, or an aten op whose schema writes an argument."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

__all__ = ["mutated_inputs", "mutates", "storage_of"]

_WRITES_FIRST = {
    operator.iadd,
    operator.isub,
    operator.imul,
    operator.itruediv,
    operator.ifloordiv,
    operator.imod,
    operator.ipow,
    operator.iand,
    operator.ior,
    operator.ixor,
    operator.setitem,
}


def mutated_inputs(node: fx.Node) -> list[fx.Node]:
    """The input nodes ``node`` writes in place (empty for a pure op)."""
    if node.op == "call_module":
        root = node.graph.owning_module
        module = root.get_submodule(str(node.target)) if root is not None else None
        return _first_arg(node) if getattr(module, "inplace", False) is True else []
    if node.op == "call_method":
        name = str(node.target)
        return _first_arg(node) if name.endswith("_") and not name.startswith("__") else []
    if node.op != "call_function":
        return []
    schema = getattr(node.target, "_schema", None)
    if schema is not None:  # an aten overload: its schema says which arguments it writes
        written = [
            k
            for k, arg in enumerate(schema.arguments)
            if arg.alias_info is not None and arg.alias_info.is_write
        ]
        return [
            node.args[k]
            for k in written
            if k < len(node.args) and isinstance(node.args[k], fx.Node)
        ]
    if node.target in _WRITES_FIRST or node.kwargs.get("inplace") is True:
        return _first_arg(node)
    name = getattr(node.target, "__name__", "")
    return _first_arg(node) if name.endswith("_") and not name.startswith("__") else []


def mutates(node: fx.Node) -> bool:
    """Whether ``node`` writes a value in place or has another side effect."""
    return node.is_impure() or bool(mutated_inputs(node))


def _first_arg(node: fx.Node) -> list[fx.Node]:
    first = node.args[0] if node.args else None
    return [first] if isinstance(first, fx.Node) else []


def storage_of(node: fx.Node) -> int | None:
    """The identity of the storage behind ``node``'s (fake) value: a view shares its base's,
    so a write through a view is a write to every node with the same storage."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return value.untyped_storage()._cdata
    except (NotImplementedError, RuntimeError):  # e.g. a sparse or functional wrapper
        return None
