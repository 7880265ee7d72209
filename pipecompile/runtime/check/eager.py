"""One step of a loaded pipeline against the model file's eager model, as its program asks:
weight-stashed SGD for an asynchronous (PipeDream) program, gradients for a synchronous one."""

from __future__ import annotations

from pipecompile.ir.graph.noise_floor import Tolerance
from pipecompile.model.model_file import ModelSpec
from pipecompile.runtime.check.asynchronous import check_async_step
from pipecompile.runtime.check.step import CheckReport, check_step
from pipecompile.runtime.pipeline import Pipeline

__all__ = ["check_against_eager"]


def check_against_eager(
    pipe: Pipeline,
    spec: ModelSpec,
    *,
    lr: float,
    tolerance: Tolerance,
) -> CheckReport:
    """``spec`` must hold the eager model, the targets and the loss (``run --check`` loads them)."""
    assert spec.model is not None and spec.targets is not None and spec.loss_fn is not None
    batch = (pipe, spec.model, spec.inputs, spec.targets, spec.loss_fn)
    if pipe.asynchronous:
        return check_async_step(*batch, lr=lr, tolerance=tolerance)
    return check_step(*batch, tolerance=tolerance)
