"""`run --nproc N --check`: the distributed step against the local backend and the eager model.

Every rank runs one step from the emitted weights; rank 0 gathers the gradients (synchronous
programs) or the weights after one SGD step (asynchronous ones), runs the same program on the
local backend, and checks that run against the eager model as `run --check` does. The
distributed figures must equal the local ones on CPU ranks; ranks on GPUs, whose kernels
round otherwise, are held to the noise-floor rule instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipecompile.ir.graph.microbatch import join_microbatches
from pipecompile.ir.graph.noise_floor import Tolerance
from pipecompile.model.model_file import ModelSpec
from pipecompile.runtime.check.eager import check_against_eager
from pipecompile.runtime.check.step import (
    CheckReport,
    compare,
    eager_on_device,
    float64_reference,
)
from pipecompile.runtime.pipeline import Pipeline

__all__ = ["CheckSettings", "check_distributed"]


@dataclass(frozen=True)
class CheckSettings:
    """What `run --nproc N --check` compares with: the directory (and ``--program``) the
    one-process run loads, the learning rate of an asynchronous schedule's step, and the
    tolerances given (None: the noise-floor rule)."""

    directory: Path
    program: str | None
    lr: float
    tolerance: Tolerance


@dataclass(frozen=True)
class Floors:
    """What the distributed values of GPU ranks are held to: the float64 eager reference
    (``exact``: loss, joined outputs, gradients) and the noise floors measured on the ranks'
    GPU (its fp32 eager values against ``exact``; zero where eager could not run there)."""

    exact: tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]
    loss: float = 0.0
    outputs: tuple[float, ...] = ()
    grads: dict[str, float] = field(default_factory=dict)

    def output(self, k: int) -> float:
        return self.outputs[k] if k < len(self.outputs) else 0.0


def _floors(
    gathered: list[dict[str, Any]],
    local: Pipeline,
    spec: ModelSpec,
    asked: CheckSettings,
    asynchronous: bool,
    device: torch.device | None = None,
) -> Floors | None:
    """The noise floors, when the ranks ran on GPUs: their kernels round otherwise than the
    CPU's (other summation orders; cuDNN's convolution algorithms), so the distributed values
    are held to the noise-floor rule against the local backend's CPU values, as ``run --check``
    holds the pipeline to eager's, rather than to equality; the floor is the larger of the
    CPU's and that of eager on ``device`` (rank 0's GPU). None on CPU ranks, for given
    ``--atol``/``--rtol``, and for PipeDream's weights after a step."""
    if not any(part.get("gpu") for part in gathered) or asynchronous:
        return None
    if asked.tolerance.given:
        return None
    assert spec.model is not None and spec.targets is not None and spec.loss_fn is not None
    batch = (local, spec.model, spec.inputs, spec.targets, spec.loss_fn)
    exact = float64_reference(*batch)
    if exact is None:
        return None
    there = eager_on_device(*batch, device) if device is not None else None
    if there is None:
        return Floors(exact)
    return Floors(
        exact,
        _gap(there[0], exact[0]),
        tuple(_gap(a, b) for a, b in zip(there[1], exact[1])),
        {n: _gap(g, exact[2][n]) for n, g in there[2].items() if n in exact[2]},
    )


def _gap(have: torch.Tensor, exact: torch.Tensor) -> float:
    if have.shape != exact.shape or not have.is_floating_point():
        return 0.0
    return float((have.double() - exact.double()).abs().max()) if have.numel() else 0.0


def check_distributed(
    pipe: Pipeline,
    spec: ModelSpec,
    asked: CheckSettings,
    inputs: dict[str, torch.Tensor],
    targets: tuple[torch.Tensor, ...],
) -> CheckReport:
    """Returns the report on rank 0 (an empty, passing one elsewhere). ``inputs`` and
    ``targets`` are the example's, on this rank's device; the comparison runs on the CPU."""
    assert spec.targets is not None and spec.loss_fn is not None
    if pipe.asynchronous:
        pipe.set_optimizer(lambda ps: torch.optim.SGD(ps, lr=asked.lr))
    grads: dict[str, torch.Tensor] = {}
    step = pipe.train_step(
        inputs,
        targets,
        spec.loss_fn,
        on_step=lambda j: grads.update(pipe.named_grads(j)),
    )
    values = pipe.state_dict() if pipe.asynchronous else grads
    mine: dict[str, Any] = {
        "values": {k: v.cpu() for k, v in values.items()},
        "losses": {i: float(v) for i, v in step.losses.items()},
        "outputs": {i: tuple(t.cpu() for t in r) for i, r in step.results.items()},
        "gpu": pipe.default_device is not None,
    }
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.gather_object(mine, gathered if dist.get_rank() == 0 else None, dst=0)
    if dist.get_rank() != 0:
        return CheckReport("(reported by rank 0)")
    return _compare_on_rank0(gathered, spec, asked, pipe.asynchronous, pipe.default_device)


def _compare_on_rank0(
    gathered: list[dict[str, Any]],
    spec: ModelSpec,
    asked: CheckSettings,
    asynchronous: bool,
    device: torch.device | None = None,
) -> CheckReport:
    assert spec.model is not None and spec.targets is not None and spec.loss_fn is not None
    local = Pipeline.load(asked.directory, asked.program)
    report = check_against_eager(local, spec, lr=asked.lr, tolerance=asked.tolerance)
    local_values, local_loss, local_outs = _local_step(local, spec, asynchronous)
    values: dict[str, torch.Tensor] = {}
    for part in gathered:
        values.update(part["values"])
    floors = _floors(gathered, local, spec, asked, asynchronous, device)
    exact = floors.exact if floors else None
    # the distributed comparisons' own report: their noise ratios are printed on their line
    mine = CheckReport(report.reference)
    what = "weights after the step" if asynchronous else "gradient"
    worst = _compare_values(mine, what, values, local_values, asked, exact, floors)
    line = f"  distributed ({len(gathered)} ranks) vs local backend: {what} max |diff| {worst:.3e}"
    losses = {i: v for part in gathered for i, v in part["losses"].items()}
    results = {i: v for part in gathered for i, v in part["outputs"].items()}
    if local_loss is not None:
        diff = compare(
            mine,
            "distributed loss",
            torch.tensor(sum(losses.values())),
            local_loss.detach(),
            asked.tolerance,
            exact[0] if exact else None,
            "loss",
            floors.loss if floors else 0.0,
        )
        line += f", loss {diff:.3e}"
    if local_outs is not None:
        joined = join_microbatches([results[i] for i in sorted(results)])
        twins = exact[1] if exact else [None] * len(local_outs)
        out_diff = max(
            compare(
                mine,
                f"distributed output {k}",
                have,
                want,
                asked.tolerance,
                e,
                "outputs",
                floors.output(k) if floors else 0.0,
            )
            for k, (have, want, e) in enumerate(zip(joined, local_outs, twins))
        )
        line += f", outputs {out_diff:.3e}"
    if floors is not None and mine.ratios:
        line += f" ({max(mine.ratios.values()):.2g}x the noise floor at most"
        line += ", floors measured on the CPU and the GPU)" if floors.grads else ")"
    report.notes.append(line)
    report.failures += mine.failures
    return report


def _local_step(
    local: Pipeline, spec: ModelSpec, asynchronous: bool
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None, list[torch.Tensor] | None]:
    """The one-process reference: its weights after the step (asynchronous), else its
    gradients, loss and joined outputs."""
    assert spec.targets is not None and spec.loss_fn is not None
    if asynchronous:
        return local.state_dict(), None, None
    grads: dict[str, torch.Tensor] = {}
    step = local.train_step(
        spec.inputs,
        spec.targets,
        spec.loss_fn,
        on_step=lambda j: grads.update(local.named_grads(j)),
    )
    return grads, step.loss, join_microbatches(step.outputs)


def _compare_values(
    mine: CheckReport,
    what: str,
    values: dict[str, torch.Tensor],
    local_values: dict[str, torch.Tensor],
    asked: CheckSettings,
    exact: Any,
    floors: Any,
) -> float:
    """Each of the reference's gradients (or weights) against the ranks' (failures into
    ``mine``); returns the largest difference."""
    worst = 0.0
    for name, want in local_values.items():
        if name not in values:
            mine.failures.append(f"distributed run has no {what} for {name}")
            continue
        found = compare(
            mine,
            f"distributed {what} of {name}",
            values[name],
            want,
            asked.tolerance,
            exact[2].get(name) if exact else None,
            "grads",
            floors.grads.get(name, 0.0) if floors else 0.0,
        )
        worst = max(worst, found)
    return worst
