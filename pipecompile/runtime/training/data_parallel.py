"""`run --nproc N --dp D`: D copies of the compiled pipeline on a 2-D device mesh.

The mesh is ``torch.distributed.device_mesh`` with dimensions ``("dp", "pp")``: copy k runs
on ranks ``k*W .. k*W+W-1``, W the ranks one pipeline needs (its devices, and the replicas
of ``--replicate``, which are data parallelism inside a copy on the same idea). The program
stays per pipeline; each rank's ``dp`` group holds the ranks at its place in every copy.

A synchronous step reads D times the batches of one copy (copy k takes batches k, k+D, ...
of ``train_batches()``), scales each micro-batch's loss by 1/D more, and sums each stage's
gradients over ``dp``: one flat all-reduce per stage (a bucket), started asynchronously at
the stage's STEP of the step's last accumulation part (right after its last backward), and
waited for before the gradients are tested, clipped and applied. The sum of D copies' means
is then the mean over the D batches: the step equals one pipeline with ``--accumulate D``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DataParallel"]


@dataclass
class DataParallel:
    """This rank's place on the mesh and its gradient sums over ``dp``.

    ``index``: the copy this rank belongs to, of ``size``; ``group``: its ``dp`` process group
    (None when there is one copy); ``lead``: whether this rank speaks for its copy in the
    counts summed over all ranks (it reads the copy's inputs); ``order``: the stages this rank
    holds, in the order their STEPs run (the order every copy starts its sums in)."""

    size: int = 1
    index: int = 0
    group: Any = None
    lead: bool = True
    order: tuple[int, ...] = ()
    _pending: dict[int, tuple[Any, torch.Tensor, list[torch.nn.Parameter]]] = field(
        default_factory=dict
    )

    def start(self, modules: list[Any], j: int) -> None:
        """Start summing stage ``j``'s gradients over ``dp`` (once per step)."""
        if self.size == 1 or j in self._pending or modules[j] is None:
            return
        params = list(modules[j].parameters())
        if not params:
            self._pending[j] = (None, torch.zeros(0), [])
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        work = dist.all_reduce(flat, group=self.group, async_op=True)
        self._pending[j] = (work, flat, params)

    def finish(self, modules: list[Any]) -> None:
        """Start the sums not started yet (a copy that sat out the step's last part), in STEP
        order, then wait for every sum and put it back on the parameters."""
        if self.size == 1:
            return
        for j in self.order:
            self.start(modules, j)
        for j in self.order:
            work, flat, params = self._pending.pop(j)
            if work is not None:
                work.wait()
            offset = 0
            for p in params:
                p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
