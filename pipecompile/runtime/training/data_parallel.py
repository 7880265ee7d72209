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

With ``--shard grads`` or ``--shard params`` each stage is under FSDP (``fully_shard`` over
``dp``) instead: FSDP reduce-scatters (and averages) a stage's gradients after its last
backward of each accumulation part, so the loss carries no 1/D and there is nothing to sum
here; each copy keeps a shard of every gradient and of the optimizer state. Every copy then
runs every part, since FSDP's collectives pair the copies' backwards: a copy the data left
without a batch replays its last one at weight 0.
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
    mesh: Any = None  # the (dp, pp) device mesh
    sharded: str | None = None  # "grads" or "params": the stages are under FSDP
    _pending: dict[int, tuple[Any, torch.Tensor, list[torch.nn.Parameter]]] = field(
        default_factory=dict
    )

    @property
    def loss_copies(self) -> int:
        """What a micro-batch's loss is divided by for the copies: D where their gradients are
        summed here, 1 under FSDP, whose reduction averages them."""
        return 1 if self.sharded else self.size

    @property
    def counts_norm(self) -> bool:
        """Whether this rank's gradients count in the global norm: copy 0's (the copies hold
        the same sums), or every copy's shard under FSDP."""
        return self.index == 0 or self.sharded is not None

    def before_backward(self, modules: list[Any], j: int, last: bool) -> None:
        """Under FSDP, before a backward of stage ``j``: reduce-scatter its gradients (and,
        with --shard grads, free the gathered weights) only after its ``last`` one of the
        part; the earlier ones accumulate unsharded, without communication."""
        module = modules[j]
        if not hasattr(module, "set_requires_gradient_sync"):  # a stage without weights
            return
        module.set_requires_gradient_sync(last)
        module.set_is_last_backward(last)
        if self.sharded == "grads":
            module.set_reshard_after_backward(last)

    def gather(self, mine: Any) -> tuple[list[Any], int]:
        """Every copy's ``mine`` at this rank's place, in copy order, and this copy's index
        (a loss over the whole batch joins the copies' outputs: runtime/state/whole_loss)."""
        every: list[Any] = [None] * self.size
        dist.all_gather_object(every, mine, group=self.group)
        return every, self.index

    def start(self, modules: list[Any], j: int) -> None:
        """Start summing stage ``j``'s gradients over ``dp`` (once per step)."""
        if self.loss_copies == 1 or j in self._pending or modules[j] is None:
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
        if self.loss_copies == 1:
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
