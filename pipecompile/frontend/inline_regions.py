"""Flatten grad-mode regions so every op of the model sits in one graph of plain ops.

torch.export wraps code that runs under ``torch.no_grad()`` (or ``enable_grad``) in
``higher_order.wrap_with_set_grad_enabled(enabled, submodule, *operands)``. Stages must be cut
through plain ops, so the region's ops are copied in place of the call; when the region had
gradients disabled its outputs are detached, which is exactly what no_grad meant for them.
torch.fx records no region at all: its tracer marks the ops it made with gradients disabled
(``meta[NO_GRAD]``), and their values are detached where ops outside the region read them.

A region that turns autocast off (``with torch.autocast(..., enabled=False)``, as timm's
EfficientViT attention does) is ``wrap_with_autocast(device, dtype, False, cache, submodule,
*operands)``: its ops run in their own dtypes, as plain ops do, so it is inlined too. A region
that turns autocast on is kept (and the trace refused), since its ops' dtypes would change.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

__all__ = ["NO_GRAD", "detach_no_grad_values", "inline_grad_regions"]

NO_GRAD = "pipecompile_no_grad"  # node.meta key: the op ran under torch.no_grad() when traced

_WRAP = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)
_AUTOCAST = getattr(torch.ops.higher_order, "wrap_with_autocast", None)


def inline_grad_regions(module: fx.GraphModule) -> None:
    """Replace every grad-mode region call and autocast-off region call in ``module`` (in
    place) by the region's ops."""
    for call in [n for n in module.graph.nodes if n.op == "call_function"]:
        if call.target is _WRAP:
            enabled, attr, *operands = call.args
            _inline(module, call, attr, operands, detach=not enabled)  # type: ignore[arg-type]
        elif call.target is _AUTOCAST and call.args[2] is False:
            attr, *operands = call.args[4:]
            _inline(module, call, attr, operands, detach=False)  # type: ignore[arg-type]
    for node in [n for n in module.graph.nodes if n.op == "get_attr" and not n.users]:
        if isinstance(getattr(module, str(node.target), None), fx.GraphModule):
            module.graph.erase_node(node)
            delattr(module, str(node.target))
    module.recompile()


def _inline(
    module: fx.GraphModule, call: fx.Node, attr: fx.Node, operands: list, *, detach: bool
) -> None:
    assert isinstance(attr, fx.Node)
    region: fx.GraphModule = getattr(module, str(attr.target))
    env: dict[fx.Node, object] = {}
    placeholders = [n for n in region.graph.nodes if n.op == "placeholder"]
    env.update(zip(placeholders, operands))
    results: list[object] = []
    with module.graph.inserting_before(call):
        for node in region.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                results = [_detached(module, r) if detach else r for r in _mapped(node, env)]
                break
            copied = module.graph.node_copy(node, lambda n: env[n])  # type: ignore[arg-type, return-value]
            if node.op == "get_attr":
                copied.target = f"{attr.target}.{node.target}"
            env[node] = copied
    for user in list(call.users):
        if user.target is not operator.getitem:
            raise RuntimeError(f"cannot inline region {attr.target}: {user.name} reads it whole")
        user.replace_all_uses_with(results[user.args[1]])  # type: ignore[arg-type, index]
        module.graph.erase_node(user)
    module.graph.erase_node(call)


def detach_no_grad_values(module: fx.GraphModule) -> None:
    """Detach (in place) every tensor made by a ``meta[NO_GRAD]`` node where a node outside
    the region reads it; needs ``meta["val"]``. Parameters read inside a region are get_attr
    nodes, never marked: reading a parameter under no_grad leaves it trainable."""
    for node in list(module.graph.nodes):
        outside = [u for u in node.users if not u.meta.get(NO_GRAD)]
        if not node.meta.get(NO_GRAD) or not outside:
            continue
        if not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        with module.graph.inserting_after(node):
            detached = module.graph.call_method("detach", (node,))
        detached.meta.update({k: v for k, v in node.meta.items() if k != NO_GRAD})
        for user in outside:
            user.replace_input_with(node, detached)
    module.recompile()


def _mapped(output: fx.Node, env: dict[fx.Node, object]) -> list[object]:
    values = output.args[0]
    values = values if isinstance(values, (tuple, list)) else (values,)
    return [env[v] if isinstance(v, fx.Node) else v for v in values]


def _detached(module: fx.GraphModule, value: object) -> object:
    if not isinstance(value, fx.Node) or not isinstance(value.meta.get("val"), torch.Tensor):
        return value
    detached = module.graph.call_function(torch.ops.aten.detach.default, (value,))
    detached.meta["val"] = value.meta["val"]
    return detached
