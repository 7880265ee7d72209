"""Analysis: node_memory — the activation bytes each op makes autograd keep for backward.

Requires: a traced module whose placeholders carry fake values (``meta["val"]``).
Guarantees: per op node, the bytes of the storages autograd first saved while that op ran,
measured by running the whole graph once on fake tensors under the same saved-tensor rule
the stage analysis uses (``count_saved``: parameters and buffers excluded, each storage once).
Summed over a stage's ops this predicts the stage's stored activations per micro-batch; a
storage saved by ops on both sides of a boundary is counted on the first side only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from pipecompile.ir.graph.saved_bytes import count_saved
from pipecompile.ir.graph.swapped_call import functional_call

__all__ = ["node_memory"]


def node_memory(module: fx.GraphModule) -> dict[fx.Node, int]:
    """Saved activation bytes per op node (see the module docstring)."""
    owner: dict[int, fx.Node] = {}
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        wrapper = _Wrapper(module)
        state: dict[str, torch.Tensor] = {
            name: mode.from_tensor(t)
            for name, t in [*wrapper.named_parameters(), *wrapper.named_buffers()]
        }
        args = [_fake(n.meta.get("val")) for n in module.graph.nodes if n.op == "placeholder"]
        with count_saved(list(state.values())) as seen:
            wrapper.seen, wrapper.owner = seen, owner
            functional_call(wrapper, state, tuple(args))
    out: dict[fx.Node, int] = {}
    for key, node in owner.items():
        out[node] = out.get(node, 0) + seen[key]
    return out


class _Wrapper(nn.Module):
    """Runs the graph node by node, noting which node saved each new storage."""

    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__()
        self.gm = module
        self.seen: dict[int, int] = {}
        self.owner: dict[int, fx.Node] = {}

    def forward(self, *args: Any) -> Any:
        wrapper = self

        class _Recorder(fx.Interpreter):
            def run_node(self, n: fx.Node) -> Any:
                result = super().run_node(n)
                for key in wrapper.seen.keys() - wrapper.owner.keys():
                    wrapper.owner[key] = n
                return result

        return _Recorder(self.gm).run(*args)


def _fake(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(
            value.shape, value.stride(), dtype=value.dtype, device=value.device
        )
    return value
