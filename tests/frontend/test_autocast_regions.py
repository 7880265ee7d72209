"""A region that turns autocast off (timm's EfficientViT attention) is inlined by the
torch.export front end, and the compiled stages equal eager (the compile's proof checks)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import pipecompile
from pipecompile.frontend.tracer import trace


class AutocastOff(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        if y.device.type != "meta":  # data-dependent for fx: torch.export takes the model
            with torch.autocast("cpu", enabled=False):
                y = (y * 2).tanh() @ self.a.weight
        return self.b(y.relu())


def test_an_autocast_off_region_is_inlined(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPECOMPILE_VERIFY", "on")  # the proof compares the stages with eager
    torch.manual_seed(0)
    model, x = AutocastOff(), torch.randn(8, 4)
    traced = trace(model, {"x": x})
    assert traced.tracer == "torch.export"
    targets = {str(n.target) for n in traced.module.graph.nodes}
    assert not any("wrap_with_autocast" in t for t in targets)
    pipe = pipecompile.compile(model, (x,), stages=2, microbatches=2)  # proved equal to eager
    torch.testing.assert_close(pipe(x), model(x), rtol=1e-6, atol=1e-6)
