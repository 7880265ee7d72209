"""What a training step does to the gradients a synchronous step left on the stages
(``Pipeline.train_step(keep_grads=True)``): set them aside and add them back (gradient
accumulation), test them for overflow, measure their global norm, scale them.

A tied parameter is counted once (on the lowest stage holding it) and a replicated stage once
(replica 0), so the norm is the model's, whatever the split; the caller sums the squared norms
of all ranks. Under FSDP (``--shard grads|params``) a rank holds a shard of each gradient
and tests, measures and scales only that (``local_part``)."""

from __future__ import annotations

import torch
from torch import nn

from pipecompile.runtime.local_part import local_part

__all__ = ["add_grads", "all_finite", "scale_grads", "squared_norm", "take_grads"]


def _held(pipe) -> list[tuple[int, nn.Module]]:  # type: ignore[no-untyped-def]
    return [(j, m) for j, m in enumerate(pipe.modules) if m is not None]


def take_grads(pipe) -> dict[int, list[torch.Tensor | None]]:  # type: ignore[no-untyped-def]
    """Every held parameter's gradient, removed from the parameter: per stage, in a fixed
    order."""
    taken: dict[int, list[torch.Tensor | None]] = {}
    for j, module in _held(pipe):
        taken[j] = []
        for p in module.parameters():
            taken[j].append(p.grad)
            p.grad = None
    return taken


def add_grads(pipe, taken: dict[int, list[torch.Tensor | None]], stage: int | None = None) -> None:  # type: ignore[no-untyped-def]
    """Add gradients ``take_grads`` removed back onto the parameters (of ``stage`` only, if
    given), each once: what is added leaves ``taken``."""
    for j, module in _held(pipe):
        if (stage is None or j == stage) and j in taken:
            for p, g in zip(module.parameters(), taken.pop(j), strict=True):
                if g is not None:
                    p.grad = g if p.grad is None else p.grad + g


def all_finite(pipe) -> bool:  # type: ignore[no-untyped-def]
    """Whether every held gradient is finite."""
    return all(
        bool(torch.isfinite(local_part(p.grad)).all())
        for _, module in _held(pipe)
        for p in module.parameters()
        if p.grad is not None
    )


def squared_norm(pipe) -> float:  # type: ignore[no-untyped-def]
    """This rank's share of the squared global gradient norm (float64 sum)."""
    if pipe.replica is not None and pipe.replica[0] != 0:
        return 0.0
    skip = {
        (j, name)
        for held in pipe.layout.ties.values()
        for j, name in held.items()
        if j != min(held)
    }
    total = torch.zeros((), dtype=torch.float64)
    for j, module in _held(pipe):
        for name, p in module.named_parameters():
            if p.grad is not None and (j, name) not in skip:
                total += local_part(p.grad).detach().double().pow(2).sum().cpu()
    return float(total)


def scale_grads(pipe, factor: float) -> None:  # type: ignore[no-untyped-def]
    """Multiply every held gradient by ``factor`` (tied and replica copies alike)."""
    for _, module in _held(pipe):
        for p in module.parameters():
            if p.grad is not None:
                local_part(p.grad).mul_(factor)
