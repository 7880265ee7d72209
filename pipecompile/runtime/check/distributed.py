"""`run --nproc N --check`: the distributed step against the local backend and the eager model.

Every rank runs one step from the emitted weights; rank 0 gathers the gradients (synchronous
programs) or the weights after one SGD step (asynchronous ones), runs the same program on the
local backend, and checks that run against the eager model as `run --check` does. The
distributed figures must equal the local ones.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipecompile.ir.microbatch import join_microbatches
from pipecompile.model.model_file import ModelSpec
from pipecompile.runtime.check.eager import check_against_eager
from pipecompile.runtime.check.step import CheckReport, compare
from pipecompile.runtime.pipeline import Pipeline

__all__ = ["check_distributed"]


def check_distributed(
    pipe: Pipeline,
    spec: ModelSpec,
    directory: Path,
    args: argparse.Namespace,
    inputs: dict[str, torch.Tensor],
    targets: tuple[torch.Tensor, ...],
) -> CheckReport:
    """Returns the report on rank 0 (an empty, passing one elsewhere). ``inputs`` and
    ``targets`` are the example's, on this rank's device; the comparison runs on the CPU."""
    assert spec.targets is not None and spec.loss_fn is not None
    if pipe.asynchronous:
        pipe.set_optimizer(lambda ps: torch.optim.SGD(ps, lr=args.lr))
    grads: dict[str, torch.Tensor] = {}
    pipe.train_step(
        inputs,
        targets,
        spec.loss_fn,
        on_step=lambda j: grads.update(pipe.named_grads(j)),
    )
    values = pipe.state_dict() if pipe.asynchronous else grads
    mine: dict[str, Any] = {
        "values": {k: v.cpu() for k, v in values.items()},
        "losses": {i: float(v) for i, v in pipe.last_losses.items()},
        "outputs": {i: tuple(t.cpu() for t in r) for i, r in pipe.last_results.items()},
    }
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.gather_object(mine, gathered if dist.get_rank() == 0 else None, dst=0)
    if dist.get_rank() != 0:
        return CheckReport("(reported by rank 0)")
    return _compare_on_rank0(gathered, spec, directory, args, pipe.asynchronous)


def _compare_on_rank0(
    gathered: list[dict[str, Any]],
    spec: ModelSpec,
    directory: Path,
    args: argparse.Namespace,
    asynchronous: bool,
) -> CheckReport:
    assert spec.model is not None and spec.targets is not None and spec.loss_fn is not None
    local = Pipeline.load(directory, args.program)
    report = check_against_eager(local, spec, lr=args.lr, atol=args.atol, rtol=args.rtol)
    if asynchronous:
        local_values = local.state_dict()
        local_loss, local_outs = None, None
    else:
        local_values = {}
        local_loss, outs = local.train_step(
            spec.inputs,
            spec.targets,
            spec.loss_fn,
            on_step=lambda j: local_values.update(local.named_grads(j)),
        )
        local_outs = join_microbatches(outs)
    values: dict[str, torch.Tensor] = {}
    for part in gathered:
        values.update(part["values"])
    what = "weights after the step" if asynchronous else "gradient"
    worst = 0.0
    for name, want in local_values.items():
        if name not in values:
            report.failures.append(f"distributed run has no {what} for {name}")
            continue
        worst = max(
            worst,
            compare(
                report, f"distributed {what} of {name}", values[name], want, args.atol, args.rtol
            ),
        )
    line = f"  distributed ({len(gathered)} ranks) vs local backend: {what} max |diff| {worst:.3e}"
    losses = {i: v for part in gathered for i, v in part["losses"].items()}
    results = {i: v for part in gathered for i, v in part["outputs"].items()}
    if local_loss is not None:
        diff = compare(
            report,
            "distributed loss",
            torch.tensor(sum(losses.values())),
            local_loss.detach(),
            args.atol,
            args.rtol,
        )
        line += f", loss {diff:.3e}"
    if local_outs is not None:
        joined = join_microbatches([results[i] for i in sorted(results)])
        out_diff = max(
            compare(report, f"distributed output {k}", have, want, args.atol, args.rtol)
            for k, (have, want) in enumerate(zip(joined, local_outs))
        )
        line += f", outputs {out_diff:.3e}"
    report.notes.append(line)
    return report
