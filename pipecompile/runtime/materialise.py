"""Bring one stage's tensors into being where it runs, from the sources its manifest entry
names: values in ``stage_<j>.safetensors``, tensors of the pretrained weights (``--weights``)
read by original name (only this stage's, lazily), and initialisation recipes replayed with the
run's seed (``init.json``). The stage is built on the meta device first, so no memory is
spent on values that are overwritten."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import nn

from pipecompile.errors import EmitError, WeightsError
from pipecompile.files.names import MANIFEST
from pipecompile.ir.records.manifest import Manifest, StageEntry
from pipecompile.model.init_recipe import Step, replay, tensor_seed
from pipecompile.model.pretrained_files import PretrainedFiles, open_pretrained

__all__ = ["allocate", "fill_stage", "needs_materialising"]


def needs_materialising(entry: StageEntry) -> bool:
    """Whether a stage's tensors come from more than its own weights file."""
    return entry.weights is None or entry.from_pretrained is not None or entry.from_init is not None


def allocate(module: nn.Module, device: torch.device | str) -> None:
    """Give every meta tensor of ``module`` uninitialised memory on ``device``, keeping
    tied tensors tied (``nn.Module.to_empty`` would untie them)."""
    made: dict[int, torch.Tensor] = {}
    for sub in module.modules():
        for table in (sub._parameters, sub._buffers):
            for name, tensor in table.items():
                if tensor is None or not tensor.is_meta:
                    continue
                if id(tensor) not in made:
                    empty = torch.empty_like(tensor, device=device)
                    if isinstance(tensor, nn.Parameter):
                        empty = nn.Parameter(empty, requires_grad=tensor.requires_grad)
                    made[id(tensor)] = empty
                table[name] = made[id(tensor)]  # type: ignore[assignment]


def fill_stage(
    stage: nn.Module,
    entry: StageEntry,
    directory: Path,
    manifest: Manifest,
    label: str,
) -> None:
    """Write every tensor of ``stage`` from the sources ``entry`` names.

    Raises:
        WeightsError: the pretrained weights are missing, damaged or lack a tensor.
        EmitError: the stage's weights file is damaged, or a tensor has no source (an
            edited manifest or stage file).
    """
    state = stage.state_dict(keep_vars=True)
    filled: set[int] = set()
    with torch.no_grad():
        if entry.weights:
            for name, value in _stage_file(directory / entry.weights, label).items():
                _write(state, name, value, label, filled)
        pretrained_names = entry.from_pretrained or {}
        if pretrained_names:
            pretrained = _pretrained(directory, manifest)
            for name, key in pretrained_names.items():
                if key not in pretrained.files:
                    raise WeightsError(
                        f"{label} needs {key}, which {pretrained.path} no longer holds; point "
                        "the compile at the pretrained weights again (--weights) and recompile"
                    )
                _write(state, name, pretrained.tensor(key), label, filled)
        init_names = entry.from_init or {}
        if init_names:
            recipe = _recipe(directory, manifest)
            for name, original in init_names.items():
                value = torch.empty(state[name].shape, dtype=state[name].dtype, device="cpu")
                steps = [Step.from_json(s) for s in recipe["tensors"][original]]
                replay(value, steps, recipe["values"], tensor_seed(recipe["seed"], original))
                _write(state, name, value, label, filled)
    missing = [n for n, t in state.items() if id(t) not in filled]
    if missing:
        raise EmitError(
            f"{label} of {directory}: no source for {missing[0]}"
            f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; recompile"
        )


def _write(
    state: dict[str, torch.Tensor], name: str, value: torch.Tensor, label: str, filled: set[int]
) -> None:
    target = state.get(name)
    if target is None:
        return
    if tuple(value.shape) != tuple(target.shape):
        raise WeightsError(
            f"{label}: {name} is {list(value.shape)} in its source but {list(target.shape)} in "
            "the stage; recompile against these pretrained weights"
        )
    target.copy_(value.to(target.dtype))
    filled.add(id(target))


def _stage_file(path: Path, label: str) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise EmitError(f"{label}: weights {path} cannot be read ({err}); recompile") from None


def _pretrained(directory: Path, manifest: Manifest) -> PretrainedFiles:
    raw = manifest.weights and manifest.weights.pretrained
    if not raw:
        raise EmitError(f"{directory}/{MANIFEST} names no pretrained weights; recompile")
    try:
        return _open_cached(str((Path(directory) / raw).resolve()))
    except WeightsError as err:
        raise WeightsError(
            f"{directory} was compiled to read its weights from {raw} (relative to it), and "
            f"that fails: {err}"
        ) from None


@cache
def _open_cached(path: str) -> PretrainedFiles:
    return open_pretrained(Path(path))


def _recipe(directory: Path, manifest: Manifest) -> dict[str, Any]:
    weights = manifest.weights
    try:
        if weights is None or weights.init is None:
            raise KeyError("init")
        recipe = json.loads((Path(directory) / weights.init).read_text())
    except (KeyError, OSError, json.JSONDecodeError) as err:
        raise EmitError(
            f"{directory}: the initialisation recipes cannot be read ({err}); recompile"
        ) from None
    constants = weights.init_constants
    recipe["values"] = {}
    if constants:
        with safe_open(str(Path(directory) / constants), framework="pt") as f:
            recipe["values"] = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    return recipe
