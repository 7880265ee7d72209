"""The ``pipedream_2bw`` schedule against an independent reference of PipeDream-2BW's update.

The reference is written from the PipeDream-2BW paper's rule (Narayanan et al., ICML 2021:
double-buffered weights, gradients accumulated over a batch of micro-batches, applied one
version stale), in plain torch; it reads the emitted ``manifest.json`` only to check which
parameters each stage holds (every stage uses the same version here, so it needs no more).

Semantics. Each ``train_step`` is one program of m micro-batches in windows of w = p (the
stages): window k is micro-batches ``[k*w, (k+1)*w)``. V(0) is the step's starting weights
and V(-1) = V(0). Every micro-batch of window k runs forward and backward on V(k-1), on every
stage, and after window k the weights become

    V(k+1) = V(k) - lr * (1/w) * sum over window k of the gradient of its loss at V(k-1)

(W(t+1) = W(t) - lr * grad f(W(t-1)) in the paper). The step's loss is the mean over the m
micro-batches of their losses at the versions used.

Sensitivity: the pipeline must differ from the same windows applied without staleness
(window k on V(k)) and from one synchronous step on the mean gradient, so a schedule that
ignored the second buffer or updated once would fail here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.func import functional_call

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.errors import ProgramError
from pipecompile.ir.programs.memory_model import peak_weight_copies
from pipecompile.runtime.pipeline import Pipeline
from tests.runtime.test_pipedream_reference import (
    LR,
    TOL,
    Weights,
    build_model,
    loss_fn,
    max_diff,
    mini_batches,
    stage_of_params,
)

DIFFERENT = 1e-4


def reference_step(
    model: torch.nn.Module, weights: Weights, p: int, m: int, stale: int, x: torch.Tensor,
    y: torch.Tensor,
) -> tuple[Weights, torch.Tensor]:  # fmt: skip
    """One step of m micro-batches; window k runs on V(k - stale) (2BW: stale = 1)."""
    w = p
    versions = [{n: t.detach().clone() for n, t in weights.items()}]  # versions[v] = V(v)
    losses = []
    chunks = list(zip(torch.chunk(x, m), torch.chunk(y, m)))
    for k in range(m // w):
        used_version = versions[max(k - stale, 0)]
        total = {n: torch.zeros_like(t) for n, t in weights.items()}
        for xi, yi in chunks[k * w : (k + 1) * w]:
            used = {n: t.detach().clone().requires_grad_(True) for n, t in used_version.items()}
            loss = loss_fn(functional_call(model, used, (xi,)), yi)
            for n, g in zip(used, torch.autograd.grad(loss, list(used.values()))):
                total[n] += g / w
            losses.append(loss.detach())
        latest = versions[-1]
        versions.append({n: latest[n] - LR * total[n] for n in latest})
    return versions[-1], torch.stack(losses).mean()


def run_reference(model: torch.nn.Module, p: int, m: int, stale: int) -> list:
    weights = {n: t.detach().clone() for n, t in model.named_parameters()}
    trace = []
    for x, y in mini_batches():
        weights, loss = reference_step(model, weights, p, m, stale, x, y)
        trace.append((weights, loss))
    return trace


@pytest.mark.parametrize(("p", "m"), [(2, 6), (3, 12), (4, 8)])
def test_pipedream_2bw_matches_the_papers_rule(tmp_path: Path, p: int, m: int) -> None:
    model = build_model()
    batches = mini_batches()
    compiled = compile_model(
        model, {"x": batches[0][0]}, stages=p, microbatches=m, schedule="pipedream_2bw"
    )
    # two stashed versions at most on every stage, once a third window exists
    assert all(peak_weight_copies(d) <= 2 for d in compiled.program.devices)
    if m >= 3 * p:
        assert max(peak_weight_copies(d) for d in compiled.program.devices) == 2
    out = emit(compiled, tmp_path / "pipe", model=ModelRef(None, "mlp", "mlp"))
    owner = stage_of_params(json.loads((out / "manifest.json").read_text()))
    assert set(owner) == {n for n, _ in model.named_parameters()}

    expected = run_reference(model, p, m, stale=1)
    pipe = Pipeline.load(out)
    pipe.set_optimizer(lambda ps: torch.optim.SGD(ps, lr=LR))
    for step, ((x, y), (ref_weights, ref_loss)) in enumerate(zip(batches, expected)):
        loss = pipe.train_step({"x": x}, (y,), loss_fn).loss
        got = {n: pipe.state_dict()[n] for n in ref_weights}
        diff = max_diff(got, ref_weights)
        assert diff <= TOL, f"step {step}: weights differ from the reference by {diff:.3g}"
        assert abs(loss.item() - ref_loss.item()) <= TOL, f"step {step}: loss differs"

    final = {n: pipe.state_dict()[n] for n in owner}
    fresh = run_reference(model, p, m, stale=0)[-1][0]  # no second buffer
    assert max_diff(final, fresh) > DIFFERENT, "pipeline equals 2BW without staleness"
    once = run_reference(model, m, m, stale=0)[-1][0]  # one window: one synchronous update
    assert max_diff(final, once) > DIFFERENT, "pipeline equals one update per step"


class TiedMLP(torch.nn.Module):
    """The first and last layers share one weight (as a GPT's embedding and head): the
    stages holding them must sum their window's gradients before each update."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(8, 8)
        self.middle = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))
        self.last = torch.nn.Linear(8, 8)
        self.last.weight = self.first.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.first(x))
        for layer in self.middle:
            x = torch.tanh(layer(x))
        return self.last(x)


def test_tied_weights_stay_one_parameter(tmp_path: Path) -> None:
    """pipedream refuses a parameter tied across stages; pipedream_2bw runs every stage on
    the same version, so the copies get the window's summed gradient and stay equal."""
    torch.manual_seed(0)
    model = TiedMLP()
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(12, 8, generator=g), torch.randn(12, 8, generator=g)) for _ in range(3)]
    compiled = compile_model(
        model, {"x": batches[0][0]}, stages=3, microbatches=6, schedule="pipedream_2bw"
    )
    tied = [x for d in compiled.program.devices for x in d if x.op == "ALLREDUCE_TIED"]
    assert {(x.stage, x.microbatch) for x in tied} == {(0, 2), (0, 5), (2, 2), (2, 5)}
    out = emit(compiled, tmp_path / "tied", model=ModelRef(None, "tied", "tied"))
    pipe = Pipeline.load(out)
    pipe.set_optimizer(lambda ps: torch.optim.SGD(ps, lr=LR))
    weights = {n: t.detach().clone() for n, t in model.named_parameters()}
    for x, y in batches:
        loss = pipe.train_step({"x": x}, (y,), loss_fn).loss
        weights, ref_loss = reference_step(model, weights, 3, 6, 1, x, y)
        state = pipe.state_dict()
        assert max_diff({n: state[n] for n in weights}, weights) <= TOL
        assert abs(loss.item() - ref_loss.item()) <= TOL
        torch.testing.assert_close(state["first.weight"], state["last.weight"], atol=0, rtol=0)


def test_microbatches_must_fill_the_windows() -> None:
    model = build_model()
    with pytest.raises(ProgramError, match="windows of 3 micro-batches.*multiple of 3"):
        compile_model(model, {"x": mini_batches()[0][0]}, stages=3, microbatches=8,
                      schedule="pipedream_2bw")  # fmt: skip
