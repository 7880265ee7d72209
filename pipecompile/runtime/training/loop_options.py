"""The training options a program cannot honour, and the places a run cannot write, refused
before anything runs."""

from __future__ import annotations

import dataclasses

import torch

from pipecompile.errors import PipecompileError
from pipecompile.ir.programs.program import Program
from pipecompile.options.run import OPTIMIZER_NAMES, TrainFlags
from pipecompile.runtime.state.precision import PRECISIONS
from pipecompile.runtime.timeline_file import check_trace_file
from pipecompile.runtime.training.metrics import check_metrics_file
from pipecompile.runtime.training.train_state import check_save_dir
from pipecompile.schedules import ORDER, SYNCHRONOUS, listed

__all__ = ["NEEDS_SYNC", "OPTIMIZERS", "check_train_options", "check_places"]


NEEDS_SYNC = (
    "{flags} needs a synchronous schedule: {schedule} applies each micro-batch's update "
    "before the step's other losses are known; compile with --schedule "
    + listed(n for n in ORDER if n in SYNCHRONOUS)
    + ", or drop the option"
)


OPTIMIZERS = dict(zip(OPTIMIZER_NAMES, (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)))


def check_train_options(options: TrainFlags, program: Program) -> None:
    """Options the program cannot honour, refused before anything runs."""
    if options.clip_grad_norm is not None and not options.clip_grad_norm > 0:
        raise PipecompileError(
            f"--clip-grad-norm {options.clip_grad_norm:g}: the norm must be above 0"
        )
    if options.precision not in PRECISIONS:
        raise PipecompileError(
            f"unknown precision {options.precision!r}; choose one of {', '.join(PRECISIONS)}"
        )
    if options.async_save and options.save is None:
        raise PipecompileError(
            "--async-save writes the saves of --save DIR in the background, and this run saves "
            "nothing; add --save DIR (and --save-every N), or drop --async-save"
        )
    if options.accumulate < 1:
        raise PipecompileError(f"--accumulate {options.accumulate}: give at least 1")
    if options.trace is None and options.trace_steps != _default(options, "trace_steps"):
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
    if options.loss_scale != _default(options, "loss_scale") and options.precision != "fp16":
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


def check_places(options: TrainFlags, *, force: bool, force_flag: str = "--force") -> str | None:
    """Where a run writes (``options.metrics``, ``options.save``), checked before it trains;
    returns the note of what ``force`` lets the save replace, if anything."""
    if options.metrics is not None:
        check_metrics_file(options.metrics)
    if options.trace is not None:
        check_trace_file(options.trace)
    if options.save is None:
        return None
    return check_save_dir(options.save, resume=options.resume, force=force, force_flag=force_flag)


def _default(options: TrainFlags, name: str) -> object:
    return next(f.default for f in dataclasses.fields(options) if f.name == name)
