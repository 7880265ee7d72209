"""The part of the model one generation rank runs, and nothing more: its decoding stage's
modules, built from the compiled directory's ``decode_stage_<j>.py`` and ``prefill_stage_<j>.py``
on the meta device (no model is built: the model file is not read again), given only the
tensors the stage reads, by their names in the model, from where they are kept
(``WeightSource``: the compiled stages' files, a file of the pipeline's current weights, a
training run's newest step, or tensors in memory), each tensor alone. A model bigger than one
rank's memory decodes on ranks that each hold their part, as it trains."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import torch

from pipecompile.files.names import GENERATE_CONSTANTS as CONSTANTS
from pipecompile.generation.session import train_state_weights
from pipecompile.generation.stages import DecodeStage, stage_modules_from
from pipecompile.generation.step_trace import GenerateError
from pipecompile.ir.records.generation_plan import GenerationPlan
from pipecompile.ir.records.manifest import Manifest

__all__ = ["WeightSource", "stage_tensors", "rank_stage"]


class WeightSource:
    """Tensors by the model's names, read only when asked for: ``kind`` is ``directory``
    (the compiled stages' safetensors files), ``file`` (one safetensors file keyed by the
    model's names), ``train_state`` (a `run --save` directory's newest step) or ``memory``
    (``tensors``, in this process)."""

    def __init__(
        self,
        kind: str,
        path: Path,
        manifest: Manifest | None = None,
        tensors: dict[str, torch.Tensor] | None = None,
    ) -> None:
        self.kind, self.path, self.manifest = kind, Path(path), manifest
        self.tensors = tensors or {}

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "path": str(self.path)}

    @classmethod
    def from_json(cls, raw: dict[str, str], manifest: Manifest) -> WeightSource:
        return cls(raw["kind"], Path(raw["path"]), manifest)

    def read(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        """The tensors of ``names`` this source holds (a name it lacks is left out)."""
        wanted = set(names)
        if self.kind == "memory":
            return {k: v.detach() for k, v in self.tensors.items() if k in wanted}
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


def stage_tensors(
    directory: Path, plan: GenerationPlan, stage: int, source: WeightSource
) -> dict[str, torch.Tensor]:
    """Decoding stage ``stage``'s tensors by the stage's names: each read from ``source``
    under any of its names in the model; a constant (a tensor the model's state dict lacks)
    from the directory's constants file, else (a model compiled on the meta device) from
    ``source`` by its name in the model.

    Raises:
        GenerateError: ``source`` lacks a weight the stage needs (naming it and the source).
    """
    record = plan.stages_[stage]
    names = {n for names in record.params.values() for n in names}
    found = source.read(names | set(record.constants.values()))
    out: dict[str, torch.Tensor] = {}
    if record.constants and (directory / CONSTANTS).is_file():
        from safetensors import safe_open

        with safe_open(str(directory / CONSTANTS), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in record.constants if k in f.keys()})  # noqa: SIM118
    wanted = {a: tuple(n) for a, n in record.params.items()}
    wanted.update({a: (n,) for a, n in record.constants.items() if a not in out})
    missing = []
    for attr, names in wanted.items():
        name = next((n for n in names if n in found), None)
        if name is None:
            missing.append(names[0])
        else:
            out[attr] = found[name]
    if missing:
        raise GenerateError(
            f"{source.path} lacks {', '.join(missing[:3])}"
            f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''}, which decoding "
            f"stage {stage} needs: pass the weights this model was compiled or trained with"
        )
    return out


def rank_stage(
    directory: Path,
    plan: GenerationPlan,
    stage: int,
    source: WeightSource,
    device: torch.device | str = "cpu",
) -> DecodeStage:
    """Decoding stage ``stage`` from the directory's files, holding only its own tensors."""
    tensors = stage_tensors(directory, plan, stage, source)
    digests = plan.stages_[stage].sha256

    def read(name: str) -> str:
        text = (directory / name).read_text()
        if name in digests and hashlib.sha256(text.encode()).hexdigest() != digests[name]:
            raise GenerateError(
                f"{directory / name} was changed since the compile (its sha256 is not the "
                "manifest's): recompile with --generate"
            )
        return text

    modules = stage_modules_from(read, plan, stage, tensors, device, directory)
    return DecodeStage(plan, stage, modules, device)
