"""A loss over the whole batch, computed once a step on every micro-batch's outputs joined.

A loss that mixes the samples of its batch (a contrastive loss) is not the mean of its
micro-batches' losses. The last stage keeps each micro-batch's outputs as its forward ends;
after the last one (a schedule that waits for it: ``ir/programs/whole_batch``) the outputs are
joined along the batch, the loss is computed once, and its gradient with respect to the joined
outputs is cut back into one gradient per micro-batch. Each micro-batch's backward then starts
from ``surrogate(i, outs)``: a scalar whose gradient with respect to ``outs`` is exactly that
cut, and whose value is the micro-batch's share of the whole loss (so the step's mean loss is
the whole batch's). The gradients equal eager's on the whole batch.

Under ``run --dp D`` each copy of the pipeline holds a part of the global batch. The joined
outputs and the targets of every copy are then gathered (``gather``: each copy's values, in
copy order; a copy without a batch this step gives None), the loss is computed on the global
batch on every copy alike, and each copy cuts out the gradient of its own rows, times the
copies' count: the copies' gradients are summed (their losses carry 1/D), so the step equals
eager on the global batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["Gather", "WholeLoss"]

# this copy's values (None: it has no batch this step) -> every copy's, in copy order, and
# this copy's place among them
Gather = Callable[[Any], tuple[list[Any], int]]


class WholeLoss:
    """The whole-batch loss of one step of ``count`` micro-batches."""

    def __init__(self, count: int, gather: Gather | None = None) -> None:
        self.count = count
        self.gather = gather
        self.pending: dict[int, tuple[Any, ...]] = {}  # each micro-batch's outputs (values)
        self.grads: dict[int, list[torch.Tensor | None]] = {}  # its cut of the gradient
        self.value: torch.Tensor | None = None  # the scaled whole loss, detached

    def add(self, i: int, outs: tuple[Any, ...]) -> bool:
        """Keep micro-batch ``i``'s outputs; whether every micro-batch's are kept now."""
        self.pending[i] = tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in outs)
        return len(self.pending) == self.count

    def compute(
        self,
        loss_of: Callable[[list[Any], Sequence[torch.Tensor]], torch.Tensor],
        targets: Sequence[torch.Tensor],
        scale: float,
    ) -> None:
        """Join the kept outputs (and, under --dp, every copy's), compute ``loss_of(joined,
        targets) * scale`` and its gradient with respect to each micro-batch's outputs."""
        order = sorted(self.pending)
        width = len(self.pending[order[0]])
        joined: list[Any] = []
        rows = [self._rows(self.pending[i]) for i in order]
        for k in range(width):
            parts = [self.pending[i][k] for i in order]
            if isinstance(parts[0], torch.Tensor) and parts[0].dim() > 0:
                leaf = torch.cat(parts).detach()
                joined.append(leaf.requires_grad_(leaf.is_floating_point()))
            else:
                joined.append(parts[0])
        whole, targets, copies = self._global(joined, targets)
        loss = loss_of(whole, targets).float() * scale
        self.value = loss.detach()
        leaves = [t for t in joined if isinstance(t, torch.Tensor) and t.requires_grad]
        if copies > 1:  # the copies' gradients are summed, their losses carry 1 / D
            loss = loss * copies
        found = torch.autograd.grad(loss, leaves, allow_unused=True) if loss.requires_grad else ()
        by_id = {id(t): g for t, g in zip(leaves, found)}
        starts = [sum(rows[:n]) for n in range(len(order))]
        for n, i in enumerate(order):
            cut = []
            for t in joined:
                g = by_id.get(id(t)) if isinstance(t, torch.Tensor) else None
                cut.append(None if g is None else g.narrow(0, starts[n], rows[n]))
            self.grads[i] = cut

    def _global(
        self, joined: list[Any], targets: Sequence[torch.Tensor]
    ) -> tuple[list[Any], list[torch.Tensor], int]:
        """The joined outputs and targets of every copy (this copy's outputs the leaves its
        gradient is taken for), and the copies' count; this copy's alone without ``gather``."""
        if self.gather is None:
            return joined, list(targets), 1
        tensor = [isinstance(t, torch.Tensor) and t.dim() > 0 for t in joined]
        values = [t.detach().cpu() if is_t else None for t, is_t in zip(joined, tensor)]
        mine = (values, [t.cpu() for t in targets])
        every, index = self.gather(mine)
        whole = []
        for k, t in enumerate(joined):
            if not tensor[k]:
                whole.append(t)
                continue
            parts = [t if c == index else v[0][k].to(t.device) for c, v in enumerate(every) if v]
            whole.append(torch.cat(parts))
        device = targets[0].device if targets else None
        glued = [torch.cat([v[1][n].to(device) for v in every if v]) for n in range(len(targets))]
        return whole, glued, sum(1 for v in every if v)

    @staticmethod
    def _rows(outs: tuple[Any, ...]) -> int:
        return next(o.shape[0] for o in outs if isinstance(o, torch.Tensor) and o.dim() > 0)

    def surrogate(self, i: int, outs: tuple[Any, ...]) -> torch.Tensor:
        """What micro-batch ``i``'s backward starts from (see the module's docstring)."""
        assert self.value is not None, "the whole loss is computed after the last forward"
        share = self.value / self.count
        terms = [
            (o * g.to(o.dtype)).sum()
            for o, g in zip(outs, self.grads[i])
            if g is not None and isinstance(o, torch.Tensor) and o.requires_grad
        ]
        if not terms:
            return share
        root = torch.stack(terms).sum().float()
        return (root - root.detach()) + share  # exactly share in value (x - x is 0), root's grad
