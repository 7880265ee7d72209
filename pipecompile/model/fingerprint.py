"""Fingerprints that tell whether a compiled directory still matches its model: the model
file's bytes and the traced graph (its code and its parameters' names, shapes and dtypes)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch.fx as fx

__all__ = ["file_fingerprint", "graph_fingerprint"]


def file_fingerprint(path: Path) -> str:
    """The sha256 of a file's bytes, as hex."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def graph_fingerprint(module: fx.GraphModule) -> str:
    """The sha256 of a traced graph's Python code and its tensors' names, shapes and dtypes
    (values are not read, so it works on the meta device too)."""
    digest = hashlib.sha256(module.code.encode())
    for name, tensor in sorted(module.state_dict(keep_vars=True).items()):
        digest.update(f"\n{name} {tuple(tensor.shape)} {tensor.dtype}".encode())
    return digest.hexdigest()
