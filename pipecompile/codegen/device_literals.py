"""Leave devices to where a stage runs: ``device=`` literals that tracing baked into the graph
(the device the model was traced on: ``meta`` for a model without weights, the CPU for one
that will run on a GPU) become None in the emitted code, so factory ops (``arange``,
``zeros``) take the default device and conversions (``to``) keep their input's; export's
metadata assertions, which name the traced device, are dropped."""

from __future__ import annotations

import torch
import torch.fx as fx

__all__ = ["drop_device_literals"]


def drop_device_literals(module: fx.GraphModule) -> None:
    """Rewrite ``module``'s graph in place (``module`` is emit's own lowered copy)."""
    graph = module.graph
    for node in list(graph.nodes):
        if node.target is torch.ops.aten._assert_tensor_metadata.default and not node.users:
            graph.erase_node(node)
        elif isinstance(node.kwargs.get("device"), torch.device):
            node.kwargs = {**node.kwargs, "device": None}
        elif node.target is torch.ops.aten.to.device:  # to(x, device, dtype, ...): keep x's
            node.target = torch.ops.aten.to.dtype
            node.args = (node.args[0], *node.args[2:])
    module.recompile()
