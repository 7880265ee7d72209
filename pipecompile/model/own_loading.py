"""Pretrained weights (``--weights``) loaded through the model's own state-dict loading, for a
model that has some: a module class with its own ``_load_from_state_dict`` (torchvision's
MNASNet reads its version there; a module that renamed a parameter maps the old name), or
loading hooks registered on a module (``register_load_state_dict_pre_hook`` and ``_post_``).

Such a model's tensors cannot be read one by one by name: what a tensor holds is what the
model's own loading makes of the file. So the whole file is read, its names put in the model's
naming (``NameMap``), and loaded with ``load_state_dict`` into a stand-in of the model on the
meta device (nothing of the user's model changes, and no second copy of its values is made),
with the state-dict metadata of the model as built (a safetensors file keeps no module
versions; it is taken to be saved by the modules' current versions, as ``model.state_dict()``
would be). The values the stand-in ends with are written into the stage files.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from pipecompile.errors import WeightsError
from pipecompile.model.pretrained_files import PretrainedFiles
from pipecompile.model.pretrained_names import NameMap

__all__ = ["Loaded", "load_through_model", "own_loading"]

_TORCH_NN = "torch.nn.modules."


@dataclass(frozen=True)
class Loaded:
    """What the model's own loading made of the pretrained weights: each loaded tensor by the
    model's name (in the model's dtype), the model's names it left without a value, and the
    file's names it did not use."""

    values: dict[str, torch.Tensor]
    missing: tuple[str, ...]
    unused: tuple[str, ...]


def own_loading(model: nn.Module) -> list[str]:
    """The module paths (``""`` the model itself) with state-dict loading of their own.

    torch.nn's own modules are not counted: their loading code (batch and instance norms')
    only upgrades a state dict of an older torch, which the current versions given here never
    ask for, so their weights are still read lazily, tensor by tensor."""
    found = []
    for path, module in model.named_modules(remove_duplicate=True):
        owner = next(c for c in type(module).__mro__ if "_load_from_state_dict" in vars(c))
        overridden = owner is not nn.Module and not owner.__module__.startswith(_TORCH_NN)
        hooked = bool(module._load_state_dict_pre_hooks or module._load_state_dict_post_hooks)
        if overridden or hooked:
            found.append(path)
    return found


def load_through_model(model: nn.Module, pretrained: PretrainedFiles, names: NameMap) -> Loaded:
    """Load every tensor of ``pretrained`` (its names mapped to the model's by ``names``)
    through the model's own ``load_state_dict``, into a meta-device stand-in of ``model``.

    Raises:
        WeightsError: a tensor has another shape than the model's, or the model's own
            loading code failed (both named, with the file).
    """
    stand_in = _meta_copy(model)
    own = stand_in.state_dict(keep_vars=True)
    state: OrderedDict[str, torch.Tensor] = OrderedDict(
        (_model_name(names, name), pretrained.tensor(name)) for name in sorted(pretrained.files)
    )
    state._metadata = getattr(own, "_metadata", OrderedDict())  # type: ignore[attr-defined]
    try:
        result = stand_in.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as err:
        raise WeightsError(
            f"{pretrained.path} does not fit the model: {_first_line(err)}; pass the "
            "pretrained weights of this model, built with their config"
        ) from None
    except Exception as err:  # the model's own loading code
        raise WeightsError(
            f"the model's own state-dict loading failed on {pretrained.path}: "
            f"{type(err).__name__}: {err}; check the weights were saved from this model"
        ) from None
    missing = set(result.missing_keys)
    loaded = stand_in.state_dict(keep_vars=True)
    values = {
        name: tensor.detach().to(own[name].dtype)
        for name, tensor in loaded.items()
        if name in own and name not in missing and not tensor.is_meta
    }
    return Loaded(values, tuple(sorted(missing)), tuple(sorted(result.unexpected_keys)))


def _meta_copy(model: nn.Module) -> nn.Module:
    """``model`` deep-copied with every parameter and buffer on the meta device (ties kept)."""
    memo: dict[int, object] = {}
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for tensor in table.values():
                if tensor is None or id(tensor) in memo:
                    continue
                meta = torch.empty_like(tensor, device="meta")
                if isinstance(tensor, nn.Parameter):
                    meta = nn.Parameter(meta, requires_grad=tensor.requires_grad)
                memo[id(tensor)] = meta
    return copy.deepcopy(model, memo)


def _model_name(names: NameMap, name: str) -> str:
    """The model's name of the pretrained tensor ``name`` (``NameMap`` read backwards)."""
    if names.added:
        return names.added + name
    return name.removeprefix(names.removed) if names.removed else name


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    detail = [line for line in lines if not line.startswith("Error(s) in loading")]
    return (detail or lines or [type(err).__name__])[0]
