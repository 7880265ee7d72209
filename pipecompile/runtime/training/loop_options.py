"""What the training loop was asked for (``TrainOptions``) and the options a program cannot
honour or the places a run cannot write, refused before anything runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from pipecompile.errors import PipecompileError
from pipecompile.ir.program import Program
from pipecompile.runtime.pipeline import OptimizerFactory
from pipecompile.runtime.precision import PRECISIONS
from pipecompile.runtime.timeline_file import check_trace_file
from pipecompile.runtime.training.metrics import check_metrics_file
from pipecompile.runtime.training.train_state import check_save_dir

__all__ = ["NEEDS_SYNC", "OPTIMIZERS", "TrainOptions", "check_options", "check_places"]


NEEDS_SYNC = (
    "{flags} needs a synchronous schedule: {schedule} applies each micro-batch's update "
    "before the step's other losses are known; compile with --schedule gpipe, 1f1b, zb1p or "
    "interleaved, or drop the option"
)


OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


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
    compile: str | None = None  # torch.compile backend of the stage forwards (torch_compiled)
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
    trace: Path | None = None  # write the traced steps here (runtime/timeline_file.py)
    trace_steps: int = 3  # trace steps 1..trace_steps
    optimizer_factory: OptimizerFactory | None = None  # API: over
    # a stage's parameters, instead of ``optimizer`` and ``lr``
    keep_optimizer: bool = False  # API: go on with the pipeline's optimizers and their state


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
