"""The (dp, pp) device mesh of `run --nproc N --dp D`, a rank's place on it, and what
``--shard`` shards over its ``dp`` dimension: the optimizer state (``optimizer``, torch's
ZeroRedundancyOptimizer), or the stages under FSDP2 (``grads``, ``params``): see
docs/DISTRIBUTED.md, "Pipeline x data parallel"."""

from __future__ import annotations

from typing import Any

import torch

from pipecompile.runtime.training.data_parallel import DataParallel

__all__ = ["mesh_of", "data_parallel_of", "sharded_optimizer", "fully_shard_stages"]


def mesh_of(device_type: str, copies: int, width: int) -> Any:
    """The run's ``(dp, pp)`` device mesh over every rank (collective: every rank calls it)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (copies, width), mesh_dim_names=("dp", "pp"))


def data_parallel_of(
    where: torch.device,
    copies: int,
    placement: Any,
    order: tuple[int, ...],
    *,
    lead: bool,
    shard: str | None = None,
) -> DataParallel:
    """This rank's DataParallel (``placement``: its copy's): the mesh built (collectively)
    when there are copies."""
    if copies == 1:
        return DataParallel(lead=lead, order=order)
    mesh = mesh_of(where.type, copies, placement.world)
    index = placement.first // placement.world
    fsdp = shard if shard in ("grads", "params") else None
    return DataParallel(copies, index, mesh.get_group("dp"), lead, order, mesh, fsdp)


def fully_shard_stages(modules: list[Any], data_parallel: DataParallel) -> None:
    """Put each stage this rank holds under FSDP2 over the ``dp`` dimension (``--shard grads``:
    the weights gathered once per part and kept until its last backward, ZeRO-2's traffic;
    ``--shard params``: gathered for each forward and backward, ZeRO-3). Parameters become
    DTensors sharded over the copies; so do their gradients and optimizer state."""
    from torch.distributed.fsdp import fully_shard

    mesh = data_parallel.mesh["dp"]
    for module in modules:
        if module is not None and any(True for _ in module.parameters()):
            fully_shard(module, mesh=mesh, reshard_after_forward=data_parallel.sharded == "params")


def sharded_optimizer(options: Any, data_parallel: DataParallel) -> Any:
    """The optimizer factory of ``--shard optimizer`` (ZeRO-1): each stage's optimizer state
    partitioned over the ``dp`` group by torch's ``ZeroRedundancyOptimizer``; its step
    updates the parameters a rank owns and broadcasts them to the other copies."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from pipecompile.runtime.training.loop_options import OPTIMIZERS

    kind, lr, group = OPTIMIZERS[options.optimizer], options.lr, data_parallel.group

    def factory(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return ZeroRedundancyOptimizer(params, optimizer_class=kind, process_group=group, lr=lr)

    return factory
