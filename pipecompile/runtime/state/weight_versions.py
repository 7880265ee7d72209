"""Weight stashing: the versions of a stage's weights that in-flight micro-batches use.

STASH keeps the stage's current weights for a micro-batch: a copy, shared by every
micro-batch stashed before the next UPDATE changes the weights. The forward then runs on
per-micro-batch leaf tensors over that copy (separate tensors, never swapped into the module
in place), so its backward differentiates exactly the weights the forward used and leaves
the gradient on those leaves until UPDATE hands it to the optimizer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["WeightVersions"]


class WeightVersions:
    def __init__(self, modules: Sequence[nn.Module]) -> None:
        self.modules = modules
        self.version = [0] * len(modules)  # UPDATEs applied per stage in this step
        self._latest: dict[int, tuple[int, dict[str, torch.Tensor]]] = {}
        self._stashed: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        self._leaves: dict[tuple[int, int], dict[str, torch.Tensor]] = {}

    def stash(self, j: int, i: int) -> None:
        """Keep stage ``j``'s current weights as micro-batch ``i``'s version."""
        latest = self._latest.get(j)
        if latest is None or latest[0] != self.version[j]:
            copy = {n: p.detach().clone() for n, p in self.modules[j].named_parameters()}
            latest = self._latest[j] = (self.version[j], copy)
        self._stashed[(j, i)] = latest[1]

    def leaves(self, j: int, i: int) -> dict[str, torch.Tensor] | None:
        """Fresh leaf tensors over micro-batch ``i``'s stashed weights, or None if none."""
        stashed = self._stashed.get((j, i))
        if stashed is None:
            return None
        own = dict(self.modules[j].named_parameters())
        leaves = {n: t.detach().requires_grad_(own[n].requires_grad) for n, t in stashed.items()}
        self._leaves[(j, i)] = leaves
        return leaves

    def storages(self, j: int, i: int) -> list[torch.Tensor]:
        return list(self._stashed.get((j, i), {}).values())

    def take_grads(self, j: int, i: int) -> dict[str, torch.Tensor | None] | None:
        """Micro-batch ``i``'s gradients on its stashed leaves; the version is released."""
        self._stashed.pop((j, i), None)
        leaves = self._leaves.pop((j, i), None)
        return None if leaves is None else {n: t.grad for n, t in leaves.items()}

    def bump(self, j: int) -> None:
        """Stage ``j``'s weights changed (an UPDATE ran)."""
        self.version[j] += 1
