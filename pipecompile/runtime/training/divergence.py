"""Training stops at the first loss that is not finite, naming the step and micro-batch, or
(``--skip-nonfinite``) drops that step's update and goes on."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from pipecompile.errors import RuntimeFailure

__all__ = ["check_losses", "skipped_line"]


def skipped_line(skipped: list[int], steps: int) -> str:
    """The closing line of a run that skipped ``skipped`` (1-based step numbers)."""
    shown = ", ".join(map(str, skipped[:10])) + (", ..." if len(skipped) > 10 else "")
    return (
        f"pipecompile: skipped {len(skipped)} of {steps} steps whose loss was not finite "
        f"(steps {shown}); their updates were not applied"
    )


def check_losses(losses: Mapping[int, torch.Tensor], step: int, total: float | None = None) -> None:
    """Raise RuntimeFailure if a micro-batch's loss in ``losses`` (or the step's ``total``,
    on a rank that holds no loss) is NaN or infinite; ``step`` counts from 1."""
    for i in sorted(losses):
        value = float(losses[i].detach())
        if not torch.isfinite(torch.tensor(value)):
            raise RuntimeFailure(
                f"step {step}, micro-batch {i}: the loss is {value}; training stops here and "
                "keeps only the train state saved before this step (lower --lr, or check the "
                "inputs, targets and loss_fn; --skip-nonfinite drops such steps instead)"
            )
    if total is not None and not torch.isfinite(torch.tensor(total)):
        raise RuntimeFailure(f"step {step}: the loss is {total}; training stops here")
