"""Read an emitted directory back: the manifest, the program and each stage module."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from safetensors.torch import load_model
from torch import nn

from pipecompile.errors import EmitError, PipecompileError
from pipecompile.program import Program

__all__ = ["read_manifest", "read_program", "load_stage", "load_stages"]

_REQUIRED = ("format", "inputs", "outputs", "stages", "microbatches", "device_map", "program")


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of ``directory``; raises EmitError if it is missing or malformed."""
    path = Path(directory) / "manifest.json"
    if not path.is_file():
        raise EmitError(
            f"{str(directory)!r} holds no manifest.json; pass a directory written by "
            "`pipecompile MODEL --stages N -o DIR`"
        )
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise EmitError(f"{path} is not valid JSON: {err}") from None
    missing = [key for key in _REQUIRED if key not in manifest]
    if missing:
        raise EmitError(f"{path} lacks {', '.join(missing)}; recompile the model")
    if manifest["format"] != "pipecompile/1":
        raise EmitError(
            f"{path} has format {manifest['format']!r}; this pipecompile reads pipecompile/1"
        )
    return manifest


def read_program(path: Path) -> Program:
    """Parse a program file; errors name the file."""
    try:
        return Program.parse(Path(path).read_text())
    except OSError as err:
        raise EmitError(f"cannot read program {str(path)!r}: {err.strerror}") from None
    except PipecompileError as err:
        raise type(err)(f"{path}: {err}") from None


def load_stage(directory: Path, entry: dict[str, Any]) -> nn.Module:
    """Import ``entry["file"]``, build ``entry["class"]()``, load ``entry["weights"]`` into it."""
    source = Path(directory) / entry["file"]
    unique = f"pipecompile_stage_{abs(hash(str(source.resolve())))}_{entry['class']}"
    spec = importlib.util.spec_from_file_location(unique, source)
    if spec is None or spec.loader is None or not source.is_file():
        raise EmitError(f"stage source {source} is missing; recompile the model")
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique] = module
    spec.loader.exec_module(module)
    stage = getattr(module, entry["class"])()
    load_model(stage, str(Path(directory) / entry["weights"]))
    return stage


def load_stages(directory: Path, manifest: dict[str, Any]) -> list[nn.Module]:
    return [load_stage(directory, entry) for entry in manifest["stages"]]
