"""Compare one pipelined training step with the eager model: loss, outputs and gradients.

The reference is the eager model on the same mini-batch. A model with BatchNorm in training
mode normalises each micro-batch with its own statistics (as in torchgpipe), so its reference
runs the eager model on the same micro-batches, averaging their losses.
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipecompile.errors import InputError, MicrobatchError, ModelFileError, PipecompileError
from pipecompile.ir.graph.microbatch import (
    batch_rows,
    check_target_rows,
    join_microbatches,
    row_shares,
    split_microbatches,
    split_targets,
)
from pipecompile.ir.graph.noise_floor import NOISE_RULE, Tolerance, agreement, within_rounding
from pipecompile.ir.graph.user_frame import innermost_outside
from pipecompile.ir.graph.values import tensor_leaves
from pipecompile.ir.records.sizes import counted
from pipecompile.model.init_recipe import is_meta_model
from pipecompile.model.own_forward import tracing
from pipecompile.runtime.executor import LossFn, call_loss_fn
from pipecompile.runtime.materialise import allocate
from pipecompile.runtime.pipeline import Pipeline

__all__ = [
    "CheckReport",
    "check_step",
    "compare",
    "worst",
    "fit_weights",
    "eager_forward",
    "check_targets",
    "join_outputs",
    "float64_reference",
    "eager_on_device",
]


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
    ratios: dict[str, float] = field(default_factory=dict)  # worst error / noise floor

    @property
    def ok(self) -> bool:
        return not self.failures

    def __str__(self) -> str:
        lines = [
            f"reference: eager model, {self.reference}",
            f"  loss     max |diff| {self.loss_diff:.3e}{self._ratio('loss')}",
            f"  outputs  max |diff| {self.output_diff:.3e}{self._ratio('outputs')}",
            f"  {self.what:<8} max |diff| {self.grad_diff:.3e}{self._ratio(self.what)}  "
            f"({self.worst_grad or '-'})",
        ]
        lines += self.notes
        lines += [f"  MISMATCH {f}" for f in self.failures[:10]]
        lines.append(
            "check passed" if self.ok else f"check FAILED: {len(self.failures)} mismatches"
        )
        return "\n".join(lines)

    def _ratio(self, kind: str) -> str:
        """The worst error in noise floors (float64 against the model's dtype)."""
        if kind not in self.ratios:
            return ""
        ratio = self.ratios[kind]
        if math.isinf(ratio) or math.isnan(ratio):  # a shape, a NaN or an integer that differs
            return "  (beyond any noise floor)"
        return f"  ({'0' if ratio == 0 else f'{ratio:.2g}'}x the noise floor)"


def check_step(
    pipe: Pipeline,
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    targets: tuple[torch.Tensor, ...],
    loss_fn: LossFn,
    *,
    tolerance: Tolerance = NOISE_RULE,
    measure_memory: bool = False,
    split: bool = False,
) -> CheckReport:
    """Load the pipeline's weights into ``model``, run one step on both, compare.
    ``measure_memory`` is passed to the pipeline's step (see ``Pipeline.train_step``).

    Each value agrees when it is within the noise floor rule of ``ir.noise_floor`` (the eager
    model run again in float64 says how much rounding alone moves it); a ``tolerance`` given
    is the rule instead (``atol + rtol * |eager|``; no float64 run is made), as
    is 1e-5 each for a model that cannot run in float64.

    Raises:
        ModelFileError: ``model`` does not fit the pipeline's weights, or it or ``loss_fn``
            failed in the eager reference.
        InputError, MicrobatchError: inputs, targets or outputs that cannot be split or
            joined as the pipeline does.
    """
    model.load_state_dict(fit_weights(pipe, model), strict=True)
    count = pipe.program.microbatches
    per_micro = split or _per_micro(model)
    why = (
        "the whole mini-batch differs in eager itself"
        if split
        else "BatchNorm statistics per micro-batch"
    )
    reference = f"{counted(count, 'micro-batch')} ({why})" if per_micro else "whole mini-batch"
    ref_loss, ref_parts, ref_grads = _eager(
        pipe, model, inputs, targets, loss_fn, count if per_micro else 1
    )
    whole = pipe.manifest.tail is not None and len(ref_parts) == 1  # as the model returns it
    ref_outs = list(ref_parts[0]) if whole else join_outputs(pipe, ref_parts)
    grads: dict[str, torch.Tensor] = {}
    step = pipe.train_step(
        inputs,
        targets,
        loss_fn,
        on_step=lambda j: grads.update(pipe.named_grads(j)),
        measure_memory=measure_memory,
    )
    loss, outs = step.loss, step.outputs
    report = CheckReport(reference)
    joined = _pipeline_outputs(pipe, outs, ref_outs)
    pairs = [(loss, ref_loss), *zip(joined, ref_outs)]
    pairs += [(grads[n], g) for n, g in ref_grads.items() if n in grads]
    near = all(_within_rounding(h, w) for h, w in pairs)
    exact = _twin(
        report,
        (ref_loss, ref_outs, ref_grads) if near else None,
        tolerance.given,
        lambda: _eager_float64(pipe, model, inputs, targets, loss_fn, count if per_micro else 1),
    )
    values = (loss, ref_loss, joined, ref_outs, grads, ref_grads)
    _compare_values(report, values, exact, tolerance, model)
    if near:
        report.ratios.clear()  # measured against eager itself: no floor to state
    randoms = [op for entry in pipe.manifest.stages for op in entry.random_ops or ()]
    if not report.ok and not per_micro and count > 1 and not tolerance.given:
        whole = None if near else exact  # the float64 whole-batch run made above, if any
        again = _split_again(report, pipe, model, inputs, targets, loss_fn, whole)
        if again is not None:
            return again
    if randoms and not report.ok:
        report.notes.append(
            f"  (the model draws random numbers ({', '.join(randoms[:3])}"
            f"{', ...' if len(randoms) > 3 else ''}), which the eager model draws in another "
            "order: compare with them off - dropout and drop-path rates 0, or eval mode)"
        )
    return report


def _twin(
    report: CheckReport,
    eager: tuple[Any, list[torch.Tensor], dict[str, torch.Tensor]] | None,
    tolerances_given: bool,
    float64: Callable[[], tuple[Any, list[torch.Tensor], dict[str, torch.Tensor]] | None],
) -> tuple[Any, list[torch.Tensor], dict[str, torch.Tensor]] | None:
    """The values each result's noise floor is measured against: eager's own (``eager``,
    given when every value is within rounding of it: no float64 run needed), none where the
    tolerances given decide, else the model run again in float64 (None, noted, where it
    cannot run so)."""
    if eager is not None:
        report.notes.append("  (every value within 8 units in the last place of eager's)")
        return eager
    if tolerances_given:
        return None  # no float64 run, no noise floor to state
    exact = float64()
    if exact is None:
        report.notes.append("  (no float64 run of the model: fixed tolerances)")
    return exact


def _compare_values(
    report: CheckReport,
    values: tuple[Any, ...],
    exact: tuple[Any, list[torch.Tensor], dict[str, torch.Tensor]] | None,
    tolerance: Tolerance,
    model: nn.Module,
) -> None:
    """Compare the pipeline's loss, outputs and gradients with eager's (``values``: loss,
    eager's loss, outputs, eager's, gradients, eager's) into ``report``, each against the
    float64 run's value where ``exact`` holds one."""
    loss, ref_loss, joined, ref_outs, grads, ref_grads = values
    twin = exact or _NO_TWIN
    report.loss_diff = compare(report, "loss", loss, ref_loss, tolerance, twin[0], "loss")
    for k, (have, want, e) in enumerate(zip(joined, ref_outs, twin[1] or ref_outs)):
        e = e if exact else None
        found = compare(report, f"output {k}", have, want, tolerance, e, "outputs")
        report.output_diff = worst(report.output_diff, found)
    if not any(p.requires_grad for p in model.parameters()):
        report.notes.append("  (the model has no trainable parameters: no gradients to compare)")
    for name, want in ref_grads.items():
        found = grads.get(name)
        if found is None:
            report.failures.append(f"gradient of {name}: the pipeline computed none")
            continue
        e = twin[2].get(name)
        diff = compare(report, f"gradient of {name}", found, want, tolerance, e, "grads")
        if not diff < report.grad_diff:  # NaN is the worst
            report.grad_diff, report.worst_grad = diff, name


def _split_again(
    report: CheckReport,
    pipe: Pipeline,
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    targets: tuple[torch.Tensor, ...],
    loss_fn: LossFn,
    whole: tuple[Any, list[torch.Tensor], dict[str, torch.Tensor]] | None,
) -> CheckReport | None:
    """A whole-batch check that failed, checked again against eager on the micro-batches:
    that report where the split alone moves eager (a per-sample model at ReLU kinks); else
    None, ``report`` noting when the model mixes the samples of a batch."""
    count = pipe.program.microbatches
    again = check_step(pipe, model, inputs, targets, loss_fn, split=True)
    moved = _split_moves(pipe, model, inputs, targets, loss_fn, count, whole) if again.ok else None
    if again.ok and moved is not None and moved <= SPLIT_FLOOR:
        again.notes.append(
            f"  (against eager on the whole mini-batch: {len(report.failures)} values beyond "
            f"the noise floor, largest gradient difference {report.grad_diff:.3e}. The "
            f"pipeline equals eager on its {count} micro-batches, and in float64 the split "
            f"moves eager by {moved:.1e} of each value at most: a per-sample model whose "
            "float32 result depends on how the batch is split, as at ReLU kinks)"
        )
        return again
    if again.ok and moved is not None:
        report.notes.append(
            f"  (the pipeline equals eager on its {count} micro-batches, but the model "
            f"mixes samples of a batch: in float64, splitting it in {count} moves eager by "
            f"{moved:.1e} of a value. Micro-batching changes what it computes; compile "
            "with --microbatches 1, or make its forward per-sample)"
        )
    return None


def fit_weights(pipe: Pipeline, model: nn.Module) -> dict[str, torch.Tensor]:
    """The pipeline's weights under ``model``'s names, for ``model.load_state_dict``, with
    ``model``'s own state-dict metadata (each module's version, which modules' own loading
    hooks read: torchvision's MNASNet refuses a state dict without it).

    Raises:
        ModelFileError: ``model`` has a tensor the pipeline lacks, or one of another shape
            (it is not the model the pipeline was compiled from).
    """
    state = pipe.state_dict()
    _materialise_meta(model, state)
    own, name = model.state_dict(), type(model).__name__
    for key, tensor in own.items():
        if key not in state:
            problem = f"{key} is in {name} but not in {pipe.name}"
        elif tuple(state[key].shape) != tuple(tensor.shape):
            problem = (
                f"{key} is {tuple(tensor.shape)} in {name} but {tuple(state[key].shape)} "
                f"in {pipe.name}"
            )
        else:
            continue
        raise ModelFileError(
            f"the eager model does not fit the compiled weights: {problem}; check with the "
            f"model file {pipe.name} was compiled from (--model), or recompile"
        )
    fitted = OrderedDict((k, v) for k, v in state.items() if k in own)
    fitted._metadata = getattr(own, "_metadata", OrderedDict())  # type: ignore[attr-defined]
    return fitted


def _materialise_meta(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Give a model built on the meta device (the eager reference of a compile without
    weights) memory, and its buffers outside the state dict (e.g. rotary frequencies) the
    pipeline's values; the state dict is loaded by the caller."""
    if not is_meta_model(model):
        return
    allocate(model, "cpu")
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name in state:
                buffer.copy_(state[name])


def _eager(
    pipe: Pipeline,
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    targets: tuple[torch.Tensor, ...],
    loss_fn: LossFn,
    parts: int,
) -> tuple[torch.Tensor, list[list[torch.Tensor]], dict[str, torch.Tensor]]:
    """Mean loss, flat outputs per part and gradients of the eager model over ``parts``
    equal slices of the mini-batch."""
    model.zero_grad(set_to_none=True)
    micro = split_microbatches(inputs, parts)
    rows = batch_rows(inputs)
    micro_targets = split_targets(targets, parts, rows=rows)
    shares = row_shares(rows, parts) if rows is not None else [1.0] * parts
    total, outputs = torch.zeros(()), []
    for batch, target, share in zip(micro, micro_targets, shares):
        out = eager_forward(pipe, lambda b: model(**b), batch, inputs)
        check_targets(pipe, out, target, batch, inputs, scale=parts)
        loss = call_loss_fn(loss_fn, out, target) * share / parts  # weighed by its rows
        if loss.requires_grad:  # not for a model without trainable parameters
            loss.backward()
        total = total + loss.detach()
        outputs.append([t.detach() for t in tensor_leaves(out)])
    grads = {
        n: p.grad.clone()
        for n, p in model.named_parameters(remove_duplicate=False)
        if p.grad is not None
    }
    return total, outputs, grads


SPLIT_FLOOR = 1e-9  # float64 eager, whole against split: beyond this the model mixes samples


def _split_moves(
    pipe: Pipeline,
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    targets: tuple[torch.Tensor, ...],
    loss_fn: LossFn,
    count: int,
    whole: tuple[Any, list[torch.Tensor], dict[str, torch.Tensor]] | None = None,
) -> float | None:
    """How far splitting the batch in ``count`` moves the eager model's loss, outputs and
    gradients in float64, relative to each value's largest magnitude; None when the model
    cannot run in float64. Rounding gives about 1e-16; a model that mixes samples, far more.
    ``whole``: the float64 whole-batch run, where one was made already."""
    whole = whole or _eager_float64(pipe, model, inputs, targets, loss_fn, 1)
    split = _eager_float64(pipe, model, inputs, targets, loss_fn, count)
    if whole is None or split is None:
        return None
    pairs = [(whole[0], split[0]), *zip(whole[1], split[1])]
    pairs += [(g, split[2][n]) for n, g in whole[2].items() if n in split[2]]
    worst = 0.0
    for a, b in pairs:
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.shape == b.shape:
            scale = float(a.abs().max()) if a.numel() else 0.0
            if scale > 0:
                worst = max(worst, float((a - b).abs().max()) / scale)
    return worst


def _per_micro(model: nn.Module) -> bool:
    """Whether the eager reference runs micro-batch by micro-batch (BatchNorm in training
    mode: its statistics are per micro-batch in the pipeline)."""
    return any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training for m in model.modules()
    )


def float64_reference(
    pipe: Pipeline,
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    targets: tuple[torch.Tensor, ...],
    loss_fn: LossFn,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]] | None:
    """``model`` (holding the pipeline's weights) in float64, split as ``check_step`` splits
    it: the loss, joined outputs and gradients that noise floors are measured from; None when
    the model cannot run in float64."""
    parts = pipe.program.microbatches if _per_micro(model) else 1
    return _eager_float64(pipe, model, inputs, targets, loss_fn, parts)


def eager_on_device(
    pipe: Pipeline,
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    targets: tuple[torch.Tensor, ...],
    loss_fn: LossFn,
    device: torch.device,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]] | None:
    """A copy of ``model`` in its own dtype on ``device``, split as ``float64_reference``
    splits it: the loss, joined outputs and gradients (on the CPU) that measure the rounding
    of that device's kernels; None when the model cannot run there."""
    parts = pipe.program.microbatches if _per_micro(model) else 1
    moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    try:  # a model that keeps its forward's tensors on itself (RAFT) cannot be copied either
        there = copy.deepcopy(model).to(device)
        loss, parts_out, grads = _eager(
            pipe, there, moved, tuple(t.to(device) for t in targets), loss_fn, parts
        )
    except Exception:  # a model tied to the CPU: the CPU's floors alone
        return None
    joined = [t.cpu() for t in join_outputs(pipe, parts_out)]
    return loss.cpu(), joined, {name: g.cpu() for name, g in grads.items()}


_NO_TWIN: tuple[None, list[torch.Tensor], dict[str, torch.Tensor]] = (None, [], {})


def _eager_float64(
    pipe: Pipeline,
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    targets: tuple[torch.Tensor, ...],
    loss_fn: LossFn,
    parts: int,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]] | None:
    """The eager reference again in float64 (loss, joined outputs, gradients): how far
    rounding alone moves each value. None when the model or its loss cannot run in float64,
    or the model cannot be copied (one that keeps its forward's tensors on itself, as
    torchvision's RAFT does: a copy of a non-leaf tensor is refused)."""
    wide = {k: _wide(v) for k, v in inputs.items()}
    try:
        twin = copy.deepcopy(model).double()
        loss, parts_out, grads = _eager(
            pipe, twin, wide, tuple(_wide(t) for t in targets), loss_fn, parts
        )
        return loss, join_outputs(pipe, parts_out), grads
    except Exception:  # a model fixed to its dtype: the fixed tolerances decide
        return None


def _within_rounding(have: Any, want: torch.Tensor) -> bool:
    return within_rounding(torch.as_tensor(have), want)


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t


def check_targets(
    pipe: Pipeline,
    output: Any,
    targets: tuple[torch.Tensor, ...],
    batch: dict[str, torch.Tensor],
    inputs: dict[str, torch.Tensor],
    *,
    scale: int,
) -> None:
    """``check_target_rows`` for one slice ``batch`` of ``inputs`` (``scale`` slices); inputs
    that do not fit what was compiled are named first, as they explain the failure."""
    try:
        check_target_rows(
            output,
            targets,
            batch,
            split=pipe.program.microbatches > 1,
            scale=scale,
            source="example_targets()",
        )
    except InputError as err:
        pipe.blame_inputs(inputs, err)
        raise


def _pipeline_outputs(
    pipe: Pipeline, parts: list[Any], reference: list[torch.Tensor]
) -> list[torch.Tensor]:
    """The pipeline's outputs as the model returns them: joined, and its tail run on them
    where the model has one (then its flat tensors)."""
    if pipe.manifest.tail is None:
        return join_outputs(pipe, parts, reference)
    flat = pipe.flat_output(join_microbatches(parts, names=pipe.manifest.outputs))
    return [t for t in flat if isinstance(t, torch.Tensor)]


def join_outputs(
    pipe: Pipeline, parts: list[Any], reference: list[torch.Tensor] | None = None
) -> list[torch.Tensor]:
    """The outputs of the micro-batches joined along the batch dimension.

    Raises:
        MicrobatchError: an output is a scalar, or (compared with the eager ``reference``)
            holds the batch in another dimension than the first, so it cannot be joined.
    """
    names = pipe.manifest.outputs
    joined = join_microbatches(parts, names=names)
    for k, (have, want) in enumerate(zip(joined, reference or ())):
        micro = tuple(parts[0][k].shape)
        dim = _batch_dim(micro, tuple(want.shape), len(parts))
        if tuple(have.shape) != tuple(want.shape) and dim is not None:
            label = f"output {k} ({names[k]})" if k < len(names) else f"output {k}"
            raise MicrobatchError(
                f"{label} has the batch in dimension {dim}, not first: it is {micro} per "
                f"micro-batch and {tuple(want.shape)} for the whole batch, and outputs are "
                "joined along dimension 0; return it batch first (transpose in loss_fn)"
            )
    return joined


def _batch_dim(micro: tuple[int, ...], whole: tuple[int, ...], count: int) -> int | None:
    """The dimension along which ``count`` outputs of shape ``micro`` make ``whole``."""
    if len(micro) != len(whole):
        return None
    for d in range(len(micro)):
        if (
            whole[d] == micro[d] * count
            and whole[:d] + whole[d + 1 :] == micro[:d] + micro[d + 1 :]
        ):
            return d
    return None


def eager_forward(
    pipe: Pipeline,
    forward: Callable[[dict[str, torch.Tensor]], Any],
    batch: dict[str, torch.Tensor],
    inputs: dict[str, torch.Tensor],
) -> Any:
    """``forward(batch)`` on the eager model. A failure is the user's model's, reported with
    the line of the user's file it happened on, or the mini-batch ``inputs``' if they do not
    fit what ``pipe`` was compiled for."""
    try:
        with tracing():  # a @pipecompile.pipeline model runs its own forward here
            return forward(batch)
    except PipecompileError:
        raise
    except Exception as err:
        pipe.blame_inputs(inputs, err)
        raise ModelFileError(
            f"the eager model (the --check reference) failed{_user_line(err)}: "
            f"{type(err).__name__}: {err}"
        ) from err


def _user_line(err: BaseException) -> str:
    """`` at FILE:LINE``: the innermost frame of ``err`` outside torch and pipecompile."""
    frame = innermost_outside(err, (Path(torch.__file__).parent, Path(__file__).parents[1]))
    return f" at {Path(frame.filename).name}:{frame.lineno}" if frame is not None else ""


def compare(
    report: CheckReport,
    what: str,
    have: Any,
    want: torch.Tensor,
    tolerance: Tolerance,
    exact: torch.Tensor | None = None,
    kind: str = "",
    floor: float = 0.0,
) -> float:
    """Compare ``have`` with ``want``, recording a failure in ``report``; return max |diff|.
    A given ``tolerance`` decides (``atol + rtol * |want|``); else, with ``exact`` (``want``
    computed in float64), the noise floor rule (``floor``: one measured on other kernels, used
    where larger); else ``noise_floor.FIXED`` for both. ``kind`` ("loss", "outputs", "grads")
    collects the worst noise ratio, printed either way."""
    have = torch.as_tensor(have).detach()
    want = want.detach()
    if have.shape != want.shape:
        report.failures.append(f"{what}: shape {tuple(have.shape)} vs eager {tuple(want.shape)}")
        return _unbounded(report, kind, float("inf"))
    if not have.is_floating_point():
        same = bool(torch.equal(have, want))
        if not same:
            report.failures.append(f"{what}: values differ")
        return 0.0 if same else _unbounded(report, kind, float("inf"))
    bad = [side for side, t in (("pipeline", have), ("eager", want)) if not t.isfinite().all()]
    if bad:  # NaN compares false with everything: it must never pass for agreement
        report.failures.append(f"{what}: {' and '.join(bad)} not finite (NaN or inf)")
        return _unbounded(report, kind, float("nan"))
    diff = (have - want).abs()
    given = tolerance.given
    fixed = tolerance.bounds()
    within = not bool((diff > fixed[0] + fixed[1] * want.abs()).any())
    found = agreement(have, want, exact, floor) if exact is not None else None
    if found is not None:
        report.ratios[kind] = max(report.ratios.get(kind, 0.0), found.ratio)
    if found is not None and not given:
        if not found.ok:
            report.failures.append(f"{what}: {found}")
    elif not within:
        report.failures.append(f"{what}: max |diff| {diff.max().item():.3e}")
    return float(diff.max()) if diff.numel() else 0.0


def _unbounded(report: CheckReport, kind: str, diff: float) -> float:
    """``diff`` (inf or NaN), the worst of its kind: no noise floor bounds it, and the
    report's line says so rather than the ratio of the values that did compare."""
    if kind:
        report.ratios[kind] = math.inf
    return diff


def worst(a: float, b: float) -> float:
    """The larger difference, NaN counting as the largest of all."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)
