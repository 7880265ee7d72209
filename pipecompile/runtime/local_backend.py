"""The local backend: every device in one process; messages wait in a mailbox until received."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

__all__ = ["LocalBackend", "MISSING"]

MISSING = object()


class LocalBackend:
    """Point-to-point messages and gradient sums between devices that share this process."""

    def __init__(self) -> None:
        self._mailbox: dict[Hashable, Any] = {}
        self._posted: dict[Hashable, dict[int, torch.Tensor]] = {}
        self._results: dict[Hashable, dict[int, torch.Tensor]] = {}
        self.sent_bytes = 0  # tensor bytes sent between devices (what a wire would carry)

    def send(self, key: Hashable, value: Any) -> None:
        """Leave ``value`` for the receiver of ``key`` (a value may be None: no gradient)."""
        self._mailbox[key] = value
        if isinstance(value, torch.Tensor):
            self.sent_bytes += value.numel() * value.element_size()

    def ready(self, keys: Sequence[Hashable]) -> bool:
        return all(k in self._mailbox for k in keys)

    def recv(self, key: Hashable) -> Any:
        return self._mailbox.pop(key)

    def contribute(
        self, key: Hashable, member: int, members: Sequence[int], tensor: torch.Tensor
    ) -> None:
        """Add ``tensor`` to the sum over ``members`` named ``key``; never waits."""
        posted = self._posted.setdefault(key, {})
        posted[member] = tensor
        if len(posted) == len(members):
            total = posted[members[0]].clone()
            for other in members[1:]:
                total += posted[other]  # in member order, so every member gets the same bits
            self._results[key] = dict.fromkeys(members, total)
            del self._posted[key]

    def has_reduced(self, key: Hashable, member: int) -> bool:
        return member in self._results.get(key, {})

    def reduced(self, key: Hashable, member: int) -> torch.Tensor | object:
        """The sum once every member has contributed (each member takes it once), else
        MISSING."""
        results = self._results.get(key)
        if results is None or member not in results:
            return MISSING
        value = results.pop(member)
        if not results:
            del self._results[key]
        return value

    def reduce_replicas(self, stage: int, params: list[torch.nn.Parameter]) -> None:
        """Nothing to do: in one process a stage has no replicas."""

    def finish(self) -> None:
        """Nothing to wait for: a local send completes at once."""

    def resize(self, sizes: list[dict[str, int]]) -> None:
        """Nothing to size: a local message is the tensor itself."""

    def post(self, keys: Sequence[Hashable]) -> None:
        """Nothing to start: a local receive takes a message already there."""

    def pending(self) -> list[Hashable]:
        """Messages sent but never received (a correct program leaves none)."""
        return list(self._mailbox)
