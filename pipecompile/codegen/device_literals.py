"""Leave devices to where a stage runs: ``device=`` literals that tracing baked into the graph
(the device the model was traced on: ``meta`` for a model without weights, the CPU for one
that will run on a GPU) become the default device, read once per forward with
``torch.get_default_device()``: an aten-level factory op given ``device=None`` would mean the
CPU whatever the default, and a rank on a GPU runs its program with that GPU as the default.
``to(x, device, ...)`` keeps x's device; export's metadata assertions, which name the traced
device, are dropped."""

from __future__ import annotations

import torch
import torch.fx as fx

__all__ = ["drop_device_literals"]


def drop_device_literals(module: fx.GraphModule) -> None:
    """Rewrite ``module``'s graph in place (``module`` is emit's own lowered copy)."""
    graph = module.graph
    here: fx.Node | None = None
    for node in list(graph.nodes):
        if node.target is torch.ops.aten._assert_tensor_metadata.default and not node.users:
            graph.erase_node(node)
        elif node.target is torch.ops.aten.to.device:  # to(x, device, dtype, ...): keep x's
            node.target = torch.ops.aten.to.dtype
            node.args = (node.args[0], *node.args[2:])
        elif isinstance(node.kwargs.get("device"), torch.device):
            here = here or _default_device_node(graph)
            node.kwargs = {**node.kwargs, "device": here}
    module.recompile()


def _default_device_node(graph: fx.Graph) -> fx.Node:
    """``torch.get_default_device()``, once, after the inputs."""
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    anchor = inputs[-1] if inputs else None
    if anchor is None:
        with graph.inserting_before(next(iter(graph.nodes))):
            return graph.call_function(torch.get_default_device, name="default_device")
    with graph.inserting_after(anchor):
        return graph.call_function(torch.get_default_device, name="default_device")
