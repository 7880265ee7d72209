"""One optimizer step of the training loop: ``accumulate`` mini-batches through the program,
then the decisions every rank takes alike on the summed loss (a non-finite one stops the run
or drops the step; fp16 overflow skips it and halves the scale), unscaling, clipping, the
step, and its record."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial

import torch

from pipecompile.errors import PipecompileError, RuntimeFailure
from pipecompile.ir.graph.microbatch import batch_rows
from pipecompile.model.data_hooks import Batch
from pipecompile.options.run import TrainFlags
from pipecompile.runtime.executor import LossFn
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.state.precision import LossScaler
from pipecompile.runtime.state.random_state import step_base
from pipecompile.runtime.state.step_options import StepOptions
from pipecompile.runtime.state.step_result import StepResult
from pipecompile.runtime.state.whole_loss import Gather
from pipecompile.runtime.timeline import traced
from pipecompile.runtime.training.copy_share import SIT_OUT
from pipecompile.runtime.training.data_parallel import DataParallel
from pipecompile.runtime.training.diagnosis import in_batch
from pipecompile.runtime.training.divergence import check_losses
from pipecompile.runtime.training.feed import Feed, agreed_sizes
from pipecompile.runtime.training.grad_ops import (
    add_grads,
    all_finite,
    scale_grads,
    squared_norm,
    take_grads,
)
from pipecompile.runtime.training.group import Group
from pipecompile.runtime.training.metrics import (
    batch_counts,
    local_bubble,
    optimizer_state_bytes,
    peak_memory,
)
from pipecompile.runtime.training.records import StepRecord

__all__ = ["StepContext", "one_step"]


@dataclass(frozen=True)
class StepContext:
    """What every step of one run reads, passed whole: the pipeline and its loss, the data
    (a ``Feed``, or this copy's share of one), the training options, the ranks, the fp16 loss
    scaler, the run's seed, whether this rank reads the inputs and the targets, whether the
    run is one process, and this copy's data-parallel part."""

    pipe: Pipeline
    loss_fn: LossFn
    feed: Feed
    options: TrainFlags
    group: Group
    scaler: LossScaler | None
    seed: int
    reads: tuple[bool, bool]
    one_process: bool
    dp: DataParallel


@dataclass(frozen=True)
class _Summed:
    """A step's figures summed over the ranks, which every rank decides on alike."""

    loss: float
    overflowed: bool
    bad: dict[int, torch.Tensor] | None  # the first non-finite part's losses, on its rank
    sq_norm: float
    unscale: float


@dataclass
class _Parts:
    """What this rank's parts of one step gave: compute time, bytes sent, the summed loss,
    the first non-finite part's losses, and the samples, tokens and mini-batches used."""

    busy_ns: int = 0
    sent: int = 0
    loss: float = 0.0
    bad: dict[int, torch.Tensor] | None = None
    samples: int = 0
    tokens: int = 0
    used: int = 0


def one_step(ctx: StepContext, step: int) -> tuple[StepRecord, str] | None:
    """One optimizer step and the note its line ends with; None if the data ended before it
    began. With data-parallel copies, this copy's parts are its share of D x ``accumulate``
    mini-batches (part a of copy k is mini-batch a*D + k of the step)."""
    pipe, options, group, scaler, dp = ctx.pipe, ctx.options, ctx.group, ctx.scaler, ctx.dp
    sync = not pipe.asynchronous
    m, parts = pipe.program.microbatches, options.accumulate
    loss_scale = (scaler.scale if scaler else 1.0) / (m * parts * dp.loss_copies) if sync else 1.0
    began = time.perf_counter()
    home = pipe.device if pipe.device is not None else pipe.program.stage_device[0]
    done = _parts(ctx, step, loss_scale, home)
    if done is None:
        return None
    if sync:
        with traced(pipe.tracer, home, "communication", "data-parallel sum", "all-reduce"):
            dp.finish(pipe.modules)
    overflow = 1.0 if sync and scaler is not None and not all_finite(pipe) else 0.0
    counted = sync and options.clip_grad_norm is not None and dp.counts_norm
    sq = squared_norm(pipe) if counted else 0.0
    mine = [float(done.used), float(done.samples), float(done.tokens)] if dp.lead else [0.0] * 3
    with traced(pipe.tracer, home, "communication", "loss sum", "all-reduce"):
        summed = group.sum([done.loss, overflow, sq, done.sent, *mine])
    summed_loss, overflows, sq_norm, sent_total = summed[:4]
    used, samples, tokens = (int(v) for v in summed[4:])
    loss = summed_loss / (m * used)
    unscale = (1.0 / scaler.scale if scaler is not None else 1.0) * parts * dp.size / used
    summed_up = _Summed(loss, overflows > 0, done.bad, sq_norm, unscale)
    note, skipped, grad_norm = _decide(ctx, step, summed_up)
    seconds = time.perf_counter() - began
    with traced(pipe.tracer, home, "communication", "metrics gather", "all-reduce"):
        busy = group.gather(
            [
                done.busy_ns / 1e9 / seconds,
                optimizer_state_bytes(pipe),
                *peak_memory(pipe, one_process=ctx.one_process),
            ]
        )
    record = StepRecord(
        step=step + 1,
        epoch=ctx.feed.epoch,
        loss=loss,
        lr=_lr(pipe),
        step_ms=seconds * 1000,
        samples_per_s=samples / seconds,
        tokens_per_s=tokens / seconds if tokens else None,
        bubble=local_bubble(pipe) if ctx.one_process else 1 - sum(b[0] for b in busy) / len(busy),
        peak_memory=[int(v) for b in busy for v in b[2:]],
        sent_bytes=int(sent_total),
        grad_norm=grad_norm,
        loss_scale=scaler.scale if scaler is not None else None,
        skipped=skipped,
        optimizer_state_bytes=[int(b[1]) for b in busy],
    )
    return record, note


def _splits(ctx: StepContext) -> tuple[str, ...]:
    """How the run splits each batch besides its micro-batches."""
    accumulate, copies = ctx.options.accumulate, ctx.dp.size
    return (
        *((f"--accumulate {accumulate}",) if accumulate > 1 else ()),
        *((f"{copies} data-parallel copies",) if copies > 1 else ()),
    )


def _gather(ctx: StepContext) -> Gather | None:
    """How a loss over the whole batch gathers the copies' values (None: one copy, or a loss
    per micro-batch)."""
    return ctx.dp.gather if ctx.dp.size > 1 and ctx.pipe.whole else None


def _parts(ctx: StepContext, step: int, loss_scale: float, home: int) -> _Parts | None:
    """This rank's ``accumulate`` parts of the step through the program, their gradients
    summed; None if the data ended before the first."""
    pipe, feed, options, group, reads, dp = (
        ctx.pipe,
        ctx.feed,
        ctx.options,
        ctx.group,
        ctx.reads,
        ctx.dp,
    )
    sync, parts = not pipe.asynchronous, options.accumulate
    dynamic = pipe.manifest.dynamic
    done = _Parts()
    for part in range(parts):
        with traced(pipe.tracer, home, "compute", "data", "data"):
            batch = feed.next()
        if batch is None:
            if part == 0:
                return None
            break  # a last, shorter accumulation at the end of the data
        with traced(pipe.tracer, home, "communication", "batch agreement", "all-reduce"):
            sizes = agreed_sizes(None if batch is SIT_OUT else batch, feed, group, dynamic)
        replay = batch is SIT_OUT  # the data ended in this round before this copy's turn
        if replay and not dp.sharded:
            if _gather(ctx) is not None and pipe.modules[-1] is not None:
                dp.gather(None)  # the other copies' loss over the whole batch waits for this
            break
        if replay:  # FSDP pairs every copy's collectives: it runs the part, at weight 0
            batch, sizes = feed.replay(), feed.last_sizes
        else:
            done.used += 1
            if dp.size > 1:
                feed.last_sizes = sizes  # what a replay of this batch sizes its messages by
        taken = take_grads(pipe) if sync and part > 0 else None
        try:
            result = pipe.train_step(
                batch.inputs if reads[0] else None,
                batch.targets if reads[1] else None,
                ctx.loss_fn,
                on_step=partial(_last_backward, pipe, dp, taken) if part == parts - 1 else None,
                measure_memory=options.measure_memory,
                options=StepOptions(
                    keep_grads=sync,
                    loss_scale=0.0 if replay else loss_scale,
                    rng_base=step_base(ctx.seed, step, part * dp.size + dp.index),
                    on_backward=partial(dp.before_backward, pipe.modules) if dp.sharded else None,
                    rows=batch_rows(batch.inputs, pipe.manifest.batch_dim) if reads[1] else None,
                    sizes=sizes,
                    splits=_splits(ctx),
                    gather=_gather(ctx),
                ),
            )
        except PipecompileError as err:
            raise in_batch(err, pipe, feed, batch, f"step {step + 1}") from err
        if taken is not None:
            add_grads(pipe, taken)
        done.busy_ns += sum(result.stats.compute_ns.values())
        done.sent += result.sent_bytes
        if not replay:
            _count(pipe, done, result, batch, reads, loss_scale)
    return done


def _count(
    pipe: Pipeline,
    done: _Parts,
    result: StepResult,
    batch: Batch,
    reads: tuple[bool, bool],
    loss_scale: float,
) -> None:
    """A part's loss (the first non-finite one kept to name), samples and tokens."""
    losses = result.losses
    part_sum = float(sum(v.detach().double() for v in losses.values())) / loss_scale
    if done.bad is None and not math.isfinite(part_sum):
        done.bad = dict(losses)
    done.loss += part_sum
    counts = batch_counts(pipe.manifest, batch.inputs if reads[0] else None)
    done.samples, done.tokens = done.samples + counts[0], done.tokens + (counts[1] or 0)


def _decide(ctx: StepContext, step: int, summed: _Summed) -> tuple[str, bool, float | None]:
    """What every rank does alike with the step's summed figures: skip it (fp16 overflow, or
    a non-finite loss under ``skip_nonfinite``), stop the run (a non-finite loss), or unscale,
    clip and apply it (a synchronous program). Returns the line's note, whether the step was
    skipped and the gradients' norm (when clipping)."""
    pipe, options, scaler = ctx.pipe, ctx.options, ctx.scaler
    loss, bad, unscale = summed.loss, summed.bad, summed.unscale
    if summed.overflowed:  # before the loss: a scaled loss may overflow where the loss did not
        assert scaler is not None
        pipe.drop_step()
        scaler.update(True)
        return f"  skipped: fp16 gradients overflowed; loss scale now {scaler.scale:g}", True, None
    if not math.isfinite(loss):
        if not options.skip_nonfinite:
            if bad is not None:
                check_losses(bad, step + 1)  # names the micro-batch on the rank that has it
            raise RuntimeFailure(f"step {step + 1}: the loss is {loss}; training stops here")
        pipe.drop_step()
        return "  skipped: the loss is not finite", True, None
    if pipe.asynchronous:
        return "", False, None
    grad_norm = None
    if options.clip_grad_norm is not None:
        grad_norm = math.sqrt(summed.sq_norm) * unscale
        if grad_norm > options.clip_grad_norm:
            unscale *= options.clip_grad_norm / (grad_norm + 1e-6)
    if unscale != 1.0:
        scale_grads(pipe, unscale)
    if scaler is not None:
        scaler.update(False)
    pipe.apply_step()
    return "", False, grad_norm


def _last_backward(
    pipe: Pipeline, dp: DataParallel, taken: dict[int, list] | None, stage: int
) -> None:
    """At ``stage``'s STEP in the step's last part: its gradients are complete once the
    earlier parts' are added back, and their sum over the data-parallel copies starts."""
    if taken is not None:
        add_grads(pipe, taken, stage)
    dp.start(pipe.modules, stage)


def _lr(pipe: Pipeline) -> float | None:
    for optimizer in pipe.optimizers or []:
        if optimizer is not None:
            return float(optimizer.param_groups[0]["lr"])
    return None
