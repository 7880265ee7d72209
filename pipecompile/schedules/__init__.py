"""Schedule generators: compute-only programs (F, B, STEP) that communication is added to."""

from __future__ import annotations

from collections.abc import Callable

from pipecompile.errors import ProgramError
from pipecompile.program import Program
from pipecompile.schedules.gpipe import gpipe

__all__ = ["SCHEDULES", "generate"]

SCHEDULES: dict[str, Callable[[int, int], Program]] = {"gpipe": gpipe}


def generate(name: str, stages: int, microbatches: int) -> Program:
    """The compute-only program of schedule ``name``; raises ProgramError for an unknown name."""
    if name not in SCHEDULES:
        raise ProgramError(f"unknown schedule {name!r}; available: {', '.join(SCHEDULES)}")
    if microbatches < 1:
        raise ProgramError(f"--microbatches must be at least 1, got {microbatches}")
    return SCHEDULES[name](stages, microbatches)
