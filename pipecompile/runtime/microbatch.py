"""Split a mini-batch into micro-batches along one dimension, and join results back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from pipecompile.errors import MicrobatchError

__all__ = ["split_microbatches", "split_targets", "join_microbatches"]


def split_microbatches(
    tensors: Mapping[str, torch.Tensor], count: int, dim: int = 0
) -> list[dict[str, torch.Tensor]]:
    """``count`` dicts of equal slices of every tensor along ``dim``.

    Raises:
        MicrobatchError: a tensor's size along ``dim`` is not divisible by ``count``.
    """
    if count < 1:
        raise MicrobatchError(f"--microbatches must be at least 1, got {count}")
    for name, tensor in tensors.items():
        size = tensor.shape[dim] if tensor.dim() > dim else None
        if size is None or size % count:
            raise MicrobatchError(
                f"input {name!r} has shape {tuple(tensor.shape)}: its size along dim {dim} "
                f"({size}) is not divisible into {count} micro-batches; choose --microbatches "
                f"that divides {size}"
            )
    chunks = {name: t.chunk(count, dim) for name, t in tensors.items()}
    return [{name: parts[i] for name, parts in chunks.items()} for i in range(count)]


def split_targets(
    targets: Sequence[torch.Tensor], count: int, dim: int = 0
) -> list[tuple[torch.Tensor, ...]]:
    """``count`` tuples of equal slices of every target tensor (errors name ``target k``)."""
    named = {f"target {k}": t for k, t in enumerate(targets)}
    return [tuple(part.values()) for part in split_microbatches(named, count, dim)]


def join_microbatches(parts: Sequence[Sequence[torch.Tensor]], dim: int = 0) -> list[torch.Tensor]:
    """Concatenate per-micro-batch output lists position by position."""
    return [torch.cat([p[k] for p in parts], dim) for k in range(len(parts[0]))]
