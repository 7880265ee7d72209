"""What the executor asks of a message backend, and how a message between stages is named.

The local backend (every device in this process) and the distributed one (a rank per device)
both provide ``Backend``; the executor calls nothing else, so a new transport is one class.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple, Protocol

import torch

__all__ = ["Backend", "MessageKey", "tie_round", "tie_of"]


class MessageKey(NamedTuple):
    """One value crossing between stages for one micro-batch: ``kind`` "F" carries the
    activation from ``src`` to ``dst``, "B" its gradient back from ``dst`` to ``src``."""

    kind: str
    src: int
    dst: int
    microbatch: int
    value: str


def tie_round(key: Hashable, window: int | None) -> Hashable:
    """The name of one sum of a tied parameter: the parameter's key for a step's (STEP), or
    with the window's last micro-batch for PipeDream-2BW's per-window sums."""
    return key if window is None else ("window", window, key)


def tie_of(key: Hashable) -> Hashable:
    """The tied parameter a sum named by ``tie_round`` belongs to."""
    if isinstance(key, tuple) and len(key) == 3 and key[0] == "window":
        return key[2]
    return key


class Backend(Protocol):
    """Point-to-point messages and gradient sums for one training or inference step: what
    the executor and the pipeline call, and nothing else."""

    sent_bytes: int  # tensor bytes sent between devices so far this step

    def resize(self, sizes: list[dict[str, int]]) -> None:
        """Each micro-batch's sizes of the dimensions compiled ``--dynamic``, before the step:
        what a backend that allocates its receives sizes them by."""

    def post(self, keys: Sequence[MessageKey]) -> None:
        """Start receiving ``keys`` ahead of the instruction that takes them (a backend whose
        receives complete at once does nothing)."""

    def send(self, key: MessageKey, value: torch.Tensor | None) -> None:
        """Post ``value`` for the receiver of ``key`` (None: no gradient); never waits."""

    def ready(self, keys: Sequence[MessageKey]) -> bool:
        """Whether every message in ``keys`` can be received now (a blocking backend waits
        for them and returns True)."""

    def recv(self, key: MessageKey) -> torch.Tensor | None:
        """Take the message ``key`` (after ``ready``)."""

    def contribute(
        self, key: Hashable, member: int, members: Sequence[int], tensor: torch.Tensor
    ) -> None:
        """Add ``tensor`` to the sum named ``key`` over ``members`` (tied parameters)."""

    def has_reduced(self, key: Hashable, member: int) -> bool:
        """Whether the sum ``key`` is complete for ``member``."""

    def reduced(self, key: Hashable, member: int) -> torch.Tensor | object:
        """The completed sum for ``member`` (each takes it once)."""

    def reduce_replicas(self, stage: int, params: list[torch.nn.Parameter]) -> None:
        """Sum ``params``' gradients over the ranks replicating ``stage`` (locally: none)."""

    def finish(self) -> Any:
        """End the step: wait for the backend's own outstanding sends."""
