"""The part of the model one generation rank runs, and nothing more: the model is built on the
meta device (no memory for its weights), then only the modules of this rank's stage (its
blocks, the embeddings on the first stage, the head on the last, the weightless modules every
stage uses) are given memory and their weights, read by name from where they are kept
(``WeightSource``: the compiled stages' files, a file of the pipeline's current weights, or a
training run's newest step), each tensor alone. A model bigger than one rank's memory decodes
on ranks that each hold their part, as it trains."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from pipecompile.generation.families import Family, GenerateError, decoder_family
from pipecompile.generation.session import (
    built_model,
    copy_in,
    tensor_aliases,
    train_state_weights,
)
from pipecompile.ir.records.generation_plan import GenerationPlan
from pipecompile.ir.records.manifest import Manifest

__all__ = ["WeightSource", "skeleton", "stage_modules", "rank_model"]


class WeightSource:
    """Tensors by the model's names, read only when asked for: ``kind`` is ``directory``
    (the compiled stages' safetensors files), ``file`` (one safetensors file keyed by the
    model's names) or ``train_state`` (a `run --save` directory's newest step)."""

    def __init__(self, kind: str, path: Path, manifest: Manifest | None = None) -> None:
        self.kind, self.path, self.manifest = kind, Path(path), manifest

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "path": str(self.path)}

    @classmethod
    def from_json(cls, raw: dict[str, str], manifest: Manifest) -> WeightSource:
        return cls(raw["kind"], Path(raw["path"]), manifest)

    def read(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        """The tensors of ``names`` this source holds (a name it lacks is left out)."""
        wanted = set(names)
        if self.kind == "file":
            return _from_file(self.path, wanted)
        if self.kind == "train_state":
            return train_state_weights(self.path, wanted)
        assert self.manifest is not None
        return _from_directory(self.path, self.manifest, wanted)


def _from_file(path: Path, wanted: set[str]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys() if k in wanted}  # noqa: SIM118


def _from_directory(
    directory: Path, manifest: Manifest, wanted: set[str]
) -> dict[str, torch.Tensor]:
    """From each stage's weights file, by its parameters' original names; a directory whose
    stages keep no file of their own (pretrained weights read at load) is loaded whole."""
    if any(stage.weights is None for stage in manifest.stages):
        from pipecompile.runtime.pipeline import Pipeline

        state = Pipeline.load(directory).state_dict()
        return {k: v for k, v in state.items() if k in wanted}
    from safetensors import safe_open

    from pipecompile.runtime.load import weight_shapes

    out: dict[str, torch.Tensor] = {}
    for k, stage in enumerate(manifest.stages):
        picks = {
            own: [o for o in originals if o in wanted] for own, originals in stage.params.items()
        }
        picks = {own: names for own, names in picks.items() if names}
        if not picks:
            continue
        assert stage.weights is not None
        path = directory / stage.weights
        shapes = weight_shapes(path, f"stage {k}: weights {path}", directory)  # readable
        picks = {own: names for own, names in picks.items() if own in shapes}
        with safe_open(str(path), framework="pt") as f:
            for own, names in picks.items():
                tensor = f.get_tensor(own)
                out.update({n: tensor for n in names})
    return out


def skeleton(directory: Path, manifest: Manifest) -> nn.Module:
    """The model on the meta device (``session.built_model``: no memory for its weights).

    Raises:
        GenerateError: the directory records no way to build it.
    """
    with torch.device("meta"):
        return built_model(directory, manifest)


def stage_modules(family: Family, plan: GenerationPlan, stage: int) -> list[str]:
    """The module paths decode stage ``stage`` runs."""
    first, stop = plan.blocks[stage]
    out = [f"{family.blocks_path}.{i}" for i in range(first, stop)]
    out += list(family.first) if stage == 0 else []
    out += list(family.last) if stage == plan.stages - 1 else []
    return out


def rank_model(
    model: nn.Module, plan: GenerationPlan, stage: int, source: WeightSource
) -> nn.Module:
    """``model`` (built on the meta device) with stage ``stage``'s modules in memory and
    their weights read from ``source``; every other module stays on the meta device.

    Raises:
        GenerateError: ``source`` lacks a weight the stage needs, or holds another shape.
    """
    family = decoder_family(model)
    paths = stage_modules(family, plan, stage)
    aliases = tensor_aliases(model)  # before to_empty, which unties a tied weight
    for path in paths:
        model.get_submodule(path).to_empty(device="cpu")
    family.materialise_every()
    wanted = {
        name: aliases.get(name, [name])
        for name in model.state_dict(keep_vars=True)
        if any(name == p or name.startswith(p + ".") for p in paths)
    }
    found = source.read({n for names in wanted.values() for n in names})
    missing = copy_in(model, found, aliases, str(source.path), wanted)
    if missing:
        raise GenerateError(
            f"{source.path} lacks {', '.join(missing[:3])}"
            f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''}, which stage "
            f"{stage} needs: pass the weights this model was compiled or trained with"
        )
    return model.eval()
