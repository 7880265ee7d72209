"""Initialisation recipes: how each tensor of a model built on the ``meta`` device comes into
being, recorded at compile time and replayed per stage where the stage runs.

A meta model has shapes but no values. Its own initialisation code still runs on it: the
recorder runs, on the meta model, under a dispatch mode that writes down every in-place op
applied to one of its tensors (``uniform_``, ``normal_``, ``fill_``, ``zero_``, ``mul_``, ...),
with the views it went through (``weight[padding_idx].fill_(0)``) and its arguments; a real
tensor written into it (``inv_freq.copy_(computed)``) is kept as a constant. Replaying the
steps on an empty tensor of the same shape gives the values, with a random generator seeded
from the run's seed and the tensor's original name, so every stage count gives the same
weights. The initialisation that runs, in this order (later ones override):

1. ``reset_parameters()`` of every submodule that has one (torch.nn layers), as their
   constructors did;
2. the model's own ``_init_weights(module)`` for every submodule, if the model has one (the
   Hugging Face convention);
3. the model file's ``init_weights(module)`` for every submodule, if the file defines one.

A tensor no step wrote (a ``torch.ones`` parameter or an ``arange`` buffer made on meta), or
one written from another meta tensor, has no recipe: it must come from the pretrained weights
(``--weights``).
"""

from __future__ import annotations

import hashlib
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from pipecompile.errors import ModelFileError, PipecompileError

__all__ = ["Recipe", "Step", "record_init", "replay", "tensor_seed", "is_meta_model"]

InitHook = Callable[[nn.Module], Any]


@dataclass(frozen=True)
class Step:
    """One in-place op on a tensor (through ``views``, each ``(op, args)``); ``args`` and
    ``kwargs`` hold scalars, lists and ``{"const": key}`` references to saved tensors."""

    op: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    views: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "args": list(self.args),
            "kwargs": self.kwargs,
            "views": [[op, list(args)] for op, args in self.views],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Step:
        views = tuple((str(op), tuple(args)) for op, args in raw.get("views", []))
        return cls(str(raw["op"]), tuple(raw["args"]), dict(raw["kwargs"]), views)


@dataclass
class Recipe:
    """Steps per original tensor name, the constants they copy from, and the names that
    could not be recorded (with why)."""

    steps: dict[str, list[Step]] = field(default_factory=dict)
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    unrecorded: dict[str, str] = field(default_factory=dict)
    methods: list[str] = field(default_factory=list)

    def covers(self, name: str) -> bool:
        return name in self.steps and name not in self.unrecorded


def is_meta_model(model: nn.Module) -> bool:
    """Whether any parameter or buffer of ``model`` is on the meta device."""
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def record_init(model: nn.Module, hook: InitHook | None = None) -> Recipe:
    """Run the model's initialisation (see the module docstring) on its meta tensors and
    record the steps per tensor name. Real tensors are left alone."""
    names: dict[int, str] = {}
    real: set[int] = set()
    for name, tensor in [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]:
        if tensor.is_meta:
            names.setdefault(id(tensor), name)
        else:
            real.add(id(tensor))
    recorder = _Recorder(names, real)
    recipe = recorder.recipe
    with recorder, torch.no_grad():
        resettable = [m for m in model.modules() if callable(getattr(m, "reset_parameters", None))]
        if resettable:
            recipe.methods.append("reset_parameters")
        paths = {id(m): path or "the model" for path, m in model.named_modules()}
        for module in resettable:
            _initialise(
                f"{type(module).__name__}.reset_parameters()",
                module.reset_parameters,
                module,
                paths,
            )
        own = getattr(model, "_init_weights", None)
        if callable(own):
            recipe.methods.append(f"{type(model).__name__}._init_weights")
            for module in model.modules():
                _initialise(
                    f"{type(model).__name__}._init_weights(module)",
                    lambda m=module: own(m),
                    module,
                    paths,
                )
        if hook is not None:
            recipe.methods.append("init_weights (model file)")
            for module in model.modules():
                _initialise(
                    "the model file's init_weights(module)", lambda m=module: hook(m), module, paths
                )
    for name in set(names.values()) - set(recipe.steps) - set(recipe.unrecorded):
        recipe.unrecorded[name] = "no initialisation step wrote it"
    return recipe


def _initialise(
    what: str, call: Callable[[], object], module: nn.Module, paths: dict[int, str]
) -> None:
    """``call()``; a failure in the user's code becomes one error naming it, the module and
    the line."""
    try:
        call()
    except PipecompileError:
        raise
    except Exception as err:
        frame = traceback.extract_tb(err.__traceback__)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        raise ModelFileError(
            f"{what} failed on {paths.get(id(module), '?')} ({type(module).__name__}) at "
            f"{where}: {type(err).__name__}: {err}; fix it, or pass --weights with a "
            "pretrained weights holding every tensor"
        ) from None


def tensor_seed(seed: int, name: str) -> int:
    """The generator seed of tensor ``name`` under run seed ``seed`` (stable across runs,
    machines and stage counts)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def replay(
    tensor: torch.Tensor, steps: list[Step], constants: dict[str, torch.Tensor], seed: int
) -> None:
    """Write ``steps`` into ``tensor`` (on the CPU: the same values on every device)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for step in steps:
            target = tensor
            for op, args in step.views:
                target = _op(op)(target, *(_value(a, constants) for a in args))
            args = [_value(a, constants) for a in step.args]
            kwargs = {k: _value(v, constants) for k, v in step.kwargs.items()}
            func = _op(step.op)
            if any(a.name == "generator" for a in func._schema.arguments):
                kwargs["generator"] = generator
            func(target, *args, **kwargs)


class _Recorder(TorchDispatchMode):
    """Writes down in-place ops on the tracked meta tensors (and views of them)."""

    def __init__(self, names: dict[int, str], real: set[int]) -> None:
        super().__init__()
        self.names, self.real = names, real
        self.views: dict[int, tuple[str, tuple[tuple[str, tuple[Any, ...]], ...]]] = {}
        self.alive: list[torch.Tensor] = []  # keeps view ids from being reused
        self.recipe = Recipe()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if args and id(args[0]) in self.real and _writes(func):
            return args[0]  # a real tensor of a partly meta model keeps its values
        out = func(*args, **kwargs)
        target = self._tracked(args[0]) if args else None
        if target is None:
            return out
        name, views = target
        first = func._schema.arguments[0] if func._schema.arguments else None
        if _writes(func):
            self._record(name, views, func, args[1:], kwargs)
        elif first is not None and first.alias_info is not None and isinstance(out, torch.Tensor):
            self.views[id(out)] = (name, (*views, (str(func), self._plain(name, args[1:]))))
            self.alive.append(out)
        return out

    def _tracked(self, value: object) -> tuple[str, tuple[tuple[str, tuple[Any, ...]], ...]] | None:
        if not isinstance(value, torch.Tensor):
            return None
        if id(value) in self.names:
            return self.names[id(value)], ()
        return self.views.get(id(value))

    def _record(
        self,
        name: str,
        views: tuple[tuple[str, tuple[Any, ...]], ...],
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        kept = {k: v for k, v in kwargs.items() if k != "generator"}
        try:
            step = Step(str(func), self._plain(name, args), self._plain(name, kept), views)
        except _Unrecordable as err:
            self.recipe.unrecorded[name] = str(err)
            return
        self.recipe.steps.setdefault(name, []).append(step)

    def _plain(self, name: str, value: Any) -> Any:
        """``value`` as JSON: scalars and lists as they are, a real tensor as a constant."""
        if isinstance(value, dict):
            return {k: self._plain(name, v) for k, v in value.items()}
        if isinstance(value, (tuple, list)):
            return [self._plain(name, v) for v in value]
        if isinstance(value, torch.Tensor):
            if value.is_meta:
                raise _Unrecordable("written from another tensor without values (meta)")
            key = f"{name}#{len(self.recipe.constants)}"
            self.recipe.constants[key] = value.detach().to("cpu").clone().contiguous()
            return {"const": key}
        if isinstance(value, torch.dtype):
            return {"dtype": str(value).removeprefix("torch.")}
        if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
            return None  # replayed on the CPU, strided, contiguous
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise _Unrecordable(f"an argument of type {type(value).__name__}")


class _Unrecordable(Exception):
    pass


def _writes(func: Any) -> bool:
    """Whether ``func`` writes its first argument in place."""
    args = func._schema.arguments
    alias = args[0].alias_info if args else None
    return alias is not None and alias.is_write


def _op(name: str) -> Any:
    """``"aten.normal_.default"`` -> the op."""
    namespace, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)


def _value(raw: Any, constants: dict[str, torch.Tensor]) -> Any:
    if isinstance(raw, dict) and "const" in raw:
        return constants[raw["const"]]
    if isinstance(raw, dict) and "dtype" in raw:
        return getattr(torch, raw["dtype"])
    if isinstance(raw, list):
        return [_value(v, constants) for v in raw]
    return raw
