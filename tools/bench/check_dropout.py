"""Dropout under recomputation: does a recomputed forward draw the mask of the forward it
recomputes?

A ``Linear → ReLU → Dropout(p) → Linear → ReLU → Linear`` model (width ``--width``) is
compiled into 2 stages (cut before the second Linear) and 4 micro-batches with each
recomputing configuration: ``--recompute always`` and ``except_last`` (gpipe and 1f1b),
``--memory-budget`` small enough to recompute, zb1p (its I/W split), and the
``@pipecompile.pipeline`` decorator (whose backward always recomputes). Each runs one step
with the same base seed; the reference is ``--recompute never``, whose backward runs on the
stored activations of the forward itself. Printed: the largest difference of loss and of any
gradient from the reference (goal ≤ 1e-5). For the decorator, the outputs its backward
recomputed are compared with those its forward returned.

    python tools/bench/check_dropout.py            # p = 0.5, width 256
    python tools/bench/check_dropout.py --quick    # width 16
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import torch
from common import machine
from torch import nn

import pipecompile
from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.state.step_options import StepOptions


class Dropped(nn.Module):
    def __init__(self, width: int, p: float) -> None:
        super().__init__()
        self.a, self.drop = nn.Linear(width, width), nn.Dropout(p)
        self.b, self.c = nn.Linear(width, width), nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(self.drop(torch.relu(self.a(x))))))


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, tmp: Path,
         **options: object) -> tuple[float, dict[str, torch.Tensor], int]:  # fmt: skip
    compiled = compile_model(copy.deepcopy(model), {"x": x}, stages=2, microbatches=4,
                             split_at=("b",), **options)  # type: ignore[arg-type]  # fmt: skip
    out = tmp / str(len(list(tmp.iterdir())))
    emit(compiled, out, model=ModelRef(None, "m", "m"))
    pipe = Pipeline.load(out)
    kept = StepOptions(keep_grads=True, rng_base=1234)
    loss = pipe.train_step({"x": x}, (y,), lambda o, t: ((o - t) ** 2).mean(), options=kept).loss
    recomputed = sum(1 for _, _, i in compiled.program.instructions() if i.op == "FC")
    return float(loss), {**pipe.named_grads(0), **pipe.named_grads(1)}, recomputed


def worst(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    return max(float((got[n] - want[n]).abs().max()) for n in want)


def decorator_row(width: int, p: float, x: torch.Tensor) -> tuple[float, float]:
    """(largest |recomputed - returned output|, largest |gradient - stored-forward VJP|)."""

    @pipecompile.pipeline(stages=2, microbatches=2, split_at=("b",))
    class Decorated(Dropped):
        pass

    model = Decorated(width, p).train()
    out = model(x)
    grad_out = torch.randn_like(out)
    (out * grad_out).sum().backward()
    pipe = model.pipeline.pipeline
    recomputed = torch.cat([pipe.last.results[i][0] for i in range(2)])
    kept = StepOptions(
        loss_scale=1.0, weigh_rows=False, keep_grads=True, rng_base=pipe.last.rng_base
    )
    pipe.train_step({"x": x}, (grad_out,), lambda o, g: (o * g).sum(), options=kept)
    want = {**pipe.named_grads(0), **pipe.named_grads(1)}
    grads = {n: q.grad for n, q in model.named_parameters()}
    return float((recomputed - out.detach()).abs().max()), worst(grads, want)  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="width 16")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("-p", type=float, default=0.5, help="dropout probability")
    args = parser.parse_args()
    width = 16 if args.quick else args.width
    torch.manual_seed(0)
    model = Dropped(width, args.p).train()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, width, generator=g), torch.randn(8, 4, generator=g)
    configs = {
        "recompute always (gpipe)": {"recompute": "always"},
        "recompute except_last (gpipe)": {"recompute": "except_last"},
        "recompute always (1f1b)": {"recompute": "always", "schedule": "1f1b"},
        "zb1p (I/W split)": {"schedule": "zb1p"},
        "zb1p, recompute always": {"schedule": "zb1p", "recompute": "always"},
        "--memory-budget (some forwards recomputed)": {"memory_budget": 8 * width * 4 * 2},
    }
    print(f"# dropout p={args.p}, width {width}, 2 stages, 4 micro-batches\n")
    print(f"machine: {machine()}\n")
    print("| configuration | forwards recomputed | max loss diff | max gradient diff | goal |")
    print("|---|---:|---:|---:|---|")
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        loss0, ref, _ = step(model, x, y, Path(tmp), recompute="never")
        for label, options in configs.items():
            loss, grads, fc = step(model, x, y, Path(tmp), **options)
            dl, dg = abs(loss - loss0), worst(grads, ref)
            ok = dl <= 1e-5 and dg <= 1e-5
            failed |= not ok
            print(f"| {label} | {fc} of 8 | {dl:.1e} | {dg:.1e} | {'met' if ok else 'NOT met'} |")
    out_diff, grad_diff = decorator_row(width, args.p, x)
    ok = out_diff <= 1e-5 and grad_diff <= 1e-5
    failed |= not ok
    print(f"| @pipecompile.pipeline backward | all (output diff {out_diff:.1e}) | - | "
          f"{grad_diff:.1e} | {'met' if ok else 'NOT met'} |")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
