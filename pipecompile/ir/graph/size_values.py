"""Numbers computed from tensor sizes (``x.size(1)``, ``x.shape``, export's ``sym_size``, and
arithmetic on them): which tensors such a number reads its sizes from, so a stage that uses
it can compute it again from them when the sizes vary from batch to batch (``--dynamic``)."""

from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx

__all__ = ["size_sources"]

_aten = torch.ops.aten
SIZE_FUNCTIONS = {_aten.sym_size.int, _aten.sym_size.default, _aten.sym_numel.default}
SIZE_METHODS = {"size", "dim", "numel"}
ARITHMETIC = {
    operator.add,
    operator.sub,
    operator.mul,
    operator.floordiv,
    operator.truediv,
    operator.mod,
    operator.neg,
    operator.getitem,
    operator.pow,
    math.floor,
    math.ceil,
    torch.sym_int,
    torch.sym_float,
    torch.sym_max,
    torch.sym_min,
}


def size_sources(node: fx.Node) -> list[fx.Node] | None:
    """The tensors the number ``node`` computes reads sizes of, or None when it is no number
    of sizes (a value a tensor's data makes, a constant of another kind)."""
    if _reads_size(node):
        source = node.args[0]
        is_tensor = isinstance(source, fx.Node) and isinstance(source.meta.get("val"), torch.Tensor)
        return [source] if is_tensor else None  # type: ignore[list-item]
    if node.op != "call_function" or node.target not in ARITHMETIC:
        return None
    found: list[fx.Node] = []
    for arg in node.all_input_nodes:
        more = size_sources(arg)
        if more is None:
            return None
        found += more
    return found


def _reads_size(node: fx.Node) -> bool:
    if node.op == "call_function" and node.target in SIZE_FUNCTIONS:
        return True
    if node.op == "call_method" and node.target in SIZE_METHODS:
        return True
    return (
        node.op == "call_function"
        and node.target is getattr
        and len(node.args) > 1
        and node.args[1] == "shape"
    )
