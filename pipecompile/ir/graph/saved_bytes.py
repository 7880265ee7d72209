"""Bytes a forward stores for its backward, counted the same way at compile time (on fake
tensors) and at run time (on real ones): each storage once, parameters and buffers excluded,
a micro-batch sliced from a mini-batch counting only its own slice."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

__all__ = ["StageMemory", "count_saved", "tensor_bytes"]


@dataclass(frozen=True)
class StageMemory:
    """Bytes one micro-batch holds on a stage: everything autograd saves, or only the inputs."""

    saved: int
    inputs: int


def tensor_bytes(values: Any) -> int:
    """Bytes of the distinct storages of the tensors among ``values``."""
    seen: dict[int, int] = {}
    for t in tree_leaves(values):
        if isinstance(t, torch.Tensor):
            _note(seen, t)
    return sum(seen.values())


@contextmanager
def count_saved(exclude: Any) -> Iterator[dict[int, int]]:
    """Within the block, record ``storage -> bytes`` of every tensor autograd saves for
    backward, except the storages of the tensors in ``exclude`` (parameters, buffers)."""
    skip = {_storage_key(t) for t in tree_leaves(exclude) if isinstance(t, torch.Tensor)}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if _storage_key(t) not in skip:
            _note(seen, t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield seen


def _note(seen: dict[int, int], t: torch.Tensor) -> None:
    """Record the bytes ``t`` occupies in its storage: a micro-batch sliced from the
    mini-batch counts its own slice, not the whole batch it views."""
    key = _storage_key(t)
    extent = min(t.untyped_storage().nbytes(), t.numel() * t.element_size())
    seen[key] = max(seen.get(key, 0), extent)


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata  # identity of the storage, for fake and real tensors
