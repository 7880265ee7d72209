"""The (dp, pp) device mesh of `run --nproc N --dp D`, a rank's place on it, and the sharded
optimizer of ``--shard optimizer`` (docs/DISTRIBUTED.md, "Pipeline x data parallel")."""

from __future__ import annotations

from typing import Any

import torch

from pipecompile.runtime.training.data_parallel import DataParallel

__all__ = ["mesh_of", "data_parallel_of", "sharded_optimizer"]


def mesh_of(device_type: str, copies: int, width: int) -> Any:
    """The run's ``(dp, pp)`` device mesh over every rank (collective: every rank calls it)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (copies, width), mesh_dim_names=("dp", "pp"))


def data_parallel_of(
    where: torch.device, copies: int, placement: Any, order: tuple[int, ...], *, lead: bool
) -> DataParallel:
    """This rank's DataParallel (``placement``: its copy's): the mesh built (collectively)
    when there are copies."""
    if copies == 1:
        return DataParallel(lead=lead, order=order)
    mesh = mesh_of(where.type, copies, placement.world)
    index = placement.first // placement.world
    return DataParallel(copies, index, mesh.get_group("dp"), lead, order)


def sharded_optimizer(shard: str, options: Any, data_parallel: DataParallel) -> Any:
    """The optimizer factory of ``--shard optimizer`` (ZeRO-1): each stage's optimizer state
    partitioned over the ``dp`` group by torch's ``ZeroRedundancyOptimizer``; its step
    updates the parameters a rank owns and broadcasts them to the other copies."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from pipecompile.runtime.training.loop import OPTIMIZERS

    assert shard == "optimizer", shard  # the others are refused before any rank starts
    kind, lr, group = OPTIMIZERS[options.optimizer], options.lr, data_parallel.group

    def factory(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return ZeroRedundancyOptimizer(params, optimizer_class=kind, process_group=group, lr=lr)

    return factory
