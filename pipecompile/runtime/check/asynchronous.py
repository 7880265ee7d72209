"""Compare one asynchronous (PipeDream, PipeDream-2BW) step with weight-stashed SGD on the
eager model.

The reference follows the program's weight versions: stage j's forward and backward of
micro-batch i use stage j's weights after the UPDATEs that precede its STASH (or its
forward) on the device. Micro-batches are replayed in order on the eager model with each
stage's parameters at that version (``torch.func.functional_call``); each UPDATE applies
plain SGD with that micro-batch's own gradient. The pipeline runs the same step with SGD;
losses, outputs and the weights after the step must agree. PipeDream-2BW is checked
against its own rule instead, written from its definition (``_reference_2bw``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from pipecompile.ir.graph.microbatch import split_microbatches, split_targets
from pipecompile.ir.graph.noise_floor import NOISE_RULE, Tolerance
from pipecompile.ir.graph.swapped_call import functional_call
from pipecompile.ir.graph.values import tensor_leaves
from pipecompile.ir.programs.instr import FORWARD_OPS, Op
from pipecompile.ir.programs.program import Program
from pipecompile.runtime.check.step import (
    CheckReport,
    check_targets,
    compare,
    eager_forward,
    fit_weights,
    join_outputs,
    worst,
)
from pipecompile.runtime.executor import LossFn, call_loss_fn
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.schedules import schedule_of

__all__ = ["check_async_step", "weight_versions"]


def weight_versions(program: Program) -> dict[tuple[int, int], int]:
    """(stage, micro-batch) -> how many of the stage's UPDATEs its forward's weights include."""
    versions: dict[tuple[int, int], int] = {}
    for instrs in program.devices:
        updates: dict[int, int] = {}
        for x in instrs:
            key = (x.stage, x.microbatch or 0)
            if x.op == Op.UPDATE:
                updates[x.stage] = updates.get(x.stage, 0) + 1
            elif x.op == Op.STASH or (x.op in FORWARD_OPS and key not in versions):
                versions[key] = updates.get(x.stage, 0)
    return versions


def check_async_step(
    pipe: Pipeline,
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    targets: tuple[torch.Tensor, ...],
    loss_fn: LossFn,
    *,
    lr: float = 1e-3,
    tolerance: Tolerance = NOISE_RULE,
) -> CheckReport:
    """Run one SGD step of ``pipe`` and of the reference from the same weights; compare.

    Raises:
        ModelFileError, InputError, MicrobatchError: as ``check_step``.
    """
    fit_weights(pipe, model)  # the same model as compiled, or a clear error
    start = {k: v.clone() for k, v in pipe.state_dict().items()}  # never the live tensors
    owner = {
        original: j
        for j, params in enumerate(pipe.layout.params)
        for originals in params.values()
        for original in originals
    }
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    two_versions = schedule_of(pipe.program.schedule).weight_versions == "window"
    reference = _reference_2bw if two_versions else _reference
    ref = _Reference(pipe, model, start, owner, trainable, inputs, targets, loss_fn, lr)
    ref_loss, ref_parts, ref_weights = reference(ref)
    ref_outs = join_outputs(pipe, ref_parts)
    pipe.set_optimizer(lambda ps: torch.optim.SGD(ps, lr=lr))
    step = pipe.train_step(inputs, targets, loss_fn)
    loss, outs = step.loss, step.outputs
    what = (
        "SGD on each window's mean gradient, one version stale (PipeDream-2BW)"
        if two_versions
        else "weight-stashed SGD per micro-batch (PipeDream)"
    )
    report = CheckReport(what, what="weights")
    report.loss_diff = compare(report, "loss", loss, ref_loss, tolerance)
    joined = join_outputs(pipe, outs, ref_outs)
    for k, (have, want) in enumerate(zip(joined, ref_outs)):
        report.output_diff = worst(
            report.output_diff, compare(report, f"output {k}", have, want, tolerance)
        )
    after = pipe.state_dict()
    for name, want in ref_weights.items():
        diff = compare(report, f"weight {name} after the step", after[name], want, tolerance)
        if not diff < report.grad_diff:  # NaN is the worst
            report.grad_diff, report.worst_grad = diff, name
    return report


@dataclass(frozen=True)
class _Reference:
    """What the reference step reads: the pipeline (its program and splitting), the eager
    model, the weights the step starts from, each weight's owning stage, the trainable
    names, the mini-batch, its targets, the loss and SGD's learning rate."""

    pipe: Pipeline
    model: nn.Module
    start: dict[str, torch.Tensor]
    owner: dict[str, int]
    trainable: set[str]
    inputs: dict[str, torch.Tensor]
    targets: tuple[torch.Tensor, ...]
    loss_fn: LossFn
    lr: float


_Outcome = tuple[torch.Tensor, list[list[torch.Tensor]], dict[str, torch.Tensor]]


def _reference(ref: _Reference) -> _Outcome:
    """PipeDream's rule: each micro-batch on the weight version its stage stashed, each
    gradient applied at once (SGD)."""
    pipe, start, owner, lr = ref.pipe, ref.start, ref.owner, ref.lr
    m = pipe.program.microbatches
    versions = weight_versions(pipe.program)
    names = [n for n in start if n in ref.trainable]
    history = {n: [start[n].detach().clone()] for n in names}  # history[n][v]: version v
    buffers = _buffers(ref.model, start, ref.trainable)
    total, outputs = torch.zeros(()), []
    micro = zip(split_microbatches(ref.inputs, m), split_targets(ref.targets, m))
    for i, (batch, target) in enumerate(micro):
        weights = {n: history[n][versions[(owner[n], i)]] for n in names}
        loss, grads, out = _micro_step(ref, buffers, weights, batch, target)
        for n, g in zip(names, grads):
            latest = history[n][-1]
            history[n].append(latest - lr * g if g is not None else latest.clone())
        total = total + loss.detach() / m
        outputs.append(out)
    return total, outputs, {n: h[-1] for n, h in history.items()}


def _reference_2bw(ref: _Reference) -> _Outcome:
    """PipeDream-2BW's rule, from its definition and not from the program: windows of w = p
    micro-batches; window k runs on V(k-1) (V(-1) = V(0), the step's starting weights) and
    V(k+1) = V(k) - lr * (the mean gradient of window k)."""
    pipe, start, lr = ref.pipe, ref.start, ref.lr
    m, w = pipe.program.microbatches, pipe.program.num_stages
    names = [n for n in start if n in ref.trainable]
    versions = [{n: start[n].detach().clone() for n in names}]  # versions[v] = V(v)
    buffers = _buffers(ref.model, start, ref.trainable)
    total, outputs = torch.zeros(()), []
    micro = list(zip(split_microbatches(ref.inputs, m), split_targets(ref.targets, m)))
    for k in range(m // w):
        weights = versions[max(k - 1, 0)]
        summed: dict[str, torch.Tensor] = {}
        for batch, target in micro[k * w : (k + 1) * w]:
            loss, grads, out = _micro_step(ref, buffers, weights, batch, target, share=w)
            for n, g in zip(names, grads):
                if g is not None:
                    summed[n] = summed[n] + g if n in summed else g
            total = total + loss.detach() / m
            outputs.append(out)
        latest = versions[-1]
        versions.append(
            {n: latest[n] - lr * summed[n] if n in summed else latest[n] for n in names}
        )
    # every stage runs window k on V(k-1): no stage-dependent versions (``owner`` unread)
    return total, outputs, versions[-1]


def _buffers(
    model: nn.Module, start: dict[str, torch.Tensor], trainable: set[str]
) -> dict[str, torch.Tensor]:
    """The model's buffers as the step starts (the reference never updates them)."""
    own = dict(model.named_buffers())
    return {n: t for n, t in start.items() if n not in trainable and n in own}


def _micro_step(
    ref: _Reference,
    buffers: dict[str, torch.Tensor],
    weights: dict[str, torch.Tensor],
    batch: dict[str, torch.Tensor],
    target: tuple[torch.Tensor, ...],
    *,
    share: int = 1,
) -> tuple[torch.Tensor, tuple[torch.Tensor | None, ...], list[torch.Tensor]]:
    """One micro-batch on the eager model at ``weights``: its loss, the gradient of the loss
    over ``share`` for each weight (in ``weights``' order; None where unused) and its
    outputs' tensors."""
    pipe, inputs = ref.pipe, ref.inputs
    m = pipe.program.microbatches
    names = list(weights)
    used = {n: weights[n].clone().requires_grad_() for n in names}
    call = functools.partial(functional_call, ref.model, {**buffers, **used}, ())
    out = eager_forward(pipe, call, batch, inputs)
    check_targets(pipe, out, target, batch, inputs, scale=m)
    loss = call_loss_fn(ref.loss_fn, out, target)
    grads = (
        torch.autograd.grad(
            loss / share if share != 1 else loss, list(used.values()), allow_unused=True
        )
        if names and loss.requires_grad
        else (None,) * len(names)
    )
    return loss, tuple(grads), [t.detach() for t in tensor_leaves(out)]
