"""Which torch.nn modules stay whole in a stage: those rebuilt exactly from ``torch.nn.<repr>``."""

from __future__ import annotations

import functools

import torch
from torch import nn

__all__ = ["leaf_constructor", "is_rebuildable_leaf"]


def leaf_constructor(module: nn.Module) -> str | None:
    """Source that rebuilds ``module`` (same class, hyper-parameters and state shapes), or None.

    Only childless classes of the ``torch.nn`` namespace qualify, and only when evaluating
    ``torch.nn.<repr(module)>`` gives a module with the same repr and state_dict shapes. Weights
    are loaded separately; a non-default dtype is restored with ``.to(dtype)``.
    """
    cls = type(module)
    if getattr(nn, cls.__name__, None) is not cls or next(module.children(), None) is not None:
        return None
    source = "torch.nn." + repr(module)
    if "\n" in source or not _rebuilds(source, module):
        return None
    dtypes = {t.dtype for t in module.state_dict().values() if t.is_floating_point()}
    if len(dtypes) > 1:
        return None
    if dtypes and (dtype := dtypes.pop()) != torch.get_default_dtype():
        source += f".to({dtype})"
    return source


def is_rebuildable_leaf(module: nn.Module) -> bool:
    return leaf_constructor(module) is not None


def _rebuilds(source: str, module: nn.Module) -> bool:
    try:
        rebuilt = _evaluate(source)
    except Exception:
        return False
    if repr(rebuilt) != repr(module):
        return False
    want = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in rebuilt.state_dict().items()}
    return want == have


@functools.lru_cache(maxsize=512)
def _evaluate(source: str) -> nn.Module:
    with torch.device("meta"):
        return eval(source, {"torch": torch})  # noqa: S307 - source is repr of a torch.nn module
