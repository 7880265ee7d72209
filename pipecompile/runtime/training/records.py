"""The lines of a run's metrics file, typed: ``StepRecord`` for a step, ``EvalRecord`` for an
evaluation. docs/USAGE.md lists their keys; ``to_json`` is the one place that spells them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

__all__ = ["EvalRecord", "StepRecord"]


@dataclass
class StepRecord:
    """One optimizer step, written as ``{"kind": "train", ...}``.

    ``fit()`` returns these; ``record.loss`` and ``record["loss"]`` read the same value.
    """

    KIND: ClassVar[str] = "train"

    step: int  # optimizer step, from 1
    epoch: int
    loss: float  # mean over the step's micro-batches and accumulated mini-batches
    lr: float | None = None
    step_ms: float = 0.0
    samples_per_s: float = 0.0
    tokens_per_s: float | None = None
    bubble: float | None = None  # idle share of the devices
    peak_memory: list[int] = field(default_factory=list)  # bytes per device (per rank)
    sent_bytes: int = 0
    grad_norm: float | None = None  # before clipping, with --clip-grad-norm
    loss_scale: float | None = None  # fp16's
    skipped: bool = False  # the update was dropped
    first: int = 0  # the step this run began at (a resumed run's saved step)
    optimizer_state_bytes: list[int] = field(default_factory=list)  # per rank (per process)

    def to_json(self) -> dict[str, Any]:
        """The metrics line's object, keys in the order the file has always had."""
        return {"kind": self.KIND, **asdict(self)}

    def __getitem__(self, key: str) -> Any:
        """``record["loss"]``: a record reads as the mapping its JSON line is."""
        if key == "kind":
            return self.KIND
        if key not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, key)


@dataclass(frozen=True)
class EvalRecord:
    """The loss over ``eval_batches()`` after a step, written as ``{"kind": "eval", ...}``."""

    KIND: ClassVar[str] = "eval"

    step: int
    epoch: int
    loss: float

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.KIND, **asdict(self)}
