"""Pretrained weights (``--weights``) in the Hugging Face layout, read lazily: one
``*.safetensors`` file, or a directory with ``model.safetensors.index.json`` naming the shard of
every tensor (or a single ``model.safetensors``). Only headers are read until a tensor is asked
for, and then only that tensor (safetensors' ``safe_open``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from pipecompile.errors import WeightsError

__all__ = ["PretrainedFiles", "open_pretrained", "INDEX", "SINGLE"]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass
class PretrainedFiles:
    """The pretrained weights at ``path``: tensor name -> the file holding it; headers and open
    files are cached."""

    path: Path
    files: dict[str, Path]
    _open: dict[Path, Any] = field(default_factory=dict, repr=False)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(name).get_slice(name).get_shape())

    def dtype(self, name: str) -> torch.dtype:
        raw = self._handle(name).get_slice(name).get_dtype()
        return DTYPES.get(raw, torch.float32)

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor ``name``, read from its file alone."""
        try:
            return self._handle(name).get_tensor(name)
        except SafetensorError as err:
            raise WeightsError(
                f"{self.files[name]} is damaged: reading {name} failed ({err}); download or "
                "save the pretrained weights again"
            ) from None

    def close(self) -> None:
        self._open.clear()

    def _handle(self, name: str) -> Any:
        path = self.files[name]
        if path not in self._open:
            self._open[path] = _safe_open(path)
        return self._open[path]


def open_pretrained(path: Path) -> PretrainedFiles:
    """Index the pretrained weights at ``path`` (a file, or a directory as described above).

    Raises:
        WeightsError: the path does not exist, holds no weights, its index is not JSON or
            names a shard that is missing, or a file is not a readable safetensors file.
    """
    path = Path(path)
    if not path.exists():
        raise WeightsError(
            f"--weights {path} does not exist; pass a .safetensors file or a directory "
            f"holding {INDEX} or {SINGLE}"
        )
    if path.is_file():
        return PretrainedFiles(path, dict.fromkeys(_keys(path), path))
    index = path / INDEX
    if index.is_file():
        return PretrainedFiles(path, _indexed(index))
    if (path / SINGLE).is_file():
        return PretrainedFiles(path, dict.fromkeys(_keys(path / SINGLE), path / SINGLE))
    found = sorted(p.name for p in path.glob("*.safetensors"))[:3]
    hint = f" (it holds {', '.join(found)}: pass one of them)" if found else ""
    raise WeightsError(f"--weights {path} holds neither {INDEX} nor {SINGLE}{hint}")


def _indexed(index: Path) -> dict[str, Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise WeightsError(f"{index} is not a safetensors index ({err}); save it again") from None
    files = {name: index.parent / str(shard) for name, shard in weight_map.items()}
    for shard in sorted(set(files.values())):
        if not shard.is_file():
            raise WeightsError(
                f"{index} names {shard.name}, which is missing from {index.parent}; copy the "
                "whole directory of the pretrained weights"
            )
        keys = set(_keys(shard))
        listed = [n for n, f in files.items() if f == shard and n not in keys]
        if listed:
            raise WeightsError(
                f"{index} says {shard.name} holds {listed[0]}, but it does not; the index "
                "and the shards are from different saves of the weights"
            )
    return files


def _keys(path: Path) -> list[str]:
    return list(_safe_open(path).keys())


def _safe_open(path: Path) -> Any:
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError) as err:
        raise WeightsError(
            f"{path} is not a readable safetensors file ({err}); it may be truncated: "
            "download or save it again"
        ) from None
