"""The training options of `pipecompile run`, declared once for the command and for each rank
of `run --nproc` (which gets them forwarded), and turned into ``TrainOptions``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipecompile.runtime.precision import PRECISIONS
from pipecompile.runtime.training.loop import OPTIMIZERS, TrainOptions
from pipecompile.runtime.training.lr_schedule import SCHEDULES

__all__ = [
    "add_training_arguments",
    "forwarded",
    "given",
    "train_options",
    "positive_int",
    "nonnegative_int",
    "positive_float",
    "nonnegative_float",
    "finite_float",
]

# (flag, attribute, is a path): what `run --nproc` forwards to its ranks, besides switches
_VALUED = (
    ("--steps", "steps", False), ("--epochs", "epochs", False),
    ("--accumulate", "accumulate", False), ("--optimizer", "optimizer", False),
    ("--lr", "lr", False), ("--lr-schedule", "lr_schedule", False),
    ("--warmup-steps", "warmup_steps", False), ("--clip-grad-norm", "clip_grad_norm", False),
    ("--precision", "precision", False), ("--seed", "seed", False),
    ("--save-every", "save_every", False), ("--eval-every", "eval_every", False),
    ("--save", "save", True), ("--resume", "resume", True), ("--metrics", "metrics", True),
)  # fmt: skip
_SWITCHES = (("--skip-nonfinite", "skip_nonfinite"), ("-q", "quiet"), ("--force", "force"))


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    """The training flags (docs/USAGE.md, "Training")."""
    add = parser.add_argument
    add("--steps", type=positive_int,
        help="optimizer steps to run (default 1, or as many as --epochs give)")  # fmt: skip
    add("--epochs", type=positive_int,
        help="passes over train_batches() (the data restarts when it ends)")  # fmt: skip
    add("--accumulate", type=positive_int, default=1, metavar="N",
        help="mini-batches whose gradients are summed into one optimizer step")  # fmt: skip
    add("--optimizer", default="adamw", choices=sorted(OPTIMIZERS))
    add("--lr", type=positive_float, default=1e-3)
    add("--lr-schedule", default="constant", choices=SCHEDULES,
        help="constant, or warm-up then cosine or linear decay to 0 at the last step")  # fmt: skip
    add("--warmup-steps", type=nonnegative_int, default=0, metavar="N",
        help="steps over which the learning rate rises linearly to --lr")  # fmt: skip
    add("--clip-grad-norm", type=finite_float, metavar="NORM",
        help="scale the gradients so their global norm (all stages and ranks) is at most "
        "NORM")  # fmt: skip
    add("--precision", default="fp32", choices=tuple(PRECISIONS),
        help="autocast dtype of the stages and their traffic; fp32 master weights (fp16: "
        "a GPU, with dynamic loss scaling)")  # fmt: skip
    add("--seed", type=nonnegative_int,
        help="random ops (dropout) draw from this seed, the step, the micro-batch and their "
        "place in the model: the same for any stage count, schedule or rank count")  # fmt: skip
    add("--skip-nonfinite", action="store_true",
        help="drop the update of a step whose loss is NaN or infinite and go on "
        "(default: stop there)")  # fmt: skip
    add("--save", help="checkpoint directory (outside DIRECTORY), written after the last step")
    add("--save-every", type=nonnegative_int, default=0,
        help="with --save: also save every N steps")  # fmt: skip
    add("--resume", help="continue from the newest checkpoint in this directory")
    add("--force", action="store_true",
        help="--save into a directory holding another run's checkpoints: replace those of "
        "the steps this run saves (what pipecompile did not write is never replaced)")  # fmt: skip
    add("--metrics", metavar="FILE",
        help="append one JSON line per step here (default: DIRECTORY/metrics.jsonl)")  # fmt: skip
    add("--eval-every", type=nonnegative_int, default=0, metavar="N",
        help="with eval_batches(): evaluate every N steps (default: after each epoch and at "
        "the end)")  # fmt: skip
    add("-q", "--quiet", action="store_true", help="print nothing but errors")


def forwarded(args: argparse.Namespace) -> list[str]:
    """``args``' training flags as arguments for a rank (paths made absolute)."""
    out: list[str] = []
    for flag, name, is_path in _VALUED:
        value = getattr(args, name)
        if value is not None:
            out += [flag, str(Path(value).resolve()) if is_path else str(value)]
    for flag, name in _SWITCHES:
        out += [flag] * bool(getattr(args, name))
    return out


def given(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(flag, attribute) of each training option ``args`` sets to other than its default
    (a value equal to the default asks for nothing the run would not do anyway)."""
    defaults = argparse.ArgumentParser(add_help=False)
    add_training_arguments(defaults)
    return [
        (flag, name)
        for flag, name in [(f, n) for f, n, _ in _VALUED] + list(_SWITCHES)
        if name != "quiet" and getattr(args, name) != defaults.get_default(name)
    ]


def train_options(args: argparse.Namespace, directory: Path) -> TrainOptions:
    return TrainOptions(
        steps=args.steps, epochs=args.epochs, accumulate=args.accumulate,
        optimizer=args.optimizer, lr=args.lr, lr_schedule=args.lr_schedule,
        warmup_steps=args.warmup_steps, clip_grad_norm=args.clip_grad_norm,
        precision=args.precision, seed=args.seed, skip_nonfinite=args.skip_nonfinite,
        save=Path(args.save) if args.save else None, save_every=args.save_every,
        resume=Path(args.resume) if args.resume else None,
        metrics=Path(args.metrics) if args.metrics else directory / "metrics.jsonl",
        eval_every=args.eval_every, quiet=args.quiet,
    )  # fmt: skip


def positive_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 1, "a whole number of at least 1")


def nonnegative_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 0, "a whole number of at least 0")


def positive_float(text: str) -> float:
    return _number(text, float, lambda v: 0 < v < float("inf"), "a finite number above 0")


def nonnegative_float(text: str) -> float:
    return _number(text, float, lambda v: 0 <= v < float("inf"), "a finite number of at least 0")


def finite_float(text: str) -> float:
    return _number(text, float, lambda v: abs(v) < float("inf"), "a finite number")


def _number(text: str, kind: type, ok: Callable[[Any], bool], want: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {want}")
    return value
