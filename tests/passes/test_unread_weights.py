"""Parameters and buffers forward never reads stay in the pipeline (held by stage 0), so its
state dict, the emitted stage files, ``--check`` and exported weights cover the whole model."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.ir.graph.noise_floor import Tolerance
from pipecompile.runtime.check.step import check_step
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.training.export import export_weights


class Unread(nn.Module):
    """A model with a spare head, a bare parameter, a buffer and a non-persistent buffer that
    forward never reads, beside a tied pair (one name read, one not)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 4)
        self.spare = nn.Linear(16, 3)  # e.g. a pooler a fine-tuning run leaves out
        self.bare = nn.Parameter(torch.randn(5))
        self.register_buffer("seen", torch.arange(3.0))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)
        self.alias = self.b  # the same weights under a second name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((out - y) ** 2).mean()


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "pipedream"])
@pytest.mark.parametrize("stages", [1, 2])
def test_unread_weights_are_held_and_checked(stages, schedule, tmp_path):
    torch.manual_seed(0)
    model = Unread()
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    compiled = compile_model(copy.deepcopy(model), {"x": x}, stages=stages, microbatches=2,
                             schedule=schedule)  # fmt: skip
    emit(compiled, tmp_path / "out", model=ModelRef(None, "m", "m"))
    pipe = Pipeline.load(tmp_path / "out")

    state = pipe.state_dict()
    assert set(state) == set(model.state_dict())
    for name, tensor in model.state_dict().items():
        assert torch.equal(state[name], tensor), name
    source = (tmp_path / "out" / "stage_0.py").read_text()
    assert "self.spare_weight = torch.nn.Parameter" in source
    assert 'self.register_buffer("seen"' in source
    assert "scratch" not in source  # not part of the state dict: not the pipeline's to keep

    if schedule != "pipedream":
        report = check_step(pipe, model, {"x": x}, (y,), _loss, tolerance=Tolerance(1e-6, 1e-5))
        assert report.ok, str(report)


def test_exported_weights_load_strictly_into_the_model(tmp_path):
    torch.manual_seed(0)
    model = Unread()
    compiled = compile_model(copy.deepcopy(model), {"x": torch.randn(8, 16)}, stages=2)
    emit(compiled, tmp_path / "out", model=ModelRef(None, "m", "m"))
    export_weights(tmp_path / "out", tmp_path / "w.safetensors")
    weights = load_file(str(tmp_path / "w.safetensors"))
    fresh = Unread()
    fresh.load_state_dict(weights, strict=True)
    assert torch.equal(fresh.spare.weight, model.spare.weight)
    assert torch.equal(fresh.bare, model.bare)
