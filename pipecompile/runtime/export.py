"""`pipecompile export OUT -o TARGET`: the pipeline's weights under the original model's names.

``TARGET.safetensors`` is one state dict that ``model.load_state_dict`` accepts; any other
``TARGET`` is a directory in the Hugging Face layout (``model-0000k-of-0000n.safetensors``
shards of at most ``shard_size`` bytes and ``model.safetensors.index.json``), which
``from_pretrained`` and ``pipecompile --weights`` read. Files are written under temporary
names and renamed into place, so an interrupted export leaves no half-written file.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from pipecompile.errors import PipecompileError
from pipecompile.model.checkpoint_files import INDEX
from pipecompile.runtime.checkpoint import resume
from pipecompile.runtime.load import read_manifest
from pipecompile.runtime.pipeline import Pipeline

__all__ = ["export_weights", "export_sharded", "SHARD_SIZE", "is_file_target"]

SHARD_SIZE = 5_000_000_000  # Hugging Face's default max_shard_size, "5GB"
CONFIGS = ("config.json", "generation_config.json")  # copied from a --weights directory


def is_file_target(target: Path) -> bool:
    """Whether ``target`` names one safetensors file (else a sharded directory)."""
    return target.suffix == ".safetensors"


def export_weights(directory: Path, target: Path, checkpoint: Path | None = None) -> int:
    """Write the emitted (or the checkpoint's newest) weights to ``target`` atomically;
    returns the number of tensors. Tied parameters appear under each of their names."""
    state = _state(directory, checkpoint)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    save_file(state, str(tmp))
    os.replace(tmp, target)
    return len(state)


def export_sharded(
    directory: Path, target: Path, checkpoint: Path | None = None, *,
    shard_size: int = SHARD_SIZE, force: bool = False,
) -> tuple[int, int]:  # fmt: skip
    """Write the weights as a Hugging Face checkpoint directory ``target``; returns (tensors,
    shards). Tensors are packed in name order; one larger than ``shard_size`` gets a shard of
    its own. The compile's ``--weights`` directory's ``config.json`` (and
    ``generation_config.json``) are copied beside them when ``target`` has none.

    Raises:
        PipecompileError: ``target`` is a file, or a directory holding files other than a
            previous export's (unless ``force``: they are kept).
    """
    _check_target(target, force)
    state = _state(directory, checkpoint)
    shards = _pack(state, shard_size)
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob("model-*-of-*.safetensors"):
        old.unlink()  # a previous export's shards (another count): replaced as a whole
    names = [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    weight_map = {}
    for name, shard in zip(names, shards):
        _atomic(target / name, lambda tmp, shard=shard: save_file(shard, str(tmp)))
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    _atomic(target / INDEX, lambda tmp: tmp.write_text(json.dumps(index, indent=2) + "\n"))
    _copy_configs(directory, target)
    return len(state), len(shards)


def _state(directory: Path, checkpoint: Path | None) -> dict[str, torch.Tensor]:
    pipe = Pipeline.load(directory)
    if checkpoint is not None:
        resume(pipe, checkpoint)
    return {name: t.detach().clone().contiguous() for name, t in pipe.state_dict().items()}


def _pack(state: dict[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(state):
        nbytes = state[name].numel() * state[name].element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = state[name]
        size += nbytes
    return shards


def _check_target(target: Path, force: bool) -> None:
    if target.exists() and not target.is_dir():
        raise PipecompileError(
            f"export -o {target}: is a file; name a directory for a sharded checkpoint, or a "
            ".safetensors file for one state dict"
        )
    if not target.is_dir() or force:
        return
    ours = {INDEX, *CONFIGS}
    other = sorted(
        p.name for p in target.iterdir()
        if p.name not in ours and not (p.name.startswith("model-") and p.suffix == ".safetensors")
    )  # fmt: skip
    if other:
        raise PipecompileError(
            f"export -o {target}: the directory holds {', '.join(other[:3])}, which an export "
            "did not write; pass --force to write the checkpoint beside them, or name another"
        )


def _copy_configs(directory: Path, target: Path) -> None:
    weights = read_manifest(directory).get("weights", {})
    if weights.get("source") != "checkpoint":
        return
    source = (Path(directory) / weights["checkpoint"]).resolve()
    source = source if source.is_dir() else source.parent
    for name in CONFIGS:
        if (source / name).is_file() and not (target / name).exists():
            shutil.copyfile(source / name, target / name)


def _atomic(path: Path, write) -> None:  # type: ignore[no-untyped-def]
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
