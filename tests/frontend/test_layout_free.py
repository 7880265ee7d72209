"""Exported views hold for any input layout: a stage's input need not have the traced strides."""

import torch
from torch import nn

from pipecompile.frontend.layout_free import views_as_reshapes
from pipecompile.frontend.tracer import trace


class _Heads(nn.Module):
    """torch.fx cannot trace it (``int`` of a size); ``contiguous()`` makes the view legal."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = int(x.shape[0])
        return x.permute(1, 0, 2).contiguous().view(3, rows * 4) * 2


def test_a_view_traced_on_a_contiguous_layout_runs_on_any_layout() -> None:
    # Traced on a tensor whose permute is already contiguous: export records no contiguous().
    traced_on = torch.randn(3, 5, 4).permute(1, 0, 2)
    traced = trace(_Heads(), {"x": traced_on})
    assert traced.tracer == "torch.export"
    plain = torch.randn(5, 3, 4)  # the layout another device (or stage) hands over
    torch.testing.assert_close(traced.module(plain)[0], _Heads()(plain), rtol=0, atol=0)


def test_a_view_that_is_written_into_stays_a_view() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    v = graph.call_function(torch.ops.aten.view.default, (x, [6]))
    graph.call_function(torch.ops.aten.add_.Tensor, (v, 1.0))
    w = graph.call_function(torch.ops.aten.view.default, (x, [3, 2]))
    graph.output((w,))
    module = torch.fx.GraphModule(nn.Module(), graph)
    assert views_as_reshapes(module) == 0  # both alias x, which add_ writes through v
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output((graph.call_function(torch.ops.aten.view.default, (x, [6])),))
    module = torch.fx.GraphModule(nn.Module(), graph)
    assert views_as_reshapes(module) == 1
    assert "aten.reshape.default" in module.code
