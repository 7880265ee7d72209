"""A step returns what it gave as one record (``StepResult``), kept as the pipeline's ``last``;
inference keeps one too, which ``held_outputs`` reads."""

from __future__ import annotations

import math

import torch
from torch import nn

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.state.step_options import StepOptions
from pipecompile.runtime.state.step_result import StepResult


def test_a_step_and_an_inference_each_leave_their_record(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x, y = torch.randn(8, 8), torch.randn(8, 2)
    compiled = compile_model(model, {"input": x}, stages=2, microbatches=4)
    pipe = Pipeline.load(emit(compiled, tmp_path / "out", model=ModelRef(None, "m", "m")))
    assert pipe.last is None
    step = pipe.train_step(
        {"input": x}, (y,), nn.functional.mse_loss, options=StepOptions(rng_base=7)
    )
    assert isinstance(step, StepResult) and pipe.last is step
    torch.testing.assert_close(step.loss, nn.functional.mse_loss(model(x), y), atol=1e-6, rtol=0)
    assert sorted(step.losses) == sorted(step.results) == [0, 1, 2, 3]
    assert [o[0].shape for o in step.outputs] == [torch.Size([2, 2])] * 4
    # 4 micro-batches of 2 rows x 8 floats across the one boundary, forward and back
    assert step.rng_base == 7 and step.sent_bytes == 4 * 2 * (2 * 8 * 4)
    assert step.stats.peak_inflight == (4, 4)  # gpipe: every micro-batch in flight
    with torch.no_grad():
        out = pipe({"input": x})
    assert pipe.last is not step and math.isnan(float(pipe.last.loss))
    assert sorted(pipe.held_outputs()) == [0, 1, 2, 3]
    torch.testing.assert_close(out, model(x), atol=1e-6, rtol=0)
