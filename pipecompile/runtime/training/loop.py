"""The training loop `pipecompile run` and every rank of `run --nproc` share.

One optimizer step reads ``accumulate`` mini-batches (each one run of the program; their
gradients are summed), then, for a synchronous program: decides on the loss (a non-finite one
stops the run or, with ``skip_nonfinite``, drops the step), on fp16 overflow (skip the step,
halve the scale), unscales, clips by the global norm, steps every optimizer and scheduler, and
reports. Decisions that must agree across ranks are made on sums over the ``Group`` (one
all-reduce of a few numbers per step under ``--nproc``), so every rank takes the same branch.

A rank reads data only if it holds the first stage (inputs) or the last (targets); the others
pass None and never call the model file's hooks.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch

from pipecompile.errors import InputError, MicrobatchError, PipecompileError, RuntimeFailure
from pipecompile.ir.dynamic import DynamicDims
from pipecompile.ir.microbatch import batch_rows
from pipecompile.ir.program import Program
from pipecompile.ir.topology import topology_from_manifest
from pipecompile.model.data_hooks import Batch, BatchSource
from pipecompile.runtime import notes
from pipecompile.runtime.executor import LossFn
from pipecompile.runtime.pipeline import OptimizerFactory, Pipeline
from pipecompile.runtime.precision import PRECISIONS, LossScaler
from pipecompile.runtime.random_state import draw_base, step_base
from pipecompile.runtime.threads import IdleCores
from pipecompile.runtime.trace import Tracer, traced
from pipecompile.runtime.trace_file import check_trace_file, trace_document, write_trace
from pipecompile.runtime.training.batch_agreement import agree_on_batch
from pipecompile.runtime.training.copy_share import SIT_OUT, CopyShare
from pipecompile.runtime.training.data_parallel import DataParallel
from pipecompile.runtime.training.divergence import check_losses, skipped_line
from pipecompile.runtime.training.eval_loss import batch_loss
from pipecompile.runtime.training.grad_ops import (
    add_grads,
    all_finite,
    scale_grads,
    squared_norm,
    take_grads,
)
from pipecompile.runtime.training.lr_schedule import make_schedulers, resume_at
from pipecompile.runtime.training.metrics import (
    Reporter,
    batch_counts,
    check_metrics_file,
    local_bubble,
    optimizer_state_bytes,
    peak_memory,
)
from pipecompile.runtime.training.records import EvalRecord, StepRecord
from pipecompile.runtime.training.train_state import (
    check_save_dir,
    resume,
    save,
    save_due,
    train_state,
)

__all__ = [
    "OPTIMIZERS",
    "Group",
    "LocalGroup",
    "TrainOptions",
    "TrainState",
    "check_places",
    "train",
]

NEEDS_SYNC = (
    "{flags} needs a synchronous schedule: {schedule} applies each micro-batch's update "
    "before the step's other losses are known; compile with --schedule gpipe, 1f1b, zb1p or "
    "interleaved, or drop the option"
)

OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


class Group(Protocol):
    """The ranks of a run, as the loop needs them: sums and maxima of a few numbers, and a
    gather (``rank`` 0 reports)."""

    rank: int

    def sum(self, values: list[float]) -> list[float]: ...

    def max(self, values: list[float]) -> list[float]: ...

    def gather(self, values: list[float]) -> list[list[float]]: ...

    def gather_objects(self, value: Any) -> list[Any] | None:
        """Every rank's ``value`` on rank 0 (None on the others)."""


class LocalGroup:
    """One process holding every device."""

    rank = 0

    def sum(self, values: list[float]) -> list[float]:
        return list(values)

    def max(self, values: list[float]) -> list[float]:
        return list(values)

    def gather(self, values: list[float]) -> list[list[float]]:
        return [list(values)]

    def gather_objects(self, value: Any) -> list[Any] | None:
        return [value]


@dataclass
class TrainOptions:
    """What `run` was asked for (docs/USAGE.md, "Training")."""

    steps: int | None = None  # optimizer steps; None: as many as --epochs give
    epochs: int | None = None
    accumulate: int = 1  # mini-batches per optimizer step
    optimizer: str = "adamw"
    lr: float = 1e-3
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    clip_grad_norm: float | None = None
    precision: str = "fp32"
    compile: str | None = None  # torch.compile backend of the stage forwards (runtime/compiled)
    loss_scale: float = 2.0**16  # fp16: the initial dynamic loss scale
    seed: int | None = None
    skip_nonfinite: bool = False
    save: Path | None = None
    save_every: int = 0
    resume: Path | None = None
    metrics: Path | None = None
    eval_every: int = 0  # 0: after each epoch and at the end (when there is an eval hook)
    quiet: bool = False
    measure_memory: bool = False
    trace: Path | None = None  # write the traced steps here (runtime/trace_file.py)
    trace_steps: int = 3  # trace steps 1..trace_steps
    optimizer_factory: OptimizerFactory | None = None  # API: over
    # a stage's parameters, instead of ``optimizer`` and ``lr``
    keep_optimizer: bool = False  # API: go on with the pipeline's optimizers and their state
    # (a second ``fit()`` with the same optimizer), at this run's ``lr`` for a named one


@dataclass
class TrainState:
    """How far a run got (for the interrupt line) and what it recorded."""

    done: int | None = None  # optimizer steps finished (None: not begun)
    total: int | None = None
    skipped: list[int] = field(default_factory=list)
    records: list[StepRecord] = field(default_factory=list)
    epoch: int = 1


def check_options(options: TrainOptions, program: Program) -> None:
    """Options the program cannot honour, refused before anything runs."""
    if options.clip_grad_norm is not None and not options.clip_grad_norm > 0:
        raise PipecompileError(
            f"--clip-grad-norm {options.clip_grad_norm:g}: the norm must be above 0"
        )
    if options.precision not in PRECISIONS:
        raise PipecompileError(
            f"unknown precision {options.precision!r}; choose one of {', '.join(PRECISIONS)}"
        )
    if options.accumulate < 1:
        raise PipecompileError(f"--accumulate {options.accumulate}: give at least 1")
    if options.trace is None and options.trace_steps != TrainOptions.trace_steps:
        raise PipecompileError(
            f"--trace-steps {options.trace_steps} is how many steps --trace FILE traces, and "
            "this run traces none; drop it, or add --trace FILE"
        )
    if options.optimizer_factory is None and not options.lr > 0:
        raise PipecompileError(f"--lr {options.lr:g} would train nothing; give a rate above 0")
    if options.optimizer_factory is None and options.optimizer not in OPTIMIZERS:
        raise PipecompileError(
            f"unknown optimizer {options.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}, "
            "or pass a factory over parameters"
        )
    if options.loss_scale != TrainOptions.loss_scale and options.precision != "fp16":
        raise PipecompileError(
            f"loss_scale {options.loss_scale:g} is the initial scale of --precision fp16; this "
            f"run is {options.precision}, which scales no loss: drop it, or use fp16"
        )
    if program.asynchronous:
        asked = [
            flag
            for flag, on in (
                ("--skip-nonfinite", options.skip_nonfinite),
                ("--accumulate", options.accumulate > 1),
                ("--clip-grad-norm", options.clip_grad_norm is not None),
                ("--precision fp16", options.precision == "fp16"),
            )
            if on
        ]
        if asked:
            raise PipecompileError(
                NEEDS_SYNC.format(flags=" and ".join(asked), schedule=program.schedule)
            )


def check_places(options: TrainOptions, *, force: bool, force_flag: str = "--force") -> str | None:
    """Where a run writes (``options.metrics``, ``options.save``), checked before it trains;
    returns the note of what ``force`` lets the save replace, if anything."""
    if options.metrics is not None:
        check_metrics_file(options.metrics)
    if options.trace is not None:
        check_trace_file(options.trace)
    if options.save is None:
        return None
    return check_save_dir(options.save, resume=options.resume, force=force, force_flag=force_flag)


def train(
    pipe: Pipeline,
    loss_fn: LossFn,
    data: BatchSource | None,
    options: TrainOptions,
    *,
    group: Group | None = None,
    eval_data: BatchSource | None = None,
    state: TrainState | None = None,
    reads: tuple[bool, bool] = (True, True),
    one_process: bool = True,
    device: torch.device | None = None,
    data_parallel: DataParallel | None = None,
) -> TrainState:
    """Train ``pipe`` on ``data`` (None on a rank that reads no data) per ``options``.

    ``reads``: whether this rank reads the inputs (holds the first stage) and the targets
    (holds the last). ``state`` is updated as steps finish (the caller reads it after an
    interrupt). Returns it, with one record per step. ``device``: where the batches go (a
    rank's GPU); ``one_process``: every device of the program runs in this process;
    ``data_parallel``: this rank's copy of the pipeline and its gradient sums (``--dp``).
    """
    group = group or LocalGroup()
    state = state or TrainState()
    dp = data_parallel or DataParallel()
    check_options(options, pipe.program)
    if data is not None and data.peek() is None:  # before anything is built or trained
        raise PipecompileError(empty_data(data, 1, 0))
    pipe.precision = PRECISIONS[options.precision]
    pipe.compile_stages(options.compile)
    kind = OPTIMIZERS[options.optimizer]
    if options.keep_optimizer and any(o is not None for o in pipe.optimizers or []):
        if options.optimizer_factory is None:  # this run's rate, its schedule's base too
            for rates in (g for o in pipe.optimizers if o for g in o.param_groups):
                rates["lr"] = rates["initial_lr"] = options.lr
    else:
        pipe.set_optimizer(options.optimizer_factory or (lambda ps: kind(ps, lr=options.lr)))
    length = _epoch_length(data, group)
    total = _total_steps(options, length)
    state.total = total
    if total is not None and options.warmup_steps > total:
        raise PipecompileError(
            f"--warmup-steps {options.warmup_steps} is longer than the run ({total} steps): the "
            f"rate would never reach --lr; warm up over at most {total} steps, or run longer"
        )
    schedulers = make_schedulers(
        pipe.optimizers or [], options.lr_schedule, options.warmup_steps, total
    )
    scaler = LossScaler(options.loss_scale) if options.precision == "fp16" else None
    first, saved = 0, {}
    if options.resume is not None:
        first = resume(pipe, options.resume, group.rank)
        saved = train_state(options.resume)
        if scaler is not None and "loss_scale" in saved:
            scaler.load_state_dict(saved["loss_scale"])
        resume_at(schedulers, first)
    if total is not None and first >= total:
        raise PipecompileError(
            f"--resume {options.resume}: the saved step is {first} and the run ends at "
            f"step {total}, so there is nothing to train; pass --steps greater than {first}"
        )
    seed = options.seed if options.seed is not None else saved.get("seed")
    if seed is None:
        seed = int(group.max([draw_base()])[0])
    skip = saved.get("batches", first * options.accumulate * dp.size)
    feed: Any = _Feed(data, length, group, epochs=options.epochs, skip=skip, device=device)
    if dp.size > 1:
        feed = CopyShare(feed, dp.index, dp.size)
    has_eval = group.max([1.0 if eval_data is not None else 0.0])[0] > 0
    if options.eval_every and not has_eval:
        raise PipecompileError(
            f"--eval-every {options.eval_every}: there is no eval_batches() to evaluate on; "
            "define eval_batches() in the model file, or drop --eval-every"
        )
    idle = IdleCores(None if options.quiet else notes.note) if one_process else None
    try:
        if idle is not None and pipe.compiled is not None:  # before the first compiled call
            idle.settle()
        if has_eval:  # its first batch, through the pipeline, before any training
            probe = _Feed(_first_only(eval_data), None, group, epochs=1, skip=0, device=device)
            _evaluate(pipe, loss_fn, probe, group, reads, "checked before training")
    except BaseException:
        if idle is not None:  # fit()'s caller gets its own thread count back
            idle.restore()
        raise
    state.done, state.epoch = first, feed.epoch
    reporter = Reporter(
        options.metrics if group.rank == 0 else None, total, quiet=options.quiet or group.rank != 0
    )
    reporter.record(
        {
            "kind": "start",
            "directory": pipe.name,
            "steps": total,
            "first": first,
            "precision": options.precision,
            "seed": seed,
            "microbatches": pipe.program.microbatches,
            "accumulate": options.accumulate,
            "data_parallel": dp.size,
        }
    )
    per_epoch = f", {length} batches an epoch" if length and length > 1 else ""
    if group.rank == 0 and not options.quiet:
        print(
            f"training on {data.label if data else 'data read by other ranks'}{per_epoch}",
            file=sys.stderr,
            flush=True,
        )
    saved_at = first
    tracer = pipe.tracer = _tracer(pipe, options, first)
    try:
        step = first
        while total is None or step < total:
            if idle is not None:
                idle.between_steps()
            with tracer.step_span(step + 1, _devices(pipe)) if tracer else nullcontext():
                done = _one_step(
                    pipe, loss_fn, feed, options, group, scaler, seed, step, reads, one_process, dp
                )
            if done is None:  # the data ran out (--epochs)
                break
            record, note = done
            for scheduler in schedulers:
                scheduler.step()
            step += 1
            state.done, state.epoch = step, record.epoch
            if record.skipped:
                state.skipped.append(step)
            record.first = first
            state.records.append(record)
            reporter.step(record, note)
            if has_eval and _eval_due(options, step, total, feed):
                evaluation = _Feed(eval_data, None, group, epochs=1, skip=0, device=device)
                loss = _evaluate(
                    pipe, loss_fn, evaluation, group, reads, f"the evaluation after step {step}"
                )
                reporter.eval(EvalRecord(step, feed.epoch, loss))
            if options.save and save_due(step, total or -1, options.save_every):
                train = {"epoch": feed.epoch, "batches": feed.read, "seed": seed}
                if scaler is not None:
                    train["loss_scale"] = scaler.state_dict()
                save(pipe, options.save, step, group.rank, train)
                saved_at = step
        if options.save and state.done is not None and state.done != saved_at:
            save(
                pipe,
                options.save,
                state.done,
                group.rank,
                {"epoch": feed.epoch, "batches": feed.read, "seed": seed},
            )
        if tracer is not None:
            _write_trace(pipe, tracer, group, options.trace, one_process)  # type: ignore[arg-type]
    finally:
        pipe.tracer = None
        reporter.close()
        if idle is not None:
            idle.restore()
    if state.skipped and group.rank == 0 and not options.quiet:
        print(skipped_line(state.skipped, (state.done or 0) - first), file=sys.stderr)
    return state


def _one_step(
    pipe: Pipeline,
    loss_fn: LossFn,
    feed: _Feed,
    options: TrainOptions,
    group: Group,
    scaler: LossScaler | None,
    seed: int,
    step: int,
    reads: tuple[bool, bool],
    one_process: bool,
    dp: DataParallel,
) -> tuple[StepRecord, str] | None:
    """One optimizer step and the note its line ends with; None if the data ended before it
    began. With data-parallel copies, this copy's parts are its share of D x ``accumulate``
    mini-batches (part a of copy k is mini-batch a*D + k of the step)."""
    sync = not pipe.asynchronous
    dynamic = pipe.manifest.dynamic
    m, parts = pipe.program.microbatches, options.accumulate
    loss_scale = (scaler.scale if scaler else 1.0) / (m * parts * dp.loss_copies) if sync else 1.0
    began = time.perf_counter()
    busy_ns = sent = 0
    total_loss = 0.0
    bad: dict[int, torch.Tensor] | None = None  # the first non-finite part's losses
    samples = tokens = used = 0
    home = pipe.device if pipe.device is not None else pipe.program.stage_device[0]
    for part in range(parts):
        with traced(pipe.tracer, home, "compute", "data", "data"):
            batch = feed.next()
        if batch is None:
            if part == 0:
                return None
            break  # a last, shorter accumulation at the end of the data
        with traced(pipe.tracer, home, "communication", "batch agreement", "all-reduce"):
            sizes = _agree(None if batch is SIT_OUT else batch, feed, group, dynamic)
        replay = batch is SIT_OUT  # the data ended in this round before this copy's turn
        if replay and not dp.sharded:
            break
        if replay:  # FSDP pairs every copy's collectives: it runs the part, at weight 0
            batch, sizes = feed.replay(), feed.last_sizes
        else:
            used += 1
            if dp.size > 1:
                feed.last_sizes = sizes  # what a replay of this batch sizes its messages by
        taken = take_grads(pipe) if sync and part > 0 else None
        inputs = batch.inputs if reads[0] else None
        targets = batch.targets if reads[1] else None
        try:
            pipe.train_step(
                inputs,
                targets,
                loss_fn,
                keep_grads=sync,
                loss_scale=0.0 if replay else loss_scale,
                rng_base=step_base(seed, step, part * dp.size + dp.index),
                measure_memory=options.measure_memory,
                on_step=partial(_last_backward, pipe, dp, taken) if part == parts - 1 else None,
                on_backward=partial(dp.before_backward, pipe.modules) if dp.sharded else None,
                rows=batch_rows(batch.inputs, pipe.manifest.batch_dim) if reads[1] else None,
                sizes=sizes,
            )
        except PipecompileError as err:
            raise _in_batch(err, pipe, feed, batch, f"step {step + 1}") from err
        if taken is not None:
            add_grads(pipe, taken)
        stats = pipe.last_stats
        busy_ns += sum(stats.compute_ns.values()) if stats else 0
        sent += pipe.last_sent_bytes
        if replay:
            continue
        losses = pipe.last_losses
        part_sum = float(sum(v.detach().double() for v in losses.values())) / loss_scale
        if bad is None and not math.isfinite(part_sum):
            bad = dict(losses)
        total_loss += part_sum
        counts = batch_counts(pipe.manifest, batch.inputs if reads[0] else None)
        samples, tokens = samples + counts[0], tokens + (counts[1] or 0)
    if sync:
        with traced(pipe.tracer, home, "communication", "data-parallel sum", "all-reduce"):
            dp.finish(pipe.modules)
    overflow = 1.0 if sync and scaler is not None and not all_finite(pipe) else 0.0
    counted = sync and options.clip_grad_norm is not None and dp.counts_norm
    sq = squared_norm(pipe) if counted else 0.0
    mine = [float(used), float(samples), float(tokens)] if dp.lead else [0.0, 0.0, 0.0]
    with traced(pipe.tracer, home, "communication", "loss sum", "all-reduce"):
        summed = group.sum([total_loss, overflow, sq, sent, *mine])
    summed_loss, overflows, sq_norm, sent_total = summed[:4]
    used, samples, tokens = (int(v) for v in summed[4:])
    loss = summed_loss / (m * used)
    note, skipped, grad_norm = "", False, None
    if overflows > 0:  # before the loss: a scaled loss may overflow where the loss did not
        assert scaler is not None
        pipe.drop_step()
        scaler.update(True)
        note = f"  skipped: fp16 gradients overflowed; loss scale now {scaler.scale:g}"
        skipped = True
    elif not math.isfinite(loss):
        if not options.skip_nonfinite:
            if bad is not None:
                check_losses(bad, step + 1)  # names the micro-batch on the rank that has it
            raise RuntimeFailure(f"step {step + 1}: the loss is {loss}; training stops here")
        pipe.drop_step()
        note, skipped = "  skipped: the loss is not finite", True
    elif sync:
        unscale = (1.0 / scaler.scale if scaler is not None else 1.0) * parts * dp.size / used
        if options.clip_grad_norm is not None:
            grad_norm = math.sqrt(sq_norm) * unscale
            if grad_norm > options.clip_grad_norm:
                unscale *= options.clip_grad_norm / (grad_norm + 1e-6)
        if unscale != 1.0:
            scale_grads(pipe, unscale)
        if scaler is not None:
            scaler.update(False)
        pipe.apply_step()
    seconds = time.perf_counter() - began
    with traced(pipe.tracer, home, "communication", "metrics gather", "all-reduce"):
        busy = group.gather(
            [
                busy_ns / 1e9 / seconds,
                optimizer_state_bytes(pipe),
                *peak_memory(pipe, one_process=one_process),
            ]
        )
    record = StepRecord(
        step=step + 1,
        epoch=feed.epoch,
        loss=loss,
        lr=_lr(pipe),
        step_ms=seconds * 1000,
        samples_per_s=samples / seconds,
        tokens_per_s=tokens / seconds if tokens else None,
        bubble=local_bubble(pipe) if one_process else 1 - sum(b[0] for b in busy) / len(busy),
        peak_memory=[int(v) for b in busy for v in b[2:]],
        sent_bytes=int(sent_total),
        grad_norm=grad_norm,
        loss_scale=scaler.scale if scaler is not None else None,
        skipped=skipped,
        optimizer_state_bytes=[int(b[1]) for b in busy],
    )
    return record, note


def _last_backward(
    pipe: Pipeline, dp: DataParallel, taken: dict[int, list] | None, stage: int
) -> None:
    """At ``stage``'s STEP in the step's last part: its gradients are complete once the
    earlier parts' are added back, and their sum over the data-parallel copies starts."""
    if taken is not None:
        add_grads(pipe, taken, stage)
    dp.start(pipe.modules, stage)


def _tracer(pipe: Pipeline, options: TrainOptions, first: int) -> Tracer | None:
    if options.trace is None:
        return None
    return Tracer(pipe.program.stage_device, options.trace_steps, first)


def _devices(pipe: Pipeline) -> list[int]:
    """The devices whose instructions run in this process."""
    return [pipe.device] if pipe.device is not None else list(range(len(pipe.program.devices)))


def _write_trace(
    pipe: Pipeline, tracer: Tracer, group: Group, path: Path, one_process: bool
) -> None:
    """Gather every rank's spans on rank 0, which writes the trace."""
    mine = {
        "rank": group.rank,
        "threads": torch.get_num_threads(),
        "spans": [{**s.as_dict(), "rank": group.rank} for s in tracer.spans],
    }
    every = group.gather_objects(mine)
    if every is None:
        return
    spans = [s for rank in every for s in rank["spans"]]
    threads = {rank["rank"]: rank["threads"] for rank in every}
    traced = sorted({s["step"] for s in spans if s["category"] == "step"})
    topology = topology_from_manifest(pipe.manifest)
    document = trace_document(
        spans, pipe.program, topology, one_process=one_process, traced_steps=traced, threads=threads
    )
    write_trace(path, document)


def _lr(pipe: Pipeline) -> float | None:
    for optimizer in pipe.optimizers or []:
        if optimizer is not None:
            return float(optimizer.param_groups[0]["lr"])
    return None


def _epoch_length(data: BatchSource | None, group: Group) -> int | None:
    """Batches per epoch, agreed by every rank (ranks without data learn it from the others);
    None if the hook's iterable has no length."""
    mine = data.length if data is not None and data.length is not None else -1
    agreed = int(group.max([float(mine)])[0])
    return agreed if agreed >= 0 else None


def _total_steps(options: TrainOptions, length: int | None) -> int | None:
    if options.epochs is None:
        return options.steps if options.steps is not None else 1
    if length is None:
        return options.steps  # None: until the data ends --epochs times
    by_epochs = math.ceil(options.epochs * length / options.accumulate)
    return min(by_epochs, options.steps) if options.steps is not None else by_epochs


def _eval_due(options: TrainOptions, step: int, total: int | None, feed: _Feed) -> bool:
    if options.eval_every:
        return step % options.eval_every == 0 or step == total
    return feed.at_epoch_end or step == total


def _evaluate(
    pipe: Pipeline,
    loss_fn: LossFn,
    data: _Feed,
    group: Group,
    reads: tuple[bool, bool],
    when: str,
) -> float:
    """Mean loss over ``data`` (one epoch of eval_batches()) with the stages in eval mode (no
    dropout), forward only. A failure names the batch and ``when`` it was evaluated."""
    modes = [(m, m.training) for m in pipe.modules if m is not None]
    for module, _ in modes:
        module.eval()
    total = count = 0.0
    try:
        while (batch := data.next()) is not None:
            sizes = _agree(batch, data, group, pipe.manifest.dynamic)
            try:
                output = pipe(batch.inputs if reads[0] else None, sizes=sizes)
                if reads[1]:
                    part, counted = batch_loss(pipe, loss_fn, output, batch)
                    total, count = total + part, count + counted
            except PipecompileError as err:
                raise _in_batch(err, pipe, data, batch, when) from err
    finally:
        for module, training in modes:
            module.train(training)
    total, count = group.sum([total, count])
    return total / count if count else math.nan


def _agree(
    batch: Batch | None, feed: Any, group: Group, dynamic: DynamicDims
) -> dict[str, int] | None:
    """Under --nproc, the ranks that read ``feed``'s last batch must have read the same one
    (None: this copy has none this time). Returns the batch's sizes of the dimensions
    compiled ``--dynamic`` as its readers saw them (None: none, or one process)."""
    if isinstance(group, LocalGroup):
        return None
    mine = dynamic.sizes_of(batch.inputs) if batch is not None else {}
    sizes = [mine.get(s, 0) for s in dynamic.symbols]
    found = agree_on_batch(batch, feed.source, feed.in_epoch - 1, feed.epoch, group, sizes)
    return dict(zip(dynamic.symbols, found)) if found and dynamic.symbols else None


def _first_only(source: BatchSource | None) -> BatchSource | None:
    """``source``'s first batch as a source of its own (None on a rank without data)."""
    if source is None:
        return None
    first = source.peek()
    if first is None:
        raise PipecompileError(empty_data(source, 1, 0))
    return BatchSource(lambda: iter([first]), 1, source.label, source.again)


def _in_batch(
    err: PipecompileError, pipe: Pipeline, feed: _Feed, batch: Batch, when: str
) -> PipecompileError:
    """``err``, raised by the pipeline on ``feed``'s last batch, with that batch named first
    (an id outside an embedding's range said as such); ``when``: the step, or the check."""
    source = feed.source
    if source is None:  # a rank without data: the ranks that read it name the batch
        return err
    hint = out_of_range(err, batch, pipe)
    if source.single and not hint and not isinstance(err, InputError | MicrobatchError):
        return type(err)(f"{when}: {err}")  # not the batch's fault: the example is no culprit
    where = source.batch_name(feed.in_epoch - 1)
    if feed.epoch > 1:
        where += f" of epoch {feed.epoch}"
    return type(err)(f"{where} ({when}): {hint or err}")


def out_of_range(err: BaseException, batch: Batch, pipe: Pipeline) -> str | None:
    """What torch's bare ``IndexError: index out of range in self`` (an embedding given an id
    beyond its rows) means for ``batch``: its integer inputs' ids against this process's
    embeddings; None for any other error."""
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, IndexError):
        cause = cause.__cause__
    if cause is None or "out of range" not in str(cause):
        return None
    ids = {
        n: t
        for n, t in batch.inputs.items()
        if t.numel() and not t.is_floating_point() and t.dtype != torch.bool
    }
    rows = _embeddings(pipe)
    if not ids or not rows:
        return None
    low, high = min(int(t.min()) for t in ids.values()), max(int(t.max()) for t in ids.values())
    held = ", ".join(
        f"input {n!r} holds ids {int(t.min())}..{int(t.max())}" for n, t in ids.items()
    )
    over = [f"{name!r} ({n} rows: ids 0..{n - 1})" for name, n in rows if n <= high]
    if low < 0:
        problem = "a negative id is outside every embedding's range"
    else:
        problem = f"beyond embedding {' or '.join(over or [f'{n!r} ({k} rows)' for n, k in rows])}"
    return (
        f"{held}: {problem}; fix the data, or the vocabulary size (and recompile) "
        f"[{type(cause).__name__}: {cause}]"
    )


def _embeddings(pipe: Pipeline) -> list[tuple[str, int]]:
    """(original name, rows) of every nn.Embedding of the stages in this process."""
    found = []
    for module, names in zip(pipe.modules, pipe.layout.params):
        if module is None:
            continue
        for path, sub in module.named_modules():
            if isinstance(sub, torch.nn.Embedding):
                original = names.get(f"{path}.weight", [f"{path}.weight"])[0]
                found.append((original.removesuffix(".weight"), sub.num_embeddings))
    return found


class _Feed:
    """Mini-batches in order across epochs; ``read`` counts them. A rank without data only
    keeps count (the epoch length comes from the ranks that read); where no rank knows the
    length, the ranks agree after each batch on whether the data went on.

    The data is held to what it promised: an epoch that yields no batch (a used-up iterable
    returned again), or a number of batches other than its ``len()`` (either way), stops the
    run with an error instead of training on less than asked."""

    def __init__(
        self,
        source: BatchSource | None,
        length: int | None,
        group: Group,
        *,
        epochs: int | None,
        skip: int,
        device: torch.device | None = None,
    ) -> None:
        self.source, self.length, self.group, self.epochs = source, length, group, epochs
        self.device = device
        self.epoch, self.read, self.in_epoch = 1, 0, 0
        self.gave = 0  # batches the first epoch gave (for the message of an empty one)
        self._it: Iterator[Batch] | None = None
        self.at_epoch_end = False
        for _ in range(skip):  # resuming: the batches the saved steps used
            if self.next() is None:
                break

    def next(self) -> Batch | None:
        """The next mini-batch (an empty one on a rank without data), None when the data
        has ended ``epochs`` times."""
        if self.length is not None and self.in_epoch == self.length:
            if self.epochs is not None and self.epoch >= self.epochs:
                return None
            self._new_epoch()
        batch = self._next_local()
        if self.length is None:
            more = self.group.max([1.0 if batch is not None else 0.0])[0] > 0
            if not more:
                return None
        self.read += 1
        self.in_epoch += 1
        self.at_epoch_end = self.length is not None and self.in_epoch == self.length
        if self.at_epoch_end and self.source is not None:
            self._check_no_more()
        if batch is None or batch is _NO_DATA:
            return _NO_DATA
        if self.device is not None and self.device.type != "cpu":
            inputs = {k: v.to(self.device) for k, v in batch.inputs.items()}
            return Batch(inputs, tuple(t.to(self.device) for t in batch.targets))
        return batch

    def _new_epoch(self) -> None:
        if self.epoch == 1:
            self.gave = self.in_epoch
        self.epoch, self.in_epoch, self._it = self.epoch + 1, 0, None

    def _next_local(self) -> Batch | None:
        if self.source is None:
            return None if self.length is None else _NO_DATA
        if self._it is None:
            self._it = self.source.epoch()
        batch = next(self._it, None)
        if (
            batch is None
            and self.length is None
            and self.in_epoch > 0
            and (self.epochs is None or self.epoch < self.epochs)
        ):
            self._new_epoch()
            self._it = self.source.epoch()
            batch = next(self._it, None)
        if batch is None and self.in_epoch == 0:
            raise PipecompileError(empty_data(self.source, self.epoch, self.gave))
        if batch is None and self.length is not None:
            raise PipecompileError(_length_mismatch(self.source, self.epoch, self.in_epoch))
        return batch

    def _check_no_more(self) -> None:
        """At the end of an epoch of known length: the data must end there too."""
        assert self._it is not None and self.source is not None
        extra = 0
        while extra < _COUNT_AT_MOST and next(self._it, None) is not None:
            extra += 1
        if extra:
            yielded = self.in_epoch + extra
            more = "at least " if extra == _COUNT_AT_MOST else ""
            raise PipecompileError(_length_mismatch(self.source, self.epoch, yielded, more))


_NO_DATA = Batch({}, ())
_COUNT_AT_MOST = 10_000  # batches past its len() counted for the message


def empty_data(source: BatchSource, epoch: int, first_gave: int) -> str:
    """The message for an epoch of ``source`` that yielded no batch."""
    if epoch == 1:
        return (
            f"{source.label} yielded no batches; it must give at least one (inputs, targets) "
            "mini-batch"
        )
    return (
        f"{source.label} yielded no batches in epoch {epoch} (epoch 1 gave {first_gave}): the "
        f"iterable was used up by the first pass; {source.again}"
    )


def _length_mismatch(source: BatchSource, epoch: int, yielded: int, more: str = "") -> str:
    return (
        f"{source.label} yielded {more}{yielded} batches in epoch {epoch} but its len() is "
        f"{source.length}; make __len__ return the number of batches __iter__ yields (or drop "
        "__len__)"
    )
