"""`pipecompile export OUT -o TARGET`: the pipeline's weights (the emitted ones, or those of the
train state ``run --save`` wrote, ``--train-state DIR``) under the original model's names.

``TARGET.safetensors`` is one state dict that ``model.load_state_dict`` accepts; any other
``TARGET`` is a directory in the Hugging Face layout (``model-0000k-of-0000n.safetensors``
shards of at most ``shard_size`` bytes and ``model.safetensors.index.json``, with the model's
``config.json`` when it has one), which ``from_pretrained`` and ``pipecompile --weights``
read. Files are written under temporary names and renamed into place, so an interrupted export
leaves no half-written file.

Every file written carries pipecompile's marker (``files.owned``), and only a marked file is
ever replaced or deleted: a user's pretrained weights in ``TARGET`` are refused, ``--force`` or not.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from pipecompile.errors import EmitError
from pipecompile.files.atomic import replace_atomically
from pipecompile.files.disk import writing
from pipecompile.files.names import MANIFEST, MODEL_CONFIGS
from pipecompile.files.owned import (
    EXPORT_MARK,
    EXPORT_METADATA,
    SHARD,
    copied_digests,
    is_our_index,
    is_our_safetensors,
    sha256,
)
from pipecompile.files.writable import check_directory, check_file
from pipecompile.ir.records.manifest import saved_state
from pipecompile.model.pretrained_files import INDEX
from pipecompile.runtime.load import read_manifest
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.training.train_state import resume

__all__ = [
    "export_weights",
    "export_sharded",
    "SHARD_SIZE",
    "is_file_target",
    "check_file_target",
    "check_dir_target",
]

SHARD_SIZE = 5_000_000_000  # Hugging Face's default max_shard_size, "5GB"
CONFIGS = tuple(MODEL_CONFIGS)  # config.json, generation_config.json: from_pretrained reads them
SINGLE = "model.safetensors"  # Hugging Face pretrained weights in one file


def is_file_target(target: Path) -> bool:
    """Whether ``target`` names one safetensors file (else a sharded directory)."""
    return target.suffix == ".safetensors"


def export_weights(directory: Path, target: Path, train_state: Path | None = None) -> int:
    """Write the emitted weights (or those of the newest step saved in the train state
    directory ``train_state``) to ``target`` atomically;
    returns the number of tensors. Tied parameters appear under each of their names.

    Raises:
        EmitError: ``target`` is a directory, a file pipecompile export did not write, or
            cannot be written (named, with the reason).
    """
    check_file_target(target)
    _check_not_source(directory, target)
    state = _state(directory, train_state)
    with writing("write the export to", target):
        target.parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(target, lambda tmp: save_file(state, str(tmp), metadata=EXPORT_METADATA))
    return len(state)


def export_sharded(
    directory: Path,
    target: Path,
    train_state: Path | None = None,
    *,
    shard_size: int = SHARD_SIZE,
    force: bool = False,
    notes: list[str] | None = None,
) -> tuple[int, int]:
    """Write the weights as a Hugging Face weights directory ``target``; returns (tensors,
    shards). Tensors are packed in name order; one larger than ``shard_size`` gets a shard of
    its own. The model's ``config.json`` (and ``generation_config.json``) are copied beside
    them when ``target`` has none: the compile's ``--weights`` directory's, else those it kept
    of a Hugging Face model (so ``from_pretrained(target)`` builds the model's sizes). A previous
    export's shards are replaced; what else ``force`` wrote beside is named in ``notes``.

    Raises:
        EmitError: see ``check_dir_target``; a config the compile kept is missing; or
            ``target`` cannot be written.
    """
    kept = check_dir_target(target, force)
    _check_not_source(directory, target)
    if kept and notes is not None:
        notes.append(f"kept {_names(kept)} in {target}: an export did not write them")
    configs = _config_sources(directory)
    state = _state(directory, train_state)
    shards = _pack(state, shard_size)
    names = [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    with writing("write the export to", target):
        target.mkdir(parents=True, exist_ok=True)
        weight_map = {}
        for name, shard in zip(names, shards):
            replace_atomically(
                target / name,
                lambda tmp, shard=shard: save_file(shard, str(tmp), metadata=EXPORT_METADATA),
            )
            weight_map.update(dict.fromkeys(shard, name))
        copied = _copy_configs(configs, target)
        total = sum(t.numel() * t.element_size() for t in state.values())
        metadata = {"total_size": total, "written_by": EXPORT_MARK, "copied": copied}
        index = {"metadata": metadata, "weight_map": dict(sorted(weight_map.items()))}
        replace_atomically(
            target / INDEX, lambda tmp: tmp.write_text(json.dumps(index, indent=2) + "\n")
        )
        for old in target.iterdir():  # a previous export's shards of another count: stale now
            if SHARD.fullmatch(old.name) and old.name not in names and is_our_safetensors(old):
                old.unlink()
    return len(state), len(shards)


def check_file_target(target: Path) -> None:
    """Refuse an export file ``target`` that is a directory, a file pipecompile export did
    not write (never replaced, ``--force`` or not), or a place that cannot be written."""
    if target.is_dir():
        raise EmitError(f"export -o {target}: is a directory; a .safetensors name must be a file")
    if target.exists() and not is_our_safetensors(target):
        raise EmitError(
            f"export -o {target}: the file exists and pipecompile export did not write it; "
            "it is never replaced (--force or not): choose another -o, or move it away"
        )
    check_file(target, "the export")


def check_dir_target(target: Path, force: bool) -> list[str]:
    """Refuse an export directory that could lose a user's file; returns the names in it an
    export did not write (which ``force`` writes beside, keeping them).

    Raises:
        EmitError: ``target`` is a file or cannot be written; it holds pretrained weights (shards,
            an index, ``model.safetensors``) pipecompile did not write, whatever ``force``;
            or other files an export did not write, without ``force``.
    """
    if target.exists() and not target.is_dir():
        raise EmitError(
            f"export -o {target}: is a file; name a directory for sharded weights, or a "
            ".safetensors file for one state dict"
        )
    check_directory(target, "the export")
    if not target.is_dir():
        return []
    copied = copied_digests(target / INDEX)
    weights, other = [], []
    for path in sorted(target.iterdir()):
        name = path.name
        if name == INDEX:
            mine = is_our_index(path)
        elif SHARD.fullmatch(name) or name == SINGLE:
            mine = is_our_safetensors(path)
        else:
            mine = name in copied and path.is_file() and sha256(path) == copied[name]
            if not mine and not _leftover(name):
                other.append(name + "/" * path.is_dir())
            continue
        if not mine:
            weights.append(name)
    if weights:
        raise EmitError(
            f"export -o {target}: it holds weights pipecompile did not write "
            f"({_names(weights)}), which an export never replaces (--force or not); choose "
            "another -o"
        )
    if other and not force:
        raise EmitError(
            f"export -o {target}: the directory holds {_names(other)}, which an export did not "
            "write; pass --force to write the weights beside them (they are kept), or "
            "choose another -o"
        )
    return other


def _check_not_source(directory: Path, target: Path) -> None:
    """Refuse to export into the pretrained weights the compiled directory reads from (its
    manifest names their shards: replacing them would change or break it)."""
    source = _weights_source(directory)
    if source is not None and target.resolve() == source:
        raise EmitError(
            f"export -o {target}: {directory} reads its weights from there (compiled with "
            "--weights); exporting into it would replace them: choose another -o"
        )


def _weights_source(directory: Path) -> Path | None:
    """The pretrained weights (file or directory) a compile with ``--weights`` reads, if any."""
    weights = read_manifest(directory).weights
    if weights is None or weights.source != "checkpoint" or weights.pretrained is None:
        return None
    return (Path(directory) / weights.pretrained).resolve()


def _leftover(name: str) -> bool:
    """A temporary file an export killed mid-write left (it is written over)."""
    inner = name[1:].removesuffix(".tmp")
    return (
        name.startswith(".")
        and name.endswith(".tmp")
        and (SHARD.fullmatch(inner) is not None or inner == INDEX)
    )


def _names(names: list[str]) -> str:
    more = f" and {len(names) - 4} more" if len(names) > 4 else ""
    return ", ".join(names[:4]) + more


def _state(directory: Path, train_state: Path | None) -> dict[str, torch.Tensor]:
    """What the model's own ``state_dict()`` holds (not its non-persistent buffers), by its
    names: the directory's weights, or a run's newest saved step."""
    pipe = Pipeline.load(directory)
    if train_state is not None:
        resume(pipe, train_state)
    state = saved_state(pipe.state_dict(), pipe.manifest)
    return {name: t.detach().clone().contiguous() for name, t in state.items()}


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


def _copy_configs(configs: dict[str, Path], target: Path) -> dict[str, str]:
    """Copy the model's ``configs`` (name -> file, ``_config_sources``) where ``target`` has
    none; returns the sha256 of each config in ``target`` an export wrote (this one or an
    earlier one)."""
    earlier = copied_digests(target / INDEX)
    ours = {n: d for n, d in earlier.items() if (target / n).is_file() and sha256(target / n) == d}
    for name, source in configs.items():
        if not (target / name).exists():
            replace_atomically(
                target / name, lambda tmp, source=source: shutil.copyfile(source, tmp)
            )
            ours[name] = sha256(target / name)
    return ours


def _config_sources(directory: Path) -> dict[str, Path]:
    """Each config to export (``CONFIGS``) and its file: the ``--weights`` directory's, else
    the one the compile kept of a Hugging Face model (``MODEL_CONFIGS``).

    Raises:
        EmitError: the manifest names a kept config that is not in ``directory``.
    """
    model = read_manifest(directory).model
    found = {}
    for name, kept in (model.configs or {}).items() if model is not None else ():
        if not (Path(directory) / kept).is_file():
            raise EmitError(
                f"{Path(directory) / kept} is missing (the model's {name}, which {MANIFEST} "
                "names): recompile the model"
            )
        found[name] = Path(directory) / kept
    source = _weights_source(directory)
    if source is not None:
        source = source if source.is_dir() else source.parent
        found |= {name: source / name for name in CONFIGS if (source / name).is_file()}
    return found
