"""The ranks of a run as the training loop needs them (``Group``), and one process holding
every device (``LocalGroup``)."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Group", "LocalGroup"]


class Group(Protocol):
    """The ranks of a run, as the loop needs them: sums and maxima of a few numbers, and a
    gather (``rank`` 0 reports)."""

    rank: int

    def sum(self, values: list[float]) -> list[float]: ...

    def max(self, values: list[float]) -> list[float]: ...

    def gather(self, values: list[float]) -> list[list[float]]: ...

    def gather_objects(self, value: Any) -> list[Any] | None:
        """Every rank's ``value`` on rank 0 (None on the others)."""


class LocalGroup:
    """One process holding every device."""

    rank = 0

    def sum(self, values: list[float]) -> list[float]:
        return list(values)

    def max(self, values: list[float]) -> list[float]:
        return list(values)

    def gather(self, values: list[float]) -> list[list[float]]:
        return [list(values)]

    def gather_objects(self, value: Any) -> list[Any] | None:
        return [value]
