"""Refuse a traced graph whose matrix products mix floating dtypes (say float64 inputs into a
float32 layer): fake tensors accept them, but eager PyTorch raises, so such a compile could
never run."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from pipecompile.errors import TraceError

__all__ = ["check_dtypes"]

_aten = torch.ops.aten
# Ops whose floating operands must share one dtype (elementwise ops promote instead).
_PRODUCTS: set[Any] = {
    F.linear,
    F.conv1d,
    F.conv2d,
    F.conv3d,
    F.bilinear,
    torch.matmul,
    torch.mm,
    torch.bmm,
    torch.addmm,
    torch.baddbmm,
    torch.einsum,
    _aten.linear.default,
    _aten.mm.default,
    _aten.bmm.default,
    _aten.addmm.default,
    _aten.matmul.default,
    _aten.baddbmm.default,
    _aten.convolution.default,
    _aten.conv1d.default,
    _aten.conv2d.default,
    _aten.conv3d.default,
}


def check_dtypes(module: fx.GraphModule) -> None:
    """Raise TraceError naming the first node (and module path) that mixes floating dtypes.

    Requires ``node.meta["val"]`` on every node (fake propagation).
    """
    for node in module.graph.nodes:
        operands = _operands(module, node)
        dtypes = {t.dtype for t in operands if t.is_floating_point()}
        if len(dtypes) > 1:
            where = _module_path(node)
            names = " and ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
            raise TraceError(
                f"node {node.name}{where} mixes {names} operands, which eager PyTorch refuses; "
                "give example_inputs() in the model's dtype (for example .float()), or convert "
                "the model (model.to(dtype))"
            )


def _operands(module: fx.GraphModule, node: fx.Node) -> list[torch.Tensor]:
    values = [a.meta.get("val") for a in node.all_input_nodes]
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if node.op == "call_module":
        owned = module.get_submodule(str(node.target)).parameters(recurse=False)
        return tensors[:1] + list(owned) if tensors else []
    if node.op == "call_function" and node.target in _PRODUCTS:
        return tensors
    return []


def _module_path(node: fx.Node) -> str:
    if node.op == "call_module":
        return f" (module {node.target})"
    stack = node.meta.get("nn_module_stack")
    if stack:
        path = list(stack.values())[-1][0]
        return f" (module {path})" if path else ""
    return ""
