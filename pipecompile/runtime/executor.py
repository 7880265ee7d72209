"""The handlers of one training or inference step: one short method per instruction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from pipecompile.instr import Instr
from pipecompile.runtime.interpreter import Handler
from pipecompile.runtime.layout import Layout
from pipecompile.runtime.local_backend import MISSING, LocalBackend

__all__ = ["StepExecutor"]

LossFn = Callable[..., torch.Tensor]


class StepExecutor:
    """State of one mini-batch in flight: stashed activations, messages, gradients, losses.

    Values crossing a stage boundary are detached leaves in the consumer, so each stage's
    backward stops at its inputs and their gradients travel back explicitly (SEND_B/RECV_B).
    """

    def __init__(
        self,
        layout: Layout,
        modules: Sequence[nn.Module],
        backend: LocalBackend,
        microbatches: Sequence[dict[str, torch.Tensor]],
        targets: Sequence[tuple[torch.Tensor, ...]] | None = None,
        loss_fn: LossFn | None = None,
        optimizers: Sequence[torch.optim.Optimizer] | None = None,
        on_step: Callable[[int], None] | None = None,
    ) -> None:
        self.layout, self.modules, self.backend = layout, modules, backend
        self.microbatches, self.targets, self.loss_fn = microbatches, targets, loss_fn
        self.optimizers, self.on_step = optimizers, on_step
        self.received: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        self.stash: dict[tuple[int, int], tuple[list[Any], tuple[Any, ...]]] = {}
        self.out_grads: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        self.in_grads: dict[tuple[int, int], dict[str, torch.Tensor | None]] = {}
        self.losses: dict[int, torch.Tensor] = {}
        self.to_send: dict[tuple[int, int], tuple[Any, ...]] = {}
        self.results: dict[int, tuple[torch.Tensor, ...]] = {}

    def handlers(self) -> dict[str, Handler]:
        return {
            "F": self.forward,
            "B": self.backward,
            "SEND_F": self.send_activations,
            "RECV_F": self.recv_activations,
            "SEND_B": self.send_gradients,
            "RECV_B": self.recv_gradients,
            "ALLREDUCE_TIED": self.all_reduce_tied,
            "STEP": self.step,
        }

    def forward(self, instr: Instr) -> bool:
        j, i = instr.stage, instr.microbatch
        assert i is not None
        args = [self._input(j, i, name) for name in self.layout.inputs[j]]
        training = self.loss_fn is not None
        with torch.set_grad_enabled(training):
            outs = tuple(self.modules[j](*args))
        if training:
            self.stash[(j, i)] = (args, outs)
        if any(self.layout.remote(j, dst) for _, dst in self.layout.out_edges[j]):
            self.to_send[(j, i)] = outs
        for name, value in zip(self.layout.outputs[j], outs):
            for value_name, dst in self.layout.out_edges[j]:
                if value_name == name and not self.layout.remote(j, dst):
                    self.received.setdefault((dst, i), {})[name] = value
        if j == self.layout.last:
            self.results[i] = outs
            if training:
                self.losses[i] = self._loss(outs, i)
        return True

    def backward(self, instr: Instr) -> bool:
        j, i = instr.stage, instr.microbatch
        assert i is not None
        args, outs = self.stash.pop((j, i))
        if j == self.layout.last:
            self.losses[i].backward()
        else:
            grads = self.out_grads.pop((j, i), {})
            pairs = [
                (out, grads[name])
                for name, out in zip(self.layout.outputs[j], outs)
                if grads.get(name) is not None and out.requires_grad
            ]
            if pairs:
                torch.autograd.backward([p[0] for p in pairs], [p[1] for p in pairs])
        if j > 0:
            grads_in = {
                name: (a.grad if isinstance(a, torch.Tensor) else None)
                for name, a in zip(self.layout.inputs[j], args)
            }
            for name, src in self.layout.in_edges[j]:
                if not self.layout.remote(src, j):
                    self._add_out_grad(src, i, name, grads_in[name])
            self.in_grads[(j, i)] = grads_in
        return True

    def send_activations(self, instr: Instr) -> bool:
        j, i = instr.stage, instr.microbatch
        outs = dict(zip(self.layout.outputs[j], self.to_send.pop((j, i))))  # type: ignore[arg-type]
        for name, dst in self.layout.out_edges[j]:
            if self.layout.remote(j, dst):
                self.backend.send(("F", j, dst, i, name), outs[name].detach())
        return True

    def recv_activations(self, instr: Instr) -> bool:
        j, i = instr.stage, instr.microbatch
        keys = [("F", s, j, i, n) for n, s in self.layout.in_edges[j] if self.layout.remote(s, j)]
        if not self.backend.ready(keys):
            return False
        box = self.received.setdefault((j, i), {})  # type: ignore[arg-type]
        for key in keys:
            box[key[4]] = self.backend.recv(key)
        return True

    def send_gradients(self, instr: Instr) -> bool:
        j, i = instr.stage, instr.microbatch
        grads = self.in_grads.pop((j, i))  # type: ignore[arg-type]
        for name, src in self.layout.in_edges[j]:
            if self.layout.remote(src, j):
                self.backend.send(("B", src, j, i, name), grads.get(name))
        return True

    def recv_gradients(self, instr: Instr) -> bool:
        j, i = instr.stage, instr.microbatch
        assert i is not None
        keys = [("B", j, d, i, n) for n, d in self.layout.out_edges[j] if self.layout.remote(j, d)]
        if not self.backend.ready(keys):
            return False
        for key in keys:
            self._add_out_grad(j, i, key[4], self.backend.recv(key))
        return True

    def all_reduce_tied(self, instr: Instr) -> bool:
        j = instr.stage
        params = dict(self.modules[j].named_parameters(remove_duplicate=False))
        mine = [(key, held) for key, held in self.layout.ties.items() if j in held]
        results = []
        for key, held in mine:
            param = params[held[j]]
            grad = param.grad if param.grad is not None else torch.zeros_like(param)
            results.append(self.backend.all_reduce(key, j, sorted(held), grad))
        if any(r is MISSING for r in results):
            return False
        for (_, held), total in zip(mine, results):
            assert isinstance(total, torch.Tensor)
            params[held[j]].grad = total.clone()
        return True

    def step(self, instr: Instr) -> bool:
        if self.on_step is not None:
            self.on_step(instr.stage)
        if self.optimizers is not None:
            self.optimizers[instr.stage].step()
            self.optimizers[instr.stage].zero_grad(set_to_none=True)
        return True

    def _input(self, j: int, i: int, name: str) -> Any:
        if j == 0:
            return self.microbatches[i][name]
        value = self.received[(j, i)].pop(name)
        if isinstance(value, torch.Tensor):
            value = value.detach().requires_grad_(
                value.is_floating_point() and self.loss_fn is not None
            )
        return value

    def _loss(self, outs: tuple[Any, ...], i: int) -> torch.Tensor:
        assert self.loss_fn is not None and self.targets is not None
        output = pytree.tree_unflatten(list(outs), self.layout.output_spec)
        loss = self.loss_fn(output, *self.targets[i])
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise TypeError(f"loss_fn must return a scalar tensor, got {type(loss).__name__}")
        return loss / len(self.microbatches)

    def _add_out_grad(self, j: int, i: int, name: str, grad: torch.Tensor | None) -> None:
        if grad is None:
            return
        box = self.out_grads.setdefault((j, i), {})
        box[name] = grad if name not in box else box[name] + grad
