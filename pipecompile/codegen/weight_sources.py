"""Where each stage's tensors come from: values written into ``stage_<j>.safetensors`` (a real
model), the pretrained weights read by original name (``--weights``), or an initialisation
recipe replayed where the stage runs (a model on the ``meta`` device).

A tensor found in the pretrained weights under one of its original names (with a prefix added or
removed, ``pretrained_names``) is read from there; every saved tensor of the model must be,
unless ``allow_missing``. Otherwise a real tensor's value is written into the stage file; else a
meta tensor needs a recipe. A meta tensor with neither is an error naming it, its stage and
what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from pipecompile.errors import WeightsError
from pipecompile.ir.graph.stage_graph import Stage
from pipecompile.model.init_recipe import Recipe, is_meta_model, record_init
from pipecompile.model.own_loading import Loaded, load_through_model, own_loading
from pipecompile.model.pretrained_files import PretrainedFiles, open_pretrained
from pipecompile.model.pretrained_names import Coverage, NameMap, coverage, match_names

__all__ = ["StageSources", "WeightPlan", "stage_sources", "unused_in_pretrained", "weight_plan"]


@dataclass(frozen=True)
class WeightPlan:
    """The weights a compile was given: the pretrained weights, the meta tensors' recipe, the
    seed, and which of the model's tensors the pretrained weights hold under which names. For
    a model with state-dict loading of its own (``own_loading``), ``loaded`` holds what that
    loading made of the pretrained weights, and ``own`` the module paths that have it."""

    pretrained: PretrainedFiles | None = None
    recipe: Recipe | None = None
    seed: int = 0
    held: Coverage | None = None
    loaded: Loaded | None = None
    own: tuple[str, ...] = ()

    @property
    def names(self) -> NameMap:
        return self.held.names if self.held is not None else NameMap()


@dataclass
class StageSources:
    """One stage's tensors (by stage state-dict name) split by where their values come from."""

    values: dict[str, torch.Tensor] = field(default_factory=dict)
    pretrained: dict[str, str] = field(default_factory=dict)  # stage name -> its name there
    init: dict[str, str] = field(default_factory=dict)  # stage name -> original name
    loaded: list[str] = field(default_factory=list)  # in values: what the model's loading gave
    converted: list[str] = field(default_factory=list)  # "name: bfloat16 -> float32"
    names: set[str] = field(default_factory=set)  # every original name of every tensor

    @property
    def all_values(self) -> bool:
        return not self.pretrained and not self.init and not self.loaded


def weight_plan(
    model: nn.Module,
    weights: str | Path | PretrainedFiles | None,
    seed: int = 0,
    model_file: object = None,
    *,
    allow_missing: bool = False,
) -> WeightPlan | None:
    """What ``emit`` needs beyond the model's values: the pretrained weights at ``weights``
    (indexed, nothing read yet; or already opened), the names its tensors are read by, and, for a
    model with meta tensors, their initialisation recipe (the model file's
    ``init_weights(module)`` included when ``model_file`` defines one); None for a real model
    without pretrained weights.

    Raises:
        WeightsError: the pretrained weights lack some of the model's tensors (unless
            ``allow_missing``: they are then initialised as without pretrained weights).
    """
    meta = is_meta_model(model)
    if weights is None and not meta:
        return None
    pretrained = (
        weights
        if isinstance(weights, PretrainedFiles) or weights is None
        else open_pretrained(Path(weights))
    )
    held = loaded = None
    own = tuple(own_loading(model)) if pretrained is not None else ()
    if pretrained is not None:
        held = coverage(model, pretrained.files, match_names(model, pretrained.files))
        if own:
            loaded = load_through_model(model, pretrained, held.names)
            held = _loaded_coverage(model, held, loaded)
        for name, tensor in model.state_dict(keep_vars=True).items():
            if not own and held.names(name) in pretrained.files:
                _check_shape(pretrained, held.names(name), tensor, None)
        if held.missing and not allow_missing:
            raise WeightsError(_missing(pretrained, held))
    hook = getattr(model_file, "init_weights", None)
    recipe = record_init(model, hook if callable(hook) else None) if meta else None
    return WeightPlan(pretrained, recipe, seed, held, loaded, own)


def _loaded_coverage(model: nn.Module, held: Coverage, loaded: Loaded) -> Coverage:
    """``held`` counted again from what the model's own loading filled."""
    filled = coverage(model, loaded.values, NameMap())
    return Coverage(held.names, filled.total, filled.missing)


def stage_sources(stage: Stage, module: nn.Module, plan: WeightPlan) -> StageSources:
    """Split ``module``'s (the lowered stage's) tensors by source.

    Raises:
        WeightsError: a tensor in the pretrained weights has another shape, or a meta tensor is in
            neither the pretrained weights nor the recipe.
    """
    sources = StageSources()
    seen: dict[int, str] = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        sources.names.update(stage.params.get(name, (name,)))
        if id(tensor) in seen:  # tied within the stage: filled through its first name
            continue
        seen[id(tensor)] = name
        originals = stage.params.get(name, (name,))
        found = _in_pretrained(plan, originals)
        value = _in_loaded(plan, originals)
        if value is not None:
            sources.values[name] = value
            sources.loaded.append(name)
        elif found is not None:
            _check_shape(plan.pretrained, found, tensor, stage.index)  # type: ignore[arg-type]
            sources.pretrained[name] = found
            have = plan.pretrained.dtype(found)  # type: ignore[union-attr]
            if have != tensor.dtype:
                sources.converted.append(f"{found}: {_dt(have)} -> {_dt(tensor.dtype)}")
        elif not tensor.is_meta:
            sources.values[name] = tensor.detach()
        elif plan.recipe is not None and plan.recipe.covers(originals[0]):
            sources.init[name] = originals[0]
        else:
            raise WeightsError(_no_values(plan, originals[0], stage.index))
    return sources


def unused_in_pretrained(plan: WeightPlan, stages: list[StageSources]) -> list[str]:
    """Pretrained tensors no stage reads (another model's, or ones the model does not use)."""
    if plan.pretrained is None:
        return []
    if plan.loaded is not None:
        return list(plan.loaded.unused)
    known = {plan.names(name) for s in stages for name in s.names}
    return sorted(set(plan.pretrained.files) - known)


def _in_loaded(plan: WeightPlan, originals: tuple[str, ...]) -> torch.Tensor | None:
    if plan.loaded is None:
        return None
    return next((plan.loaded.values[n] for n in originals if n in plan.loaded.values), None)


def _in_pretrained(plan: WeightPlan, originals: tuple[str, ...]) -> str | None:
    if plan.pretrained is None or plan.loaded is not None:
        return None
    return next((plan.names(n) for n in originals if plan.names(n) in plan.pretrained.files), None)


def _missing(pretrained: PretrainedFiles, held: Coverage) -> str:
    """One line: how many of the model's tensors ``pretrained`` lacks, the first few, the fix."""
    first = ", ".join(held.missing[:3]) + (", ..." if len(held.missing) > 3 else "")
    renamed = f" (read with {held.names})" if held.names != NameMap() else ""
    other = ""
    if not held.loaded:
        sample = next(iter(sorted(pretrained.files)), None)
        other = f" (it holds none of them{f', e.g. {sample}' if sample else ''})"
    return (
        f"{pretrained.path} lacks {len(held.missing)} of the model's {held.total} tensors"
        f"{renamed}: {first}{other}; pass the pretrained weights of this model, or "
        "--allow-missing to initialise the ones it lacks"
    )


def _check_shape(
    pretrained: PretrainedFiles, name: str, tensor: torch.Tensor, stage: int | None
) -> None:
    have = pretrained.shape(name)
    if have != tuple(tensor.shape):
        where = f" (stage {stage})" if stage is not None else ""
        raise WeightsError(
            f"{name} is {list(have)} in {pretrained.files[name]} but {list(tensor.shape)} in "
            f"the model{where}; the pretrained weights are of another model or configuration: "
            "build the model with their config"
        )


def _no_values(plan: WeightPlan, name: str, stage: int) -> str:
    why = plan.recipe.unrecorded.get(name, "") if plan.recipe is not None else ""
    where = f"not in {plan.pretrained.path}" if plan.pretrained is not None else "no --weights"
    because = f" ({why})" if why else ""
    return (
        f"{name} (stage {stage}) is on the meta device with no values: {where}, and the "
        f"model's initialisation does not set it{because}; pass --weights with pretrained "
        "weights holding it, or define init_weights(module) in the model file to set it"
    )


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
