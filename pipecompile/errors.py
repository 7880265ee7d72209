"""The exceptions pipecompile raises for a user's mistake: one base class, a subclass per stage."""

from __future__ import annotations

__all__ = [
    "PipecompileError",
    "ModelFileError",
    "TraceError",
    "BalanceError",
    "SplitError",
    "ProgramError",
    "MemoryBudgetError",
    "MicrobatchError",
    "ShapeError",
    "WeightsError",
    "InputError",
    "EmitError",
    "ManifestVersionError",
    "RuntimeFailure",
    "CheckError",
    "VerifyError",
    "InternalError",
    "PlanError",
]


class PipecompileError(Exception):
    """Base of every error pipecompile raises for bad input; the message says what to do."""


class ModelFileError(PipecompileError):
    """The model file is missing, does not import, or lacks what the contract asks for."""


class TraceError(PipecompileError):
    """Neither torch.fx nor torch.export could capture the model."""


class BalanceError(PipecompileError):
    """The graph cannot be cut into the requested number of stages."""


class SplitError(PipecompileError):
    """A value cannot cross a stage boundary as requested."""


class ProgramError(PipecompileError):
    """A schedule program is malformed, inconsistent or would deadlock."""


class PlanError(PipecompileError):
    """No plan the search may choose fits the devices, the memory limit or the batch."""


class MemoryBudgetError(PipecompileError):
    """No recomputation choice keeps a device's stored activations within --memory-budget."""


class ShapeError(PipecompileError):
    """A dimension asked to change from batch to batch cannot (the model or the split fixes it)."""


class MicrobatchError(PipecompileError):
    """The mini-batch cannot be split into the requested micro-batches."""


class InputError(PipecompileError):
    """The inputs or targets given to a compiled pipeline do not fit what it was compiled for."""


class WeightsError(PipecompileError):
    """The pretrained weights (--weights) are missing, damaged, or not this model's."""


class EmitError(PipecompileError):
    """The output directory cannot be written or read back."""


class ManifestVersionError(EmitError):
    """An emitted directory's manifest is in another format (a newer pipecompile wrote it)."""


class RuntimeFailure(PipecompileError):
    """An instruction failed while a program ran; names the device and the instruction."""


class CheckError(PipecompileError):
    """The pipelined results differ from the eager model's beyond tolerance."""


class VerifyError(PipecompileError):
    """An emitted stage does not compute what the traced model does (found by the proof at the
    end of a compile, which ``--no-verify`` skips)."""


class InternalError(PipecompileError):
    """A bug in pipecompile itself, wrapped with the pass or instruction it happened in."""
