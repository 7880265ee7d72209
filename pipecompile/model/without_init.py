"""Build a module that a state dict fills whole, without running its initialisers.

A stage module's constructor draws every weight at random (a Linear's Kaiming draw, an
Embedding's normal one) only for the weights file to overwrite it: for AlexNet's 61M
parameters that is longer than the compile's own passes. Built on the meta device and given
copies of the state's tensors instead, the module costs one copy of its weights. Copies, not
the tensors themselves: a safetensors file's tensors sit at 8-byte offsets of its buffer, and
oneDNN's kernels take other paths on memory so placed, which round otherwise (on one thread,
timm's ghostnet then differed from eager by 1e4 noise floors); torch's allocator aligns.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils import _pytree as pytree

__all__ = ["build_loaded", "fit"]


def build_loaded(build: Callable[[], nn.Module], state: dict[str, torch.Tensor]) -> nn.Module:
    """``build()`` holding ``state`` (strictly: the same names and shapes, where a tied tensor
    may be there under one of its names).

    Built on the meta device and given copies of ``state``'s tensors (``assign=True``) when
    they are all it holds; built as usual and loaded by copy where that would leave a tensor
    on the meta device (a non-persistent buffer, a tensor kept as a plain attribute) or break
    a tie (one parameter under two names).
    """
    with torch.device("meta"):
        module = build()
    if set(module.state_dict()) == set(state) and not _shared(module):
        # copies in memory of torch's own: a file's tensors can sit at any offset of it, and
        # kernels (oneDNN's) take other paths, and round otherwise, on memory so placed
        own = {name: tensor.clone() for name, tensor in state.items()}
        module.load_state_dict(own, strict=True, assign=True)
        if not _meta_left(module):
            return module
    module = build()
    _load_copy(module, state)
    return module


def _load_copy(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load ``state`` into ``module`` by copy; a tied tensor may be in ``state`` under one of its
    names only (as safetensors writes it).

    Raises:
        RuntimeError: naming the tensors ``state`` lacks or has beyond ``module``'s.
    """
    lacking, unexpected = fit(module, set(state))
    if lacking or unexpected:
        raise RuntimeError(
            f"the state does not fit {type(module).__name__}: missing {lacking}, "
            f"unexpected {unexpected}"
        )
    module.load_state_dict(state, strict=False)


def fit(module: nn.Module, names: set[str]) -> tuple[list[str], list[str]]:
    """The tensors of ``module`` a state holding ``names`` lacks (a tied tensor may be there
    under one of its names, as safetensors writes it), and the names ``module`` does not have;
    both sorted."""
    groups: dict[int, set[str]] = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), set()).add(name)
    missing = sorted(n for group in groups.values() if not group & names for n in group)
    return missing, sorted(names - {n for group in groups.values() for n in group})


def _shared(module: nn.Module) -> bool:
    """Whether some tensor of ``module`` is held under two names."""
    tensors = [t for _, t in module.named_parameters(remove_duplicate=False)]
    tensors += [t for _, t in module.named_buffers(remove_duplicate=False)]
    return len({id(t) for t in tensors}) != len(tensors)


def _meta_left(module: nn.Module) -> bool:
    """Whether a parameter, buffer or tensor attribute of ``module`` is still on meta."""
    for sub in module.modules():
        held = pytree.tree_leaves({k: v for k, v in vars(sub).items() if k != "_modules"})
        if any(isinstance(t, torch.Tensor) and t.is_meta for t in held):
            return True
    return False
