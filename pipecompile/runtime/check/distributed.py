"""`run --nproc N --check`: the distributed step against the local backend and the eager model.

Every rank runs one step from the emitted weights; rank 0 gathers the gradients (synchronous
programs) or the weights after one SGD step (asynchronous ones), runs the same program on the
local backend, and checks that run against the eager model as `run --check` does. The
distributed figures must equal the local ones on CPU ranks; ranks on GPUs, whose kernels
round otherwise, are held to the noise-floor rule instead.
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
from pipecompile.runtime.check.step import CheckReport, compare, float64_reference
from pipecompile.runtime.pipeline import Pipeline

__all__ = ["check_distributed"]


def _floors(
    gathered: list[dict[str, Any]],
    local: Pipeline,
    spec: ModelSpec,
    args: argparse.Namespace,
    asynchronous: bool,
) -> tuple | None:
    """The float64 eager reference that measures the noise floors, when the ranks ran on GPUs:
    their kernels round otherwise than the CPU's, so the distributed values are held to the
    noise-floor rule (against the local backend's CPU values, as ``run --check`` holds the
    pipeline to eager's) rather than to equality. None on CPU ranks, for given
    ``--atol``/``--rtol``, and for PipeDream's weights after a step."""
    if not any(part.get("gpu") for part in gathered) or asynchronous:
        return None
    if args.atol is not None or args.rtol is not None:
        return None
    assert spec.model is not None and spec.targets is not None and spec.loss_fn is not None
    return float64_reference(local, spec.model, spec.inputs, spec.targets, spec.loss_fn)


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
        "gpu": pipe.default_device is not None,
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
    twin = _floors(gathered, local, spec, args, asynchronous)
    what = "weights after the step" if asynchronous else "gradient"
    worst = 0.0
    for name, want in local_values.items():
        if name not in values:
            report.failures.append(f"distributed run has no {what} for {name}")
            continue
        found = compare(report, f"distributed {what} of {name}", values[name], want, args.atol,
                        args.rtol, twin[2].get(name) if twin else None, "grads")  # fmt: skip
        worst = max(worst, found)
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
            twin[0] if twin else None,
            "loss",
        )
        line += f", loss {diff:.3e}"
    if local_outs is not None:
        joined = join_microbatches([results[i] for i in sorted(results)])
        exact = twin[1] if twin else [None] * len(local_outs)
        out_diff = max(
            compare(
                report, f"distributed output {k}", have, want, args.atol, args.rtol, e, "outputs"
            )  # fmt: skip
            for k, (have, want, e) in enumerate(zip(joined, local_outs, exact))
        )
        line += f", outputs {out_diff:.3e}"
    report.notes.append(line)
    return report
