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

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pipecompile.errors import PipecompileError
from pipecompile.model.data_hooks import BatchSource
from pipecompile.options.run import TrainFlags
from pipecompile.runtime.executor import LossFn
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.process import notes
from pipecompile.runtime.process.threads import IdleCores
from pipecompile.runtime.state.precision import PRECISIONS, LossScaler
from pipecompile.runtime.state.random_state import draw_base
from pipecompile.runtime.training.background_save import BackgroundSaves
from pipecompile.runtime.training.copy_share import CopyShare
from pipecompile.runtime.training.data_parallel import DataParallel
from pipecompile.runtime.training.divergence import skipped_line
from pipecompile.runtime.training.evaluation import eval_due, evaluate
from pipecompile.runtime.training.feed import (
    Feed,
    empty_data,
    epoch_length,
    first_only,
    total_steps,
)
from pipecompile.runtime.training.group import Group, LocalGroup
from pipecompile.runtime.training.loop_options import OPTIMIZERS, check_train_options
from pipecompile.runtime.training.lr_schedule import make_schedulers, resume_at
from pipecompile.runtime.training.metrics import Reporter
from pipecompile.runtime.training.one_step import StepContext, one_step
from pipecompile.runtime.training.records import EvalRecord, StepRecord
from pipecompile.runtime.training.step_timeline import devices_here, step_tracer, write_step_trace
from pipecompile.runtime.training.train_state import (
    LoopState,
    resume,
    save,
    save_due,
    train_state,
)

__all__ = ["RankShare", "TrainState", "train"]


@dataclass
class TrainState:
    """How far a run got (for the interrupt line) and what it recorded."""

    done: int | None = None  # optimizer steps finished (None: not begun)
    total: int | None = None
    skipped: list[int] = field(default_factory=list)
    records: list[StepRecord] = field(default_factory=list)
    epoch: int = 1


@dataclass(frozen=True)
class RankShare:
    """This rank's part of a run of several processes (the default: one process, every
    device in it): its ranks' ``group``, whether it reads the inputs (holds the first stage)
    and the targets (holds the last), whether every device of the program runs in this
    process, where its batches go (a rank's GPU) and its data-parallel copy of the pipeline
    with its gradient sums (``--dp``)."""

    group: Group | None = None
    reads: tuple[bool, bool] = (True, True)
    one_process: bool = True
    device: torch.device | None = None
    data_parallel: DataParallel | None = None


def train(
    pipe: Pipeline,
    loss_fn: LossFn,
    data: BatchSource | None,
    options: TrainFlags,
    *,
    eval_data: BatchSource | None = None,
    state: TrainState | None = None,
    rank: RankShare | None = None,
) -> TrainState:
    """Train ``pipe`` on ``data`` (None on a rank that reads no data) per ``options``, as
    ``rank``'s part of the run (default: the whole run in this process).

    ``state`` is updated as steps finish (the caller reads it after an interrupt). Returns
    it, with one record per step.
    """
    rank = rank or RankShare()
    group = rank.group or LocalGroup()
    reads, one_process, device = rank.reads, rank.one_process, rank.device
    state = state or TrainState()
    dp = rank.data_parallel or DataParallel()
    check_train_options(options, pipe.program)
    if data is not None and data.peek() is None:  # before anything is built or trained
        raise PipecompileError(empty_data(data, 1, 0))
    _prepare(pipe, options)
    length = epoch_length(data, group)
    state.total = total = total_steps(options, length)
    schedulers, scaler, first, saved = _resumed(pipe, options, total, group)
    seed = options.seed if options.seed is not None else saved.get("seed")
    if seed is None:
        seed = int(group.max([draw_base()])[0])
    skip = saved.get("batches", first * options.accumulate * dp.size)
    feed: Any = Feed(data, length, group, epochs=options.epochs, skip=skip, device=device)
    if dp.size > 1:
        feed = CopyShare(feed, dp.index, dp.size)
    has_eval = group.max([1.0 if eval_data is not None else 0.0])[0] > 0
    if options.eval_every and not has_eval:
        raise PipecompileError(
            f"--eval-every {options.eval_every}: there is no eval_batches() to evaluate on; "
            "define eval_batches() in the model file, or drop --eval-every"
        )
    idle = IdleCores(None if options.quiet else notes.note) if one_process else None
    run = _Run(
        pipe,
        loss_fn,
        options,
        group,
        feed,
        has_eval,
        eval_data,
        reads,
        one_process,
        device,
        dp,
        scaler,
        seed,
        schedulers,
        idle,
        BackgroundSaves() if options.async_save else None,
    )
    with _restoring(idle):
        if idle is not None and pipe.compiled is not None:  # before the first compiled call
            idle.settle()
        if has_eval:  # its first batch, through the pipeline, before any training
            probe = Feed(first_only(eval_data), None, group, epochs=1, skip=0, device=device)
            evaluate(pipe, loss_fn, probe, group, reads, "checked before training")
        state.done, state.epoch = first, feed.epoch
        _steps(run, state, first, length, data)
    if state.skipped and group.rank == 0 and not options.quiet:
        print(skipped_line(state.skipped, (state.done or 0) - first), file=sys.stderr)
    return state


@dataclass(frozen=True)
class _Run:
    """What every step of one run reads."""

    pipe: Pipeline
    loss_fn: LossFn
    options: TrainFlags
    group: Group
    feed: Any  # a Feed, or this copy's share of one (CopyShare)
    evaluates: bool  # some rank has eval_batches(): every rank takes part in evaluating
    eval_data: BatchSource | None  # None on a rank that reads none
    reads: tuple[bool, bool]
    one_process: bool
    device: torch.device | None
    dp: DataParallel
    scaler: LossScaler | None
    seed: int
    schedulers: list
    idle: IdleCores | None
    saves: BackgroundSaves | None  # --async-save

    @property
    def context(self) -> StepContext:
        """What each step reads of the run (``one_step``)."""
        return StepContext(
            self.pipe,
            self.loss_fn,
            self.feed,
            self.options,
            self.group,
            self.scaler,
            self.seed,
            self.reads,
            self.one_process,
            self.dp,
        )


@contextmanager
def _restoring(idle: IdleCores | None) -> Iterator[None]:
    """The caller of ``fit()`` gets its own thread count back, however the run ends."""
    try:
        yield
    finally:
        if idle is not None:
            idle.restore()


def _prepare(pipe: Pipeline, options: TrainFlags) -> None:
    """The pipeline's precision, compiled stages and optimizers for this run."""
    pipe.precision = PRECISIONS[options.precision]
    pipe.compile_stages(options.compile)
    kind = OPTIMIZERS[options.optimizer]
    if options.keep_optimizer and any(o is not None for o in pipe.optimizers or []):
        if options.optimizer_factory is None:  # this run's rate, its schedule's base too
            for rates in (g for o in pipe.optimizers if o for g in o.param_groups):
                rates["lr"] = rates["initial_lr"] = options.lr
    else:
        pipe.set_optimizer(options.optimizer_factory or (lambda ps: kind(ps, lr=options.lr)))


def _resumed(
    pipe: Pipeline, options: TrainFlags, total: int | None, group: Group
) -> tuple[list, LossScaler | None, int, LoopState]:
    """The run's rate schedulers and fp16 loss scaler, at the step it starts from (``--resume``:
    the saved one), that step, and the saved train state ({} when not resuming)."""
    if total is not None and options.warmup_steps > total:
        raise PipecompileError(
            f"--warmup-steps {options.warmup_steps} is longer than the run ({total} steps): the "
            f"rate would never reach --lr; warm up over at most {total} steps, or run longer"
        )
    schedulers = make_schedulers(
        pipe.optimizers or [], options.lr_schedule, options.warmup_steps, total
    )
    scaler = LossScaler(options.loss_scale) if options.precision == "fp16" else None
    first, saved = 0, LoopState()
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
    return schedulers, scaler, first, saved


def _reporter(run: _Run, total: int | None, first: int) -> Reporter:
    """The run's reporter, its start record written."""
    options, group = run.options, run.group
    reporter = Reporter(
        options.metrics if group.rank == 0 else None, total, quiet=options.quiet or group.rank != 0
    )
    reporter.record(
        {
            "kind": "start",
            "directory": run.pipe.name,
            "steps": total,
            "first": first,
            "precision": options.precision,
            "seed": run.seed,
            "microbatches": run.pipe.program.microbatches,
            "accumulate": options.accumulate,
            "data_parallel": run.dp.size,
        }
    )
    return reporter


def _steps(
    run: _Run, state: TrainState, first: int, length: int | None, data: BatchSource | None
) -> None:
    """The optimizer steps from ``first`` until the run's total or the data's end, each
    reported, evaluated and saved when due; the trace written after them."""
    pipe, options, group = run.pipe, run.options, run.group
    total = state.total
    reporter = _reporter(run, total, first)
    per_epoch = f", {length} batches an epoch" if length and length > 1 else ""
    if group.rank == 0 and not options.quiet:
        print(
            f"training on {data.label if data else 'data read by other ranks'}{per_epoch}",
            file=sys.stderr,
            flush=True,
        )
    saved_at = step = first
    tracer = pipe.tracer = step_tracer(pipe, options, first)
    context = run.context  # what every step reads, built once
    try:
        while total is None or step < total:
            if run.idle is not None:
                run.idle.between_steps()
            with tracer.step_span(step + 1, devices_here(pipe)) if tracer else nullcontext():
                done = one_step(context, step)
            if done is None:  # the data ran out (--epochs)
                break
            step += 1
            _finished(run, state, reporter, step, first, *done)
            if options.save and save_due(step, total or -1, options.save_every):
                _save(run, reporter, step)
                saved_at = step
        if options.save and state.done is not None and state.done != saved_at:
            _save(run, reporter, state.done, with_scale=False)
        if run.saves is not None:
            run.saves.wait()  # the last save complete, and `latest` on it
        if tracer is not None:
            write_step_trace(pipe, tracer, group, options.trace, run.one_process)  # type: ignore[arg-type]
    except BaseException:
        if run.saves is not None:
            run.saves.abandon()  # never published: `latest` stays on a complete step
        raise
    finally:
        pipe.tracer = None
        reporter.close()


def _finished(
    run: _Run,
    state: TrainState,
    reporter: Reporter,
    step: int,
    first: int,
    record: StepRecord,
    note: str,
) -> None:
    """Step ``step`` done: the schedulers step, the state and the report record it, and an
    evaluation runs if one is due."""
    for scheduler in run.schedulers:
        scheduler.step()
    state.done, state.epoch = step, record.epoch
    if record.skipped:
        state.skipped.append(step)
    record.first = first
    state.records.append(record)
    reporter.step(record, note)
    if run.evaluates and eval_due(run.options, step, state.total, run.feed):
        evaluation = Feed(run.eval_data, None, run.group, epochs=1, skip=0, device=run.device)
        loss = evaluate(
            run.pipe,
            run.loss_fn,
            evaluation,
            run.group,
            run.reads,
            f"the evaluation after step {step}",
        )
        reporter.eval(EvalRecord(step, run.feed.epoch, loss))


def _save(run: _Run, reporter: Reporter, step: int, *, with_scale: bool = True) -> None:
    """The run's train state at ``step``, for ``--resume`` (in the background with
    ``--async-save``); the time the step waited for it is recorded."""
    train = LoopState(epoch=run.feed.epoch, batches=run.feed.read, seed=run.seed)
    if with_scale and run.scaler is not None:
        train["loss_scale"] = run.scaler.state_dict()
    root = run.options.save
    assert root is not None
    began = time.perf_counter()
    if run.saves is not None:
        run.saves.submit(run.pipe, Path(root), step, run.group.rank, train)
    else:
        save(run.pipe, Path(root), step, run.group.rank, train)
    stall = time.perf_counter() - began
    record = {"step": step, "stall_ms": round(stall * 1e3, 3), "background": run.saves is not None}
    reporter.record({"kind": "save", **record})
