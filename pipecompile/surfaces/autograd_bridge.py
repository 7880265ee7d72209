"""Let autograd flow through a compiled pipeline, for models used in a plain training loop.

``pipelined_forward`` runs the forward-only program and returns outputs that autograd can
differentiate. Their backward runs the whole training program once more with, per
micro-batch, the loss ``sum(output * grad_output)``: its gradients are exactly the
vector-Jacobian product autograd asks for (the forward is recomputed, as with
``--recompute always``, with the forward's own random numbers; buffers such as BatchNorm's
running statistics are restored so they are updated once). The stages' gradients are then
added to the original model's parameters, a tied parameter once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from pipecompile.errors import PipecompileError
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.state.step_options import StepOptions

__all__ = ["pipelined_forward"]


def pipelined_forward(pipe: Pipeline, model: nn.Module, inputs: dict[str, torch.Tensor]) -> Any:
    """The pipeline's output for ``inputs``, differentiable into ``model``'s parameters."""
    if pipe.asynchronous:
        raise PipecompileError(
            f"the {pipe.program.schedule} schedule updates weights inside its step, so it "
            "cannot run under loss.backward(); use a synchronous schedule, or "
            "pipeline.train_step"
        )
    with torch.no_grad():
        output = pipe(inputs)
    assert pipe.last is not None
    leaves, spec = pytree.tree_flatten(output)
    anchor = torch.zeros((), requires_grad=True)  # puts the outputs on autograd's tape
    context = _Context(pipe, model, inputs, leaves, pipe.last.rng_base)
    flat = _Bridge.apply(anchor, context, *leaves)
    return pytree.tree_unflatten(list(flat), spec)


class _Context:
    def __init__(
        self,
        pipe: Pipeline,
        model: nn.Module,
        inputs: dict[str, torch.Tensor],
        leaves: list[Any],
        rng_base: int,
    ) -> None:
        self.pipe, self.model, self.inputs, self.leaves = pipe, model, inputs, leaves
        self.rng_base = rng_base  # the backward recomputes with the forward's random numbers


class _Bridge(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, context: _Context, *leaves: Any) -> Any:
        ctx.context = context
        out = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in leaves)
        ctx.mark_non_differentiable(
            *[t for t in out if isinstance(t, torch.Tensor) and not t.is_floating_point()]
        )
        return out

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        context: _Context = ctx.context
        with torch.enable_grad():  # autograd runs a Function's backward without grad mode
            _backward(context, grads)
        return (None, None, *[None] * len(grads))


def _backward(context: _Context, grads: tuple[Any, ...]) -> None:
    pipe = context.pipe
    wanted = [
        g if g is not None else torch.zeros_like(t) if _float(t) else None
        for g, t in zip(grads, context.leaves)
    ]
    targets = tuple(g for g in wanted if g is not None)

    def vjp_loss(output: Any, *grad_out: torch.Tensor) -> torch.Tensor:
        outs = [t for t in pytree.tree_leaves(output) if _float(t)]
        return sum((o * g).sum() for o, g in zip(outs, grad_out))  # type: ignore[return-value]

    buffers = [
        {k: b.clone() for k, b in m.named_buffers()} if m is not None else {} for m in pipe.modules
    ]
    pipe.train_step(
        context.inputs,
        targets,
        vjp_loss,
        options=StepOptions(
            loss_scale=1.0,
            weigh_rows=False,  # the product with the output gradients is a sum, not a mean
            keep_grads=True,
            rng_base=context.rng_base,
        ),
    )
    with torch.no_grad():
        for module, saved in zip(pipe.modules, buffers):
            if module is not None:
                for name, value in module.named_buffers():
                    value.copy_(saved[name])
    _add_grads(pipe, context.model)


def _add_grads(pipe: Pipeline, model: nn.Module) -> None:
    """Add each stage's gradients to the model's parameters (a tied one once), then clear."""
    grads: dict[str, torch.Tensor] = {}
    for j, module in enumerate(pipe.modules):
        for name, grad in pipe.named_grads(j).items():
            grads.setdefault(name, grad)  # tied copies hold the same sum
        module.zero_grad(set_to_none=True)  # type: ignore[union-attr]
    done: set[int] = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if name in grads and id(param) not in done:
            done.add(id(param))
            param.grad = grads[name] if param.grad is None else param.grad + grads[name]


def _float(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()
