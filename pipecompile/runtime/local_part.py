"""A tensor's local part. Under FSDP (`run --dp D --shard grads|params`) a stage's parameters,
gradients and optimizer state are DTensors sharded over the data-parallel copies; what a rank
tests, measures, sums with a tied stage or counts is its own shard. Any other tensor is its
own local part."""

from __future__ import annotations

import sys

import torch

__all__ = ["is_dtensor", "local_part", "laid_out_like"]


def is_dtensor(tensor: object) -> bool:
    """Whether ``tensor`` is a DTensor. torch.distributed.tensor is not imported for the
    question (a second of start-up): where nothing has imported it, nothing is one."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """The part of ``tensor`` this rank holds: a DTensor's local shard, else the tensor."""
    return tensor.to_local() if is_dtensor(tensor) else tensor  # type: ignore[attr-defined]


def laid_out_like(reference: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` (a local part) laid out as ``reference``: a DTensor over the same mesh and
    placements when ``reference`` is one, else ``local`` itself."""
    if not is_dtensor(reference):
        return local
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        local,
        reference.device_mesh,
        reference.placements,
        run_check=False,
        shape=reference.shape,
        stride=reference.stride(),
    )
