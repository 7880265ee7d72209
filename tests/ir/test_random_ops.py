"""Which ops draw random numbers, as torch.fx and torch.export record them: an attention or a
dropout whose rate is 0, or that runs in eval mode, draws none that matter (the check's report
must not blame random numbers for it)."""

from __future__ import annotations

import torch
import torch.fx as fx

from pipecompile.ir.graph.random_ops import is_random

aten = torch.ops.aten


class _Ops(torch.nn.Module):
    def forward(self, q: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            aten.scaled_dot_product_attention.default(q, q, q, None, 0.0, True),
            aten._scaled_dot_product_flash_attention_for_cpu.default(q, q, q, 0.0, True)[0],
            aten.native_dropout.default(q, 0.1, False)[0],
            aten.native_dropout.default(q, 0.1, True)[0],
            aten.scaled_dot_product_attention.default(q, q, q, None, 0.1, True),
            torch.nn.functional.dropout(q, 0.0),
        )


def test_exported_attention_and_dropout_are_random_only_when_they_drop():
    graph = fx.symbolic_trace(_Ops())
    calls = [n for n in graph.graph.nodes if n.op == "call_function" and "getitem" not in n.name]
    assert [is_random(n, graph) for n in calls] == [False, False, False, True, True, False]
