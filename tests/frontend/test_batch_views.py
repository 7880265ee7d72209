"""A view that hard-codes the example batch fails on a micro-batch: the trace's error names
the view, the rows it was traced with and the fix; a size computed from the batch is not it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipecompile.errors import TraceError
from pipecompile.frontend.batch_views import batch_view
from pipecompile.frontend.tracer import trace


class FixedView(nn.Module):
    """Written for an example of 8 rows: ``view(8, -1)`` mixes a micro-batch's rows."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(64, 4)
        self.norm = nn.BatchNorm1d(4)  # its statistics must not move while looking

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.a(x))
        h = h.view(8, -1)
        return self.b(h)


class ComputedView(nn.Module):
    """Sizes its view from the batch: ``view(8, -1)`` on a micro-batch of 4 rows, as the fixed
    one, but ``view(16, -1)`` on the example; what fixes the batch is the added tensor's rows."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.bias = nn.Parameter(torch.zeros(16, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x).view(x.shape[0] * 2, -1)
        return h + self.bias


def test_the_error_names_the_view_the_rows_and_the_fix():
    model = FixedView()
    model(torch.randn(8, 4, 16))  # runs eagerly on the whole example
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TraceError) as info:
        trace(model, {"x": torch.randn(4, 4, 16)}, microbatches=2)
    message = str(info.value)
    assert message.startswith("cannot trace FixedView: the view at ")
    assert "test_batch_views.py:" in message and "`h = h.view(8, -1)`" in message
    assert "asks for [8, -1], the example batch's 8 rows" in message
    assert "one micro-batch of 4 rows (--microbatches 2 splits the 8 rows)" in message
    assert "x.shape[0]" in message and "--microbatches 1" in message
    assert "avoid Python control flow" not in message
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_size_computed_from_the_batch_is_not_named():
    model = ComputedView()
    model(torch.randn(8, 4, 16))
    micro = {"x": torch.randn(4, 4, 16)}
    assert batch_view(model, micro, microbatches=2) is None
    with pytest.raises(TraceError, match="(?s)cannot trace ComputedView:\n.*avoid Python control"):
        trace(model, micro, microbatches=2)


def test_one_micro_batch_is_the_example_itself():
    assert batch_view(FixedView(), {"x": torch.randn(8, 4, 16)}, microbatches=1) is None
