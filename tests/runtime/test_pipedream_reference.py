"""The ``pipedream`` schedule against an independent reference of weight-stashed async SGD.

The reference below is written from the PipeDream paper's definition (Narayanan et al.,
SOSP 2019: 1F1B with weight stashing, optionally vertical sync), not from pipecompile's
runtime: it uses plain torch and reads the emitted ``manifest.json`` only as data, to learn
which of the original model's parameters each stage holds.

Semantics. Each ``train_step`` is one program of m micro-batches, i = 0..m-1 (micro-batch i
is rows ``[i*b, (i+1)*b)`` of the mini-batch, b = batch/m). The pipeline fills and drains
within the step (a flush between steps), so weight versions are counted within a step,
starting from the weights at the beginning of the step. With p stages, j = 0..p-1:

* Stage j's forward of micro-batch i uses stage j's weights after u_j(i) of this step's
  updates, u_j(i) = max(0, i - (p - 1 - j)) (the updates of micro-batches 0..i-p+j). With
  vertical sync every stage uses u_j(i) = max(0, i - (p - 1)), the version stage 0 used.
* Weight stashing: micro-batch i's backward on stage j differentiates with exactly the
  weights its forward used, so its gradient g_j(i) is the gradient of micro-batch i's loss
  (``loss_fn`` on that micro-batch, not divided by m) with respect to stage j's weights,
  every stage k evaluated at its version u_k(i).
* After micro-batch i's backward stage j applies plain SGD, w_j <- w_j - lr * g_j(i), in
  micro-batch order: stage j's version v+1 is version v - lr * g_j(v).

Since u_k(i) <= i, processing micro-batches in order 0..m-1 always finds the versions needed.
The step's loss is the mean over micro-batches of the forward losses at the versions used.

Sensitivity: the pipeline must also differ from plain sequential SGD (every micro-batch sees
the latest weights), and with vertical sync the two staleness rules must give different
weights, so a schedule that ignored staleness or vertical sync would fail here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.runtime.pipeline import Pipeline

IN, WIDTH, OUT, LAYERS = 8, 24, 4, 6
BATCH = 24  # divisible by every m below
STEPS = 3
LR = 0.1
TOL = 1e-5
DIFFERENT = 1e-4

Weights = dict[str, torch.Tensor]
Version = Callable[[int, int, int], int]  # (stage j, micro-batch i, stages p) -> updates seen


class TanhMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        sizes = [IN] + [WIDTH] * (LAYERS - 1) + [OUT]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for k, layer in enumerate(self.layers):
            x = layer(x)
            if k < len(self.layers) - 1:
                x = torch.tanh(x)
        return x


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    model = TanhMLP().float()
    with torch.no_grad():  # larger weights than the default init, so staleness shows
        for p in model.parameters():
            p.mul_(2.0)
    return model


def mini_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234)
    return [
        (torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g))
        for _ in range(STEPS)
    ]


# ---- the reference: plain torch, no pipecompile runtime code ----


def u_pipedream(j: int, i: int, p: int) -> int:
    return max(0, i - (p - 1 - j))


def u_vertical_sync(j: int, i: int, p: int) -> int:
    return max(0, i - (p - 1))


def u_sequential(j: int, i: int, p: int) -> int:
    return i  # every micro-batch sees every earlier update: plain sequential SGD


def stage_of_params(manifest: dict) -> dict[str, int]:
    """Original parameter name -> the stage that holds it, from the manifest (data only)."""
    owner: dict[str, int] = {}
    for j, stage in enumerate(manifest["stages"]):
        for originals in stage["params"].values():
            for name in originals:
                assert name not in owner, f"{name} is held by stages {owner[name]} and {j}"
                owner[name] = j
    return owner


def reference_step(
    model: nn.Module,
    weights: Weights,
    owner: dict[str, int],
    p: int,
    m: int,
    version: Version,
    x: torch.Tensor,
    y: torch.Tensor,
) -> tuple[Weights, torch.Tensor]:
    """One step of weight-stashed asynchronous SGD; returns (new weights, mean loss)."""
    names = {j: [n for n in weights if owner[n] == j] for j in range(p)}
    # versions[j][v]: stage j's weights after v of this step's updates
    versions = [[{n: weights[n].detach().clone() for n in names[j]}] for j in range(p)]
    losses = []
    for i, (xi, yi) in enumerate(zip(torch.chunk(x, m), torch.chunk(y, m))):
        used = {}
        for j in range(p):
            v = version(j, i, p)
            assert v <= i < len(versions[j])
            for n, w in versions[j][v].items():
                used[n] = w.detach().clone().requires_grad_(True)
        loss = loss_fn(functional_call(model, used, (xi,)), yi)
        grads = dict(zip(used, torch.autograd.grad(loss, list(used.values()))))
        losses.append(loss.detach())
        for j in range(p):
            latest = versions[j][-1]
            versions[j].append({n: latest[n] - LR * grads[n] for n in names[j]})
    new = {n: versions[owner[n]][-1][n] for n in weights}
    return new, torch.stack(losses).mean()


def run_reference(
    model: nn.Module, owner: dict[str, int], p: int, m: int, version: Version
) -> list[tuple[Weights, torch.Tensor]]:
    weights = {n: w.detach().clone() for n, w in model.named_parameters()}
    trace = []
    for x, y in mini_batches():
        weights, loss = reference_step(model, weights, owner, p, m, version, x, y)
        trace.append((weights, loss))
    return trace


def max_diff(a: Weights, b: Weights) -> float:
    assert a.keys() == b.keys()
    return max((a[n] - b[n]).abs().max().item() for n in a)


# ---- the test ----


@pytest.mark.parametrize(
    ("p", "m", "vertical_sync", "backend"),
    [
        (2, 4, False, None),
        (3, 6, False, None),
        (4, 8, False, None),
        (3, 6, True, None),
        (4, 4, True, None),
        (3, 6, False, "aot_eager"),  # --compile: stashed leaves through the compiled stages
    ],
)
def test_pipedream_matches_weight_stashing_reference(tmp_path: Path, p, m, vertical_sync, backend):
    model = build_model()
    batches = mini_batches()
    compiled = compile_model(
        model,
        {"x": batches[0][0]},
        stages=p,
        microbatches=m,
        schedule="pipedream",
        vertical_sync=vertical_sync,
    )
    out = emit(compiled, tmp_path / "pipe", model=ModelRef(None, "mlp", "mlp"))
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["stages"]) == p
    owner = stage_of_params(manifest)
    assert set(owner) == {n for n, _ in model.named_parameters()}

    rule = u_vertical_sync if vertical_sync else u_pipedream
    expected = run_reference(model, owner, p, m, rule)

    pipe = Pipeline.load(out)
    pipe.compile_stages(backend)
    pipe.set_optimizer(lambda ps: torch.optim.SGD(ps, lr=LR))
    for step, ((x, y), (ref_weights, ref_loss)) in enumerate(zip(batches, expected)):
        loss = pipe.train_step({"x": x}, (y,), loss_fn).loss
        state = pipe.state_dict()
        got = {n: state[n] for n in ref_weights}
        diff = max_diff(got, ref_weights)
        assert diff <= TOL, f"step {step}: weights differ from the reference by {diff:.3g}"
        loss_diff = abs(loss.item() - ref_loss.item())
        assert loss_diff <= TOL, (
            f"step {step}: loss {loss.item():.7g} vs reference {ref_loss.item():.7g}"
        )

    final = {n: pipe.state_dict()[n] for n in owner}
    sequential = run_reference(model, owner, p, m, u_sequential)[-1][0]
    assert max_diff(final, sequential) > DIFFERENT, "pipeline equals staleness-free SGD"
    if vertical_sync:
        no_sync = run_reference(model, owner, p, m, u_pipedream)[-1][0]
        assert max_diff(no_sync, expected[-1][0]) > DIFFERENT, "vertical sync changes nothing"
        assert max_diff(final, no_sync) > DIFFERENT, "pipeline ignored vertical sync"
