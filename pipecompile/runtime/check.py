"""Compare one pipelined training step with the eager model: loss, outputs and gradients.

The reference is the eager model on the same mini-batch. A model with BatchNorm in training
mode normalises each micro-batch with its own statistics (as in torchgpipe), so its reference
runs the eager model on the same micro-batches, averaging their losses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from pipecompile.frontend import tracing
from pipecompile.runtime.executor import LossFn
from pipecompile.runtime.microbatch import join_microbatches, split_microbatches, split_targets
from pipecompile.runtime.pipeline import Pipeline

__all__ = ["CheckReport", "check_step", "compare"]


@dataclass
class CheckReport:
    """Largest absolute differences and whether every value is within tolerance."""

    reference: str
    what: str = "grads"
    loss_diff: float = 0.0
    output_diff: float = 0.0
    grad_diff: float = 0.0
    worst_grad: str = ""
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def __str__(self) -> str:
        lines = [
            f"reference: eager model, {self.reference}",
            f"  loss     max |diff| {self.loss_diff:.3e}",
            f"  outputs  max |diff| {self.output_diff:.3e}",
            f"  {self.what:<8} max |diff| {self.grad_diff:.3e}  ({self.worst_grad or '-'})",
        ]
        lines += self.notes
        lines += [f"  MISMATCH {f}" for f in self.failures[:10]]
        lines.append(
            "check passed" if self.ok else f"check FAILED: {len(self.failures)} mismatches"
        )
        return "\n".join(lines)


def check_step(
    pipe: Pipeline,
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    targets: tuple[torch.Tensor, ...],
    loss_fn: LossFn,
    *,
    atol: float = 1e-5,
    rtol: float = 1e-5,
    measure_memory: bool = False,
) -> CheckReport:
    """Load the pipeline's weights into ``model``, run one step on both, compare.
    ``measure_memory`` is passed to the pipeline's step (see ``Pipeline.train_step``)."""
    model.load_state_dict(_restrict(pipe.state_dict(), model), strict=True)
    count = pipe.program.microbatches
    per_micro = any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training for m in model.modules()
    )
    reference = (
        f"{count} micro-batches (BatchNorm statistics per micro-batch)"
        if per_micro
        else "whole mini-batch"
    )
    ref_loss, ref_outs, ref_grads = _eager(
        model, inputs, targets, loss_fn, count if per_micro else 1
    )
    grads: dict[str, torch.Tensor] = {}
    loss, outs = pipe.train_step(
        inputs, targets, loss_fn, on_step=lambda j: grads.update(pipe.named_grads(j)),
        measure_memory=measure_memory,
    )  # fmt: skip
    report = CheckReport(reference)
    report.loss_diff = compare(report, "loss", loss, ref_loss, atol, rtol)
    joined = join_microbatches(outs)
    for k, (have, want) in enumerate(zip(joined, ref_outs)):
        report.output_diff = max(
            report.output_diff, compare(report, f"output {k}", have, want, atol, rtol)
        )
    for name, want in ref_grads.items():
        found = grads.get(name)
        if found is None:
            report.failures.append(f"gradient of {name}: the pipeline computed none")
            continue
        diff = compare(report, f"gradient of {name}", found, want, atol, rtol)
        if diff >= report.grad_diff:
            report.grad_diff, report.worst_grad = diff, name
    return report


def _restrict(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    wanted = model.state_dict().keys()
    return {k: v for k, v in state.items() if k in wanted}


def _eager(
    model: nn.Module, inputs: dict[str, torch.Tensor], targets: tuple[torch.Tensor, ...],
    loss_fn: LossFn, parts: int,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:  # fmt: skip
    model.zero_grad(set_to_none=True)
    micro = split_microbatches(inputs, parts)
    micro_targets = split_targets(targets, parts)
    total, outputs = torch.zeros(()), []
    for batch, target in zip(micro, micro_targets):
        with tracing():  # a @pipecompile.pipeline model runs its own forward here
            out = model(**batch)
        loss = loss_fn(out, *target) / parts
        loss.backward()
        total = total + loss.detach()
        outputs.append([t.detach() for t in pytree.tree_leaves(out)])
    joined = join_microbatches(outputs)
    grads = {
        n: p.grad.clone()
        for n, p in model.named_parameters(remove_duplicate=False)
        if p.grad is not None
    }
    return total, joined, grads


def compare(
    report: CheckReport, what: str, have: Any, want: torch.Tensor, atol: float, rtol: float
) -> float:
    have = torch.as_tensor(have).detach()
    want = want.detach()
    if have.shape != want.shape:
        report.failures.append(f"{what}: shape {tuple(have.shape)} vs eager {tuple(want.shape)}")
        return float("inf")
    if not have.is_floating_point():
        same = bool(torch.equal(have, want))
        if not same:
            report.failures.append(f"{what}: values differ")
        return 0.0 if same else float("inf")
    diff = (have - want).abs()
    if bool((diff > atol + rtol * want.abs()).any()):
        report.failures.append(f"{what}: max |diff| {diff.max().item():.3e}")
    return float(diff.max()) if diff.numel() else 0.0
