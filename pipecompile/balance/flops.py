"""Forward FLOPs of one fx node: exact for contractions, output numel for everything else.

Contractions (linear, matmul and friends, convolution, attention, einsum) are re-run on their
fake inputs under ``torch.utils.flop_counter.FlopCounterMode``, so they count exactly what
torch's own FLOP formulas count. Other ops cost the number of elements they write; views and
metadata ops cost nothing.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils.flop_counter import FlopCounterMode

from pipecompile.ir.graph.swapped_call import functional_call

__all__ = ["node_flops", "is_contraction", "is_convolution"]

aten = torch.ops.aten

_CONVOLUTION_FUNCTIONS = {
    F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d,
}  # fmt: skip
_CONVOLUTION_ATEN = {
    aten.conv1d, aten.conv2d, aten.conv3d, aten.convolution, aten._convolution,
    aten.conv_transpose1d, aten.conv_transpose2d, aten.conv_transpose3d,
}  # fmt: skip
_CONVOLUTION_MODULES = (
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
)  # fmt: skip
_CONTRACTION_FUNCTIONS = _CONVOLUTION_FUNCTIONS | {
    F.linear, torch._C._nn.linear, torch.matmul, operator.matmul, torch.mm, torch.bmm,
    torch.addmm, torch.baddbmm, torch.einsum, F.scaled_dot_product_attention, F.bilinear,
}  # fmt: skip
_CONTRACTION_ATEN = _CONVOLUTION_ATEN | {
    aten.linear, aten.matmul, aten.mm, aten.bmm, aten.addmm, aten.baddbmm, aten.einsum,
    aten.scaled_dot_product_attention, aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_efficient_attention, aten.bilinear,
}  # fmt: skip
_CONTRACTION_METHODS = {"matmul", "mm", "bmm", "addmm", "baddbmm", "__matmul__"}
_CONTRACTION_MODULES = (
    *_CONVOLUTION_MODULES, nn.Linear, nn.Bilinear, nn.MultiheadAttention,
)  # fmt: skip
_FREE_METHODS = {
    "view", "reshape", "transpose", "permute", "expand", "size", "dim", "flatten",
    "unsqueeze", "squeeze", "contiguous", "t", "split", "chunk", "unbind", "view_as", "type_as",
}  # fmt: skip
_FREE_FUNCTIONS = {getattr, operator.getitem, torch.flatten, torch.reshape, torch.transpose}
_FREE_ATEN = {
    aten.view, aten._unsafe_view, aten.reshape, aten.transpose, aten.permute, aten.expand,
    aten.unsqueeze, aten.squeeze, aten.t, aten.split, aten.split_with_sizes, aten.slice,
    aten.select, aten.alias, aten.detach, aten.contiguous, aten.unbind, aten.chunk,
    aten._assert_tensor_metadata, aten.sym_size, aten.lift_fresh_copy,
}  # fmt: skip


def is_contraction(node: fx.Node, root: nn.Module) -> bool:
    """Whether the node is an op whose FLOPs are counted exactly (matmul-like, conv, attention)."""
    if node.op == "call_module":
        return isinstance(root.get_submodule(str(node.target)), _CONTRACTION_MODULES)
    if node.op == "call_method":
        return node.target in _CONTRACTION_METHODS
    if node.op == "call_function":
        packet = getattr(node.target, "overloadpacket", None)
        return node.target in _CONTRACTION_FUNCTIONS or packet in _CONTRACTION_ATEN
    return False


def is_convolution(node: fx.Node, root: nn.Module) -> bool:
    """Whether the node is a convolution (a contraction the cost model prices at its own,
    calibrated, efficiency)."""
    if node.op == "call_module":
        return isinstance(root.get_submodule(str(node.target)), _CONVOLUTION_MODULES)
    if node.op == "call_function":
        packet = getattr(node.target, "overloadpacket", None)
        return node.target in _CONVOLUTION_FUNCTIONS or packet in _CONVOLUTION_ATEN
    return False


def node_flops(node: fx.Node, root: nn.Module) -> int:
    """Forward FLOPs of ``node``; needs ``meta["val"]`` on the node and its inputs."""
    if node.op not in ("call_function", "call_method", "call_module"):
        return 0
    if is_contraction(node, root):
        return _counted_flops(node, root)
    if _is_free(node):
        return 0
    return sum(t.numel() for t in pytree.tree_leaves(node.meta.get("val")) if _is_tensor(t))


def _is_free(node: fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in _FREE_METHODS
    packet = getattr(node.target, "overloadpacket", None)
    return node.target in _FREE_FUNCTIONS or packet in _FREE_ATEN


def _counted_flops(node: fx.Node, root: nn.Module) -> int:
    args, kwargs = pytree.tree_map_only(fx.Node, lambda n: n.meta["val"], (node.args, node.kwargs))
    fake_mode = next(
        (t.fake_mode for t in pytree.tree_leaves((args, kwargs)) if hasattr(t, "fake_mode")), None
    )
    counter = FlopCounterMode(display=False)
    with fake_mode or torch.device("meta"), counter:
        _run(node, root, args, kwargs, fake_mode)
    return int(counter.get_total_flops())


def _run(node: fx.Node, root: nn.Module, args: Any, kwargs: Any, fake_mode: Any) -> None:
    if node.op == "call_module":
        module = root.get_submodule(str(node.target))
        convert = fake_mode.from_tensor if fake_mode else (lambda t: t.to("meta"))
        state = {k: convert(v) for k, v in module.state_dict(keep_vars=True).items()}
        functional_call(module, state, tuple(args), dict(kwargs))
    elif node.op == "call_method":
        getattr(args[0], str(node.target))(*args[1:], **kwargs)
    else:
        node.target(*args, **kwargs)  # type: ignore[operator]


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)
