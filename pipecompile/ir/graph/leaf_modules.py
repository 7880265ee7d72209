"""Which torch.nn modules stay whole in a stage: those rebuilt exactly from their constructor.

A leaf module is written into a stage file as a constructor call carrying every argument of
its ``__init__``, read back from the module's attributes (``AvgPool2d(kernel_size=3, stride=1,
padding=1, ceil_mode=False, count_include_pad=False, divisor_override=None)``), never from its
printed form, which leaves settings out. The call is accepted only when the module it builds
has exactly the original's state: every attribute of the instance, its parameters and buffers
(tensors by shape). Anything else - a third-party class, a module with hooks,
an attribute set after construction - is traced through instead, op by op.
"""

from __future__ import annotations

import functools
import inspect
import math
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

__all__ = ["leaf_constructor", "is_rebuildable_leaf", "constructor_source"]

# nn.Module's own bookkeeping (hook tables, parameter and buffer dicts, the training flag):
# compared separately or not part of what a module computes.
_MODULE_KEYS = frozenset(vars(nn.Module()))
_MISSING = object()
_HOOKS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
)


def leaf_constructor(module: nn.Module) -> str | None:
    """Source that rebuilds ``module`` with the same class and state, or None.

    Only childless classes of the ``torch.nn`` namespace without hooks qualify, and only when
    the constructor call, evaluated, gives a module whose whole state equals the original's.
    Weights are loaded separately; a non-default dtype is restored with ``.to(dtype)``.

    Example:
        >>> leaf_constructor(nn.AvgPool2d(3, 1, 1, count_include_pad=False))
        'torch.nn.AvgPool2d(kernel_size=3, stride=1, padding=1, count_include_pad=False)'
    """
    cls = type(module)
    if getattr(nn, cls.__name__, None) is not cls or next(module.children(), None) is not None:
        return None
    if any(getattr(module, hooks) for hooks in _HOOKS):
        return None
    source = next((s for s in constructor_source(module) if _rebuilds(s, module)), None)
    if source is None:
        return None
    dtypes = {t.dtype for t in module.state_dict().values() if t.is_floating_point()}
    if len(dtypes) > 1:
        return None
    if dtypes and (dtype := dtypes.pop()) != torch.get_default_dtype():
        source += f".to({dtype})"
    return source


def is_rebuildable_leaf(module: nn.Module) -> bool:
    return leaf_constructor(module) is not None


def constructor_source(module: nn.Module) -> Iterator[str]:
    """Candidate calls ``torch.nn.<Class>(name=value, ...)`` for ``module``, each argument of
    the constructor read from the attribute of the same name (those equal to the default left
    out). A class whose ``__init__`` takes
    only ``*args, **kwargs`` (``nn.LSTM``) is described by its base's signature, also tried
    without the base's first argument, which the subclass fixes itself (``mode``)."""
    cls = type(module)
    params, inherited = _signature(cls)
    if params is None:
        return
    args = _arguments(module, params)
    if args is None:
        return
    yield _call(cls, args)
    if inherited and args:
        yield _call(cls, dict(list(args.items())[1:]))


def _signature(cls: type) -> tuple[list[inspect.Parameter] | None, bool]:
    for k, klass in enumerate(cls.__mro__):
        if klass is nn.Module or "__init__" not in vars(klass):
            continue
        try:
            found = list(inspect.signature(klass.__init__).parameters.values())[1:]
        except (TypeError, ValueError):
            return None, False
        named = [p for p in found if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if named or len(named) == len(found):
            return named, k > 0
    return [], False


def _arguments(module: nn.Module, params: list[inspect.Parameter]) -> dict[str, str] | None:
    """Each constructor argument's literal, or None when one cannot be written."""
    args: dict[str, str] = {}
    for p in params:
        if p.name in ("device", "dtype") or p.name.startswith("_"):
            continue  # placement, and private hand-over of ready tensors (Embedding's _weight)
        value = _attribute(module, p.name)
        if value is _MISSING:
            if p.default is inspect.Parameter.empty:
                return None
            continue  # not kept as an attribute: the state comparison decides
        if isinstance(p.default, bool) and (value is None or isinstance(value, torch.Tensor)):
            value = value is not None  # bias=True stored as the bias Parameter (or None)
        text = _literal(value)
        if text is None:
            return None
        if p.default is inspect.Parameter.empty or text != _literal(p.default):
            args[p.name] = text  # defaults left out, for a readable stage file
    return args


def _attribute(module: nn.Module, name: str) -> Any:
    """The instance's own attribute, parameter or buffer ``name`` (read from its tables: while
    torch.fx traces, ``getattr`` on a module gives proxies for its parameters)."""
    for table in (vars(module), module._parameters, module._buffers):
        if name in table:
            return table[name]
    return _MISSING


def _call(cls: type, args: dict[str, str]) -> str:
    return f"torch.nn.{cls.__name__}({', '.join(f'{k}={v}' for k, v in args.items())})"


def _literal(value: Any) -> str | None:
    """Python source evaluating to ``value`` with only ``torch`` in scope, or None."""
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f'float("{value}")'
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, torch.Tensor):  # a buffer handed to the constructor (a loss's weight)
        return f"torch.zeros({tuple(value.shape)}, dtype={value.dtype})"
    if isinstance(value, (tuple, list)):
        items = [_literal(v) for v in value]
        if any(i is None for i in items):
            return None
        inner = ", ".join(items) + ("," if isinstance(value, tuple) and len(items) == 1 else "")
        text = f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
        return f"torch.Size({text})" if isinstance(value, torch.Size) else text
    return None


def _rebuilds(source: str, module: nn.Module) -> bool:
    try:
        rebuilt = _evaluate(source)
    except Exception:
        return False
    return type(rebuilt) is type(module) and _state(rebuilt) == _state(module)


def _state(module: nn.Module) -> str:
    """Everything an instance holds that can change what it computes, as comparable text."""
    own = {k: v for k, v in vars(module).items() if k not in _MODULE_KEYS}
    tensors = {
        "parameters": {k: _plain(v) for k, v in module._parameters.items()},
        "buffers": {k: _plain(v) for k, v in module._buffers.items()},
        "non_persistent": sorted(module._non_persistent_buffers_set),
    }
    return repr(sorted((k, _plain(v)) for k, v in {**own, **tensors}.items()))


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):  # dtype is restored by .to(), requires_grad by the stage
        return type(value).__name__, tuple(value.shape)
    if isinstance(value, (list, tuple)):
        return type(value).__name__, [_plain(v) for v in value]
    if isinstance(value, dict):
        return sorted((k, _plain(v)) for k, v in value.items())
    if isinstance(value, weakref.ref):  # nn.RNNBase's references to its own weights
        return "weakref"
    return value


@functools.lru_cache(maxsize=512)
def _evaluate(source: str) -> nn.Module:
    with torch.device("meta"):
        return eval(source, {"torch": torch})  # noqa: S307 - built from a module's own state
