"""``@pipecompile.pipeline(stages=4, ...)``: an nn.Module class whose instances compile
themselves on their first call and then run every call through the pipeline.

Example:
    >>> @pipecompile.pipeline(stages=4, microbatches=8)              # doctest: +SKIP
    ... class GPT(nn.Module): ...
    >>> model = GPT(config)
    >>> optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    >>> for x, y in data:
    ...     loss = loss_fn(model(x), y)   # the first call compiles
    ...     loss.backward(); optimizer.step(); optimizer.zero_grad()

The instance stays an ordinary module: its parameters are the ones the optimizer sees and
``state_dict`` is unchanged. Each call copies them into the stages, runs the schedule's
forward, and (with gradients enabled) lets ``loss.backward()`` run the schedule's backward
and add the gradients to those parameters (see ``autograd_bridge``). ``model.pipeline`` is
the ``CompiledPipeline`` once compiled; ``model.recompile()`` drops it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils import _pytree as pytree

from pipecompile.model.own_forward import TRACING
from pipecompile.surfaces.api import CompiledPipeline, compile

__all__ = ["pipeline"]

M = TypeVar("M", bound=type)


def pipeline(*, stages: int, **options: Any) -> Callable[[M], M]:
    """Class decorator: instances compile to ``stages`` stages (with ``options`` as for
    ``pipecompile.compile``) on their first call with real inputs."""

    def decorate(cls: M) -> M:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(f"@pipecompile.pipeline decorates an nn.Module class, not {cls!r}")
        return _pipelined_class(cls, stages, options)  # type: ignore[return-value]

    return decorate


def _pipelined_class(cls: type[nn.Module], stages: int, options: dict[str, Any]) -> type:
    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if TRACING.get():
            return cls.forward(self, *args, **kwargs)
        pipe = self.__dict__.get("_pipecompile_pipe")
        if pipe is None:
            pipe = _compile(self, args, kwargs, stages, options)
        return _run(self, pipe, args, kwargs)

    def recompile(self: nn.Module) -> None:
        """Forget the compiled pipeline; the next call compiles again."""
        self.__dict__.pop("_pipecompile_pipe", None)

    def get_pipeline(self: nn.Module) -> CompiledPipeline | None:
        return self.__dict__.get("_pipecompile_pipe")

    namespace = {
        "forward": functools.wraps(cls.forward)(forward),  # keeps forward()'s signature
        "recompile": recompile,
        "pipeline": property(get_pipeline),
        "__doc__": cls.__doc__,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
    }
    return type(cls.__name__, (cls,), namespace)


def _compile(
    model: nn.Module, args: tuple, kwargs: dict[str, Any], stages: int, options: dict[str, Any]
) -> CompiledPipeline:
    pipe = compile(model, _named(model, args, kwargs), stages=stages, **options)
    model.__dict__["_pipecompile_pipe"] = pipe
    return pipe


def _run(model: nn.Module, pipe: CompiledPipeline, args: tuple, kwargs: dict[str, Any]) -> Any:
    from pipecompile.surfaces.autograd_bridge import pipelined_forward

    pipe.load_state_dict(model.state_dict())
    for stage in pipe.stages:
        stage.train(model.training)
    inputs = _named(model, args, kwargs)
    differentiable = torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters())
    if differentiable:
        output = pipelined_forward(pipe.pipeline, model, inputs)
    else:
        output = pipe(**inputs)
    _copy_buffers_back(model, pipe)
    return output


def _named(model: nn.Module, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = inspect.signature(model.forward).bind_partial(*args, **kwargs)
    return dict(bound.arguments)


def _copy_buffers_back(model: nn.Module, pipe: CompiledPipeline) -> None:
    """Buffers the stages changed (BatchNorm statistics) go back to the model."""
    state = pipe.state_dict()
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name in state and pytree.tree_leaves(buffer):
                buffer.copy_(state[name])
