"""Learning-rate schedules: ``torch.optim.lr_scheduler.LambdaLR`` per stage optimizer, all
stepped once per optimizer step, so every stage and rank follows the same curve.

``constant``: the rate as given. ``cosine``: linear warm-up over ``warmup`` steps from
rate/warmup to the rate, then half a cosine down to 0 at the last step. ``linear``: the same
warm-up, then a straight line down to 0. ``constant`` with a warm-up warms up, then holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch.optim.lr_scheduler import LambdaLR

from pipecompile.errors import PipecompileError
from pipecompile.options.run import LR_SCHEDULES

__all__ = ["LR_SCHEDULES", "lr_factor", "make_schedulers", "resume_at"]


def lr_factor(name: str, warmup: int, total: int | None) -> Callable[[int], float]:
    """The multiplier of the base rate at optimizer step ``s`` (from 0)."""
    if name not in LR_SCHEDULES:
        raise PipecompileError(
            f"unknown learning-rate schedule {name!r}; choose one of {', '.join(LR_SCHEDULES)}"
        )
    if name != "constant" and total is None:
        raise PipecompileError(
            f"--lr-schedule {name} decays to 0 at the last step, so it needs the run's length: "
            "pass --steps, or give train_batches() a __len__ so --epochs can tell it"
        )

    def factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        if name == "constant":
            return 1.0
        assert total is not None
        span = max(total - warmup, 1)
        done = min((s - warmup) / span, 1.0)
        return 0.5 * (1 + math.cos(math.pi * done)) if name == "cosine" else 1.0 - done

    return factor


def make_schedulers(
    optimizers: Sequence[torch.optim.Optimizer | None],
    name: str,
    warmup: int,
    total: int | None,
) -> list[LambdaLR]:
    """One scheduler per optimizer (None where a stage has no parameters here)."""
    factor = lr_factor(name, warmup, total)
    return [LambdaLR(opt, factor) for opt in optimizers if opt is not None]


def resume_at(schedulers: Sequence[LambdaLR], step: int) -> None:
    """Continue the schedules at optimizer step ``step`` (after loading a saved train state, whose
    optimizer state holds the rate of the step before)."""
    for scheduler in schedulers:
        scheduler.last_epoch = step
        groups = scheduler.optimizer.param_groups
        for group, base, factor in zip(groups, scheduler.base_lrs, scheduler.lr_lambdas):
            group["lr"] = base * factor(step)
