"""Dropout under recomputation: a recomputed forward draws the random numbers of the forward
it recomputes, so the gradients belong to the activations the forward produced, for every
recompute policy, memory budget, the zero-bubble I/W split and the decorator's backward."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import pipecompile
from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.state.step_options import StepOptions


class Dropped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.drop, self.b = nn.Linear(16, 32), nn.Dropout(0.5), nn.Linear(32, 32)
        self.c = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(self.drop(torch.relu(self.a(x))))))


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((out - y) ** 2).mean()


def _grads(model: nn.Module, tmp_path, **options) -> tuple[float, dict[str, torch.Tensor]]:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    compiled = compile_model(
        copy.deepcopy(model), {"x": x}, stages=2, microbatches=4, split_at=("b",), **options
    )  # the same cut for every policy
    out = tmp_path / "-".join(f"{k}{v}" for k, v in options.items())
    emit(compiled, out, model=ModelRef(None, "m", "m"))
    pipe = Pipeline.load(out)
    loss = pipe.train_step(
        {"x": x}, (y,), _loss, options=StepOptions(keep_grads=True, rng_base=1234)
    ).loss
    grads = {**pipe.named_grads(0), **pipe.named_grads(1)}
    return float(loss), grads


RECOMPUTING = [
    {"recompute": "always"},
    {"recompute": "except_last"},
    {"recompute": "always", "schedule": "1f1b"},
    {"recompute": "always", "schedule": "zb1p"},
    {"schedule": "zb1p"},
    {"memory_budget": 2048},  # recomputes one forward (2 KiB fits no more)
]


@pytest.mark.parametrize("options", RECOMPUTING, ids=lambda o: "-".join(map(str, o.values())))
def test_recomputed_forward_draws_the_same_dropout_mask(options, tmp_path):
    torch.manual_seed(0)
    model = Dropped().train()
    loss, want = _grads(model, tmp_path, recompute="never")  # backward on the stored forward
    got_loss, got = _grads(model, tmp_path, **options)
    assert got_loss == pytest.approx(loss, abs=1e-6)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-6, rtol=1e-5), name


def test_the_mask_changes_between_steps_and_follows_torch_manual_seed(tmp_path):
    torch.manual_seed(0)
    model = Dropped().train()
    x = torch.randn(8, 16)
    compiled = compile_model(copy.deepcopy(model), {"x": x}, stages=2, microbatches=2)
    emit(compiled, tmp_path / "out", model=ModelRef(None, "m", "m"))
    pipe = Pipeline.load(tmp_path / "out")
    torch.manual_seed(7)
    first, second = pipe({"x": x}), pipe({"x": x})
    assert not torch.equal(first, second)  # a new base seed per call
    torch.manual_seed(7)
    assert torch.equal(pipe({"x": x}), first)


def test_decorator_backward_recomputes_the_forward_it_differentiates():
    @pipecompile.pipeline(stages=2, microbatches=2, recompute="never")
    class Decorated(Dropped):
        pass

    torch.manual_seed(0)
    model = Decorated().train()
    x = torch.randn(8, 16)
    out = model(x)
    grad_out = torch.randn_like(out)
    (out * grad_out).sum().backward()
    pipe = model.pipeline.pipeline
    recomputed = torch.cat([pipe.last.results[i][0] for i in range(2)])
    assert torch.equal(recomputed, out.detach())  # the backward saw the forward's masks
    # and the gradient is the VJP of that forward: against the stored-activation backward
    reference = model.pipeline.pipeline
    kept = StepOptions(
        loss_scale=1.0, weigh_rows=False, keep_grads=True, rng_base=pipe.last.rng_base
    )
    reference.train_step({"x": x}, (grad_out,), lambda o, g: (o * g).sum(), options=kept)
    want = {**reference.named_grads(0), **reference.named_grads(1)}
    for name, param in model.named_parameters():
        assert torch.allclose(param.grad, want[name], atol=1e-6), name
