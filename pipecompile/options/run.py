"""The options of `pipecompile run`, declared once (``RunFlags``, ``TrainFlags``) for the
command, for each rank of `run --nproc` (which gets the forwarded ones) and for ``fit()``; the
training loop takes the ``TrainFlags`` itself (``for_loop``: its paths as ``Path``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from pipecompile.files.names import METRICS
from pipecompile.options.fields import (
    HONOURED,
    declared,
    finite_float,
    nonnegative_float,
    nonnegative_int,
    option,
    positive_float,
    positive_int,
)

__all__ = [
    "RunFlags",
    "TrainFlags",
    "given",
    "for_loop",
    "OPTIMIZER_NAMES",
    "PRECISION_NAMES",
    "BACKENDS",
    "LR_SCHEDULES",
    "OptimizerFactory",
]

# what builds a stage's optimizer over its parameters (``fit(optimizer=...)``, ``train_step``)
OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]

# The names the options accept; the runtime maps each to what it runs (a test checks they agree)
OPTIMIZER_NAMES = ("adam", "adamw", "sgd")  # torch.optim's Adam, AdamW, SGD
PRECISION_NAMES = ("fp32", "bf16", "fp16")  # autocast dtypes: none, bfloat16, float16
BACKENDS = ("inductor", "aot_eager", "eager")  # torch.compile backends; "off": eager stages
LR_SCHEDULES = ("constant", "cosine", "linear")


@dataclass
class RunFlags:
    """`run`'s own options (the command line only: ``fit()`` runs in this process); None:
    not given, until ``settled`` gives the ``then`` value once the refusals have run."""

    check: bool = option(
        "--check", switch=True, api=None, help="compare one step with the eager model"
    )
    program: str | None = option(
        "--program", path=True, api=None, help="run this program file instead (verified first)"
    )
    model: str | None = option(
        "--model", path=True, api=None, help="model file to take data, targets and loss_fn from"
    )
    atol: float | None = option(
        "--atol",
        check=nonnegative_float,
        api=None,
        help="--check absolute tolerance: with --rtol, atol + rtol * |eager| instead of the "
        "noise floor rule (default: within 16 noise floors, see docs/USAGE.md)",
        needs="check",
        needs_why="is a tolerance of --check",
    )
    batch_shapes: str | None = option(
        "--batch-shapes",
        metavar="BxT,...",
        api=None,
        help="--check also at these sizes of the compile's --dynamic dimensions, batch first "
        "(e.g. 16x128,5x17 for batch,seq)",
        needs="check",
        needs_why="lists the shapes --check checks",
    )
    rtol: float | None = option(
        "--rtol",
        check=nonnegative_float,
        api=None,
        help="--check relative tolerance (see --atol; 1e-5 when only --atol is given)",
        needs="check",
        needs_why="is a tolerance of --check",
    )
    nproc: int | None = option(
        "--nproc",
        check=positive_int,
        forwarded=False,
        api=None,
        help="run with one process per device through torch.distributed",
    )
    dp: int | None = option(
        "--dp",
        check=positive_int,
        then=1,
        api=None,
        metavar="D",
        help="--nproc: run D data-parallel copies of the pipeline on a (dp, pp) device mesh "
        "(--nproc = D x the program's ranks); copy k trains on batches k, k+D, ...",
        needs="nproc",
        needs_why="applies to the ranks of --nproc N, which a run without --nproc does not start",
    )
    shard: str | None = option(
        "--shard",
        choices=("optimizer", "grads", "params"),
        api=None,
        help="with --dp: shard across the copies; optimizer = each stage's optimizer state "
        "(ZeRO-1, torch's ZeroRedundancyOptimizer); grads = also the gradients, weights "
        "gathered once per part (ZeRO-2, FSDP2); params = also the weights at rest, gathered "
        "per forward and backward (ZeRO-3, FSDP2)",
        needs="nproc",
        needs_why="applies to the ranks of --nproc N, which a run without --nproc does not start",
    )
    device: str | None = option(
        "--device",
        choices=("auto", "cpu", "cuda"),
        then="auto",
        api=None,
        help="--nproc: cuda = a GPU per rank, NCCL (auto: cuda if every rank gets a GPU)",
        needs="nproc",
        needs_why="applies to the ranks of --nproc N, which a run without --nproc does not start",
    )
    timeout: float | None = option(
        "--timeout",
        check=positive_float,
        then=60.0,
        api=None,
        help="--nproc: seconds a rank may wait on one instruction (default 60)",
        needs="nproc",
        needs_why="applies to the ranks of --nproc N, which a run without --nproc does not start",
    )
    max_restarts: int | None = option(
        "--max-restarts",
        check=nonnegative_int,
        then=0,
        forwarded=False,
        api=None,
        metavar="K",
        help="--nproc with --save: when a rank fails, stop every rank and start them all again "
        "from the newest step saved, up to K times (default 0)",
        under_check="it trains nothing a failure could interrupt",
        needs="nproc",
        needs_why="restarts the ranks of --nproc N, which a run without --nproc does not start",
    )
    allow_stale: bool = option(
        "--allow-stale",
        switch=True,
        api=None,
        help="run even though the model file changed since compiling",
    )
    threads: int | None = option(
        "--threads",
        check=positive_int,
        api=None,
        metavar="N",
        help="intra-op threads of each process (default: with --nproc, OMP_NUM_THREADS where "
        "set, else the cores over the ranks on this machine; else torch's default)",
    )
    stats: bool = option(
        "--stats",
        switch=True,
        forwarded=False,
        api=None,
        help="print measured peak in-flight and activation bytes",
        under_check="it measures a training run",
        under_nproc="measures the local backend",
    )


@dataclass
class TrainFlags:
    """The training options (docs/USAGE.md, "Training"): `run`'s flags, forwarded to every
    rank, and ``fit()``'s keywords; the last four fields are ``fit()``'s alone (no flag)."""

    steps: int | None = option(
        "--steps",
        under_check="it runs one step",
        check=positive_int,
        help="optimizer steps to run (default 1, or as many as --epochs give)",
    )
    epochs: int | None = option(
        "--epochs",
        under_check="it runs one step on the example batch",
        check=positive_int,
        help="passes over train_batches() (the data restarts when it ends)",
    )
    accumulate: int = option(
        "--accumulate",
        under_check="it compares one mini-batch",
        check=positive_int,
        default=1,
        metavar="N",
        help="mini-batches whose gradients are summed into one optimizer step",
    )
    optimizer: str = option(
        "--optimizer",
        under_check="it compares gradients, not an optimizer's update",
        default="adamw",
        choices=OPTIMIZER_NAMES,
        help="the optimizer of every stage",
    )
    lr: float = option(
        "--lr",
        check=positive_float,
        default=1e-3,
        under_check=HONOURED,
        help="the optimizer's learning rate",
    )
    lr_schedule: str = option(
        "--lr-schedule",
        under_check="it runs no schedule",
        default="constant",
        choices=LR_SCHEDULES,
        help="constant, or warm-up then cosine or linear decay to 0 at the last step",
    )
    warmup_steps: int = option(
        "--warmup-steps",
        under_check="it runs no schedule",
        check=nonnegative_int,
        default=0,
        metavar="N",
        help="steps over which the learning rate rises linearly to --lr",
    )
    clip_grad_norm: float | None = option(
        "--clip-grad-norm",
        under_check="it compares the unclipped gradients",
        check=finite_float,
        metavar="NORM",
        help="scale the gradients so their global norm (all stages and ranks) is at most NORM",
    )
    precision: str = option(
        "--precision",
        under_check="it compares fp32 results, which autocast would move beyond any tolerance",
        default="fp32",
        choices=PRECISION_NAMES,
        help="autocast dtype of the stages and their traffic; fp32 master "
        "weights (fp16: a GPU, with dynamic loss scaling)",
    )
    compile: str | None = option(
        "--compile",
        under_check=HONOURED,
        const="inductor",
        choices=(*BACKENDS, "off"),
        metavar="BACKEND",
        help="run each stage's forward through torch.compile with BACKEND (default inductor; "
        "also aot_eager, eager; off: eagerly; not given: as the compile's --compile said)",
    )
    seed: int | None = option(
        "--seed",
        under_check="it needs a model without random ops, whose masks the pipeline draws its "
        "own way",
        check=nonnegative_int,
        help="random ops (dropout) draw from this seed, the step, the "
        "micro-batch and their place in the model: the same for any "
        "stage count, schedule or rank count",
    )
    skip_nonfinite: bool = option(
        "--skip-nonfinite",
        under_check="a non-finite value fails the check",
        switch=True,
        help="drop the update of a step whose loss is NaN or infinite "
        "and go on (default: stop there)",
    )
    save: str | Path | None = option(
        "--save",
        under_check="it trains nothing to save",
        path=True,
        help="train state directory (outside DIRECTORY): weights, optimizer state and step, "
        "saved after the last step",
    )
    save_every: int = option(
        "--save-every",
        under_check="it trains nothing to save",
        check=nonnegative_int,
        default=0,
        help="with --save: also save every N steps",
    )
    async_save: bool = option(
        "--async-save",
        under_check="it trains nothing to save",
        switch=True,
        help="with --save: copy each save's state at its step and write it in the background "
        "while training goes on (latest moves once the write is complete)",
    )
    resume: str | Path | None = option(
        "--resume",
        under_check="it checks the compiled weights, not a saved train state's",
        path=True,
        help="continue from the newest step saved in this train state directory",
    )
    force: bool = option(
        "--force",
        under_check="it writes nothing",
        switch=True,
        help="--save into a directory holding another run's train state: "
        "replace those of the steps this run saves (what pipecompile did not "
        "write is never replaced)",
    )
    metrics: str | Path | None = option(
        "--metrics",
        under_check="it records no steps",
        metavar="FILE",
        path=True,
        help="append one JSON line per step here (default: DIRECTORY/metrics.jsonl)",
    )
    eval_every: int = option(
        "--eval-every",
        under_check="it evaluates nothing",
        check=nonnegative_int,
        default=0,
        metavar="N",
        help="with eval_batches(): evaluate every N steps (default: after "
        "each epoch and at the end)",
    )
    trace: str | Path | None = option(
        "--trace",
        under_check="it compares one step, it does not time one",
        metavar="FILE",
        path=True,
        help="write a Chrome/Perfetto trace (JSON) of what every device did in the first "
        "--trace-steps steps, with the simulated step beside it",
    )
    trace_steps: int = option(
        "--trace-steps",
        under_check="it traces nothing",
        check=positive_int,
        default=3,
        metavar="N",
        help="with --trace: the steps traced (default 3)",
    )
    quiet: bool = option(
        "-q",
        "--quiet",
        switch=True,
        api="progress",
        under_check=HONOURED,
        help="print nothing but errors",
    )
    loss_scale: float = dataclasses.field(default=2.0**16, metadata={})  # fp16's initial scale
    measure_memory: bool = dataclasses.field(default=False, metadata={})
    # over a stage's parameters, instead of ``optimizer`` and ``lr``
    optimizer_factory: OptimizerFactory | None = dataclasses.field(default=None, metadata={})
    # go on with the pipeline's optimizers and their state
    keep_optimizer: bool = dataclasses.field(default=False, metadata={})


def given(flags: TrainFlags) -> list[tuple[str, str]]:
    """(flag, field) of each training option ``flags`` sets to other than its default (a
    value equal to the default asks for nothing the run would not do anyway)."""
    return [
        (o.flag, f.name)
        for f, o in declared(TrainFlags)
        if f.name != "quiet" and getattr(flags, f.name) != f.default
    ]


def for_loop(flags: TrainFlags, directory: Path | None) -> TrainFlags:
    """``flags`` as the training loop takes them: the paths as ``Path`` (``--metrics``
    defaulting to DIRECTORY/metrics.jsonl, unless ``directory`` is None)."""
    paths = {
        name: Path(getattr(flags, name)) if getattr(flags, name) else None
        for name in ("save", "resume", "metrics", "trace")
    }
    if directory is not None:
        paths["metrics"] = paths["metrics"] or directory / METRICS
    return dataclasses.replace(flags, **paths)
