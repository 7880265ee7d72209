"""Read an emitted directory back: the manifest (``ir.manifest``), the program and each stage
module."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import nn

from pipecompile.errors import EmitError, PipecompileError
from pipecompile.ir.graph.user_frame import innermost_in
from pipecompile.ir.programs.program import Program
from pipecompile.ir.records.manifest import Manifest, StageEntry, read_manifest
from pipecompile.model.without_init import build_loaded, fit
from pipecompile.runtime.materialise import allocate, fill_stage, needs_materialising
from pipecompile.runtime.state.op_seeds import seed_random_ops
from pipecompile.schedules import DEFAULT_SCHEDULE

__all__ = [
    "load_tail",
    "Emitted",
    "open_emitted",
    "read_manifest",
    "read_program",
    "load_stage",
    "load_stages",
    "load_weights",
    "recompile_hint",
    "weight_shapes",
]


class Emitted(NamedTuple):
    """An emitted directory opened: its manifest and the program a run follows."""

    directory: Path
    manifest: Manifest
    program: Program


def open_emitted(directory: str | Path, program: str | Path | None = None) -> Emitted:
    """The directory ``pipecompile MODEL -o DIR`` wrote, its manifest and program each read
    once (``program``: another program file to run instead, ``run --program``)."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    path = Path(program) if program else directory / manifest.program
    return Emitted(directory, manifest, read_program(path))


def read_program(path: Path) -> Program:
    """Parse a program file; errors name the file."""
    try:
        return Program.parse(Path(path).read_text())
    except OSError as err:
        raise EmitError(f"cannot read program {str(path)!r}: {err.strerror}") from None
    except PipecompileError as err:
        raise type(err)(f"{path}: {err}") from None


def load_stage(
    directory: Path,
    entry: StageEntry,
    manifest: Manifest | None = None,
    *,
    seed_ops: bool = True,
) -> nn.Module:
    """Import ``entry.file``, build ``entry.class_name()``, load ``entry.weights`` into it;
    with ``seed_ops`` (for running it) seed each of its random ops by name (``op_seeds``).

    Raises:
        EmitError: the stage file is missing, does not import (an edit broke it), lacks the
            class, or its weights file is missing, damaged or does not fit the module; the
            message names the stage and the file and says how to recompile.
    """
    directory = Path(directory)
    source = directory / entry.file
    where = f"{_stage_label(entry)}: {source}"
    module = _import_stage(source, entry.class_name, where, directory)
    cls = getattr(module, entry.class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        found = [
            k
            for k, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, nn.Module) and v.__module__ == module.__name__
        ]
        defines = f" (it defines {', '.join(found)})" if found else ""
        raise EmitError(
            f"{where} has no class {entry.class_name!r}{defines}; undo the edit, or "
            f"{recompile_hint(directory)}"
        )
    materialise = needs_materialising(entry)
    try:  # every tensor comes from the weights file or is materialised: no initialiser runs
        with torch.device("meta"):
            stage = cls()
    except Exception:  # a constructor that computes with real tensors (an edited stage file)
        stage = None
    try:
        if stage is None:
            with torch.device("meta") if materialise else contextlib.nullcontext():
                stage = cls()
    except Exception as err:
        raise EmitError(
            f"{where}: {entry.class_name}() failed{_line_in(err, source)}: "
            f"{type(err).__name__}: {err}; fix the edit, or {recompile_hint(directory)}"
        ) from err
    if materialise:
        allocate(stage, "cpu")
        fill_stage(
            stage, entry, directory, manifest or read_manifest(directory), _stage_label(entry)
        )
    else:
        assert entry.weights is not None  # else needs_materialising
        stage = load_weights(stage, directory / entry.weights, _stage_label(entry), directory)
    if seed_ops:
        seed_random_ops(stage, list(entry.random_ops or ()), where)
    return stage


def load_stages(directory: Path, manifest: Manifest) -> list[nn.Module]:
    return [load_stage(directory, entry, manifest) for entry in manifest.stages]


def load_tail(directory: Path, manifest: Manifest) -> nn.Module | None:
    """The batch-coupled tail of the manifest (``tail.py``; None where it has none).

    Raises:
        EmitError: the file is missing, does not import or lacks its class.
    """
    record = manifest.tail
    if record is None:
        return None
    source = Path(directory) / record.file
    where = f"the tail: {source}"
    module = _import_stage(source, record.cls, where, Path(directory))
    cls = getattr(module, record.cls, None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise EmitError(
            f"{where} has no class {record.cls!r}; undo the edit, or "
            f"{recompile_hint(Path(directory))}"
        )
    return cls()


def load_weights(stage: nn.Module, path: Path, label: str, directory: Path) -> nn.Module:
    """``stage`` holding the safetensors file ``path``, after checking that it is readable and
    holds exactly the stage's tensors with the stage's shapes: a ``stage`` built on the meta
    device is built again holding copies of the file's tensors (``without_init``), any other
    loaded in place.

    Raises:
        EmitError: naming ``label`` (e.g. "stage 1") and ``path``.
    """
    where = f"{label}: weights {path}"
    shapes = weight_shapes(path, where, directory)
    own = stage.state_dict()
    wrong = [
        f"{k} is {tuple(shapes[k])} there but {tuple(own[k].shape)} in {type(stage).__name__}"
        for k in own
        if k in shapes and tuple(shapes[k]) != tuple(own[k].shape)
    ]
    if wrong:
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise EmitError(
            f"{where} do not fit the stage module: {wrong[0]}{more}; undo the edit to the "
            f"stage file, or {recompile_hint(directory)}"
        )
    missing, unexpected = fit(stage, set(shapes))
    if missing or unexpected:
        lack = f"lack {_names(sorted(missing))}" if missing else ""
        extra = (
            f"hold {_names(sorted(unexpected))} that {label} does not have" if unexpected else ""
        )
        raise EmitError(
            f"{where} do not fit the stage module: they {' and '.join(filter(None, (lack, extra)))}"
            f" (another stage's weights, or an edited stage file); {recompile_hint(directory)}"
        )
    state = load_file(str(path))
    if any(t.is_meta for t in own.values()):
        return build_loaded(type(stage), state)
    stage.load_state_dict(state, strict=False)  # fit: only tied names are left out
    return stage


def recompile_hint(directory: Path) -> str:
    """``recompile: pipecompile MODEL --stages N ... -o DIRECTORY`` from the manifest."""
    try:
        manifest = read_manifest(directory)
    except PipecompileError:
        manifest = None
    if manifest is None or manifest.model is None or manifest.model.file is None:
        return f"recompile the model (`pipecompile MODEL --stages N -o {directory}`)"
    model = os.path.relpath(Path(directory) / manifest.model.file)
    stages, count = len(manifest.stages), manifest.microbatches
    options = f" --microbatches {count}" if count > 1 else ""
    if manifest.schedule != DEFAULT_SCHEDULE:
        options += f" --schedule {manifest.schedule}"
    return f"recompile (`pipecompile {model} --stages {stages}{options} -o {directory}`)"


def _import_stage(source: Path, cls: str, where: str, directory: Path) -> ModuleType:
    unique = f"pipecompile_stage_{abs(hash(str(source.resolve())))}_{cls}"
    spec = importlib.util.spec_from_file_location(unique, source)
    if spec is None or spec.loader is None or not source.is_file():
        raise EmitError(f"{where} is missing; {recompile_hint(directory)}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[unique]
        if isinstance(err, SyntaxError):
            at, text = f" line {err.lineno}", err.msg
        else:
            at, text = _line_in(err, source), str(err)
        raise EmitError(
            f"{where} does not import:{at}: {type(err).__name__}: {text}; fix the edit, or "
            f"{recompile_hint(directory)}"
        ) from err
    return module


def weight_shapes(path: Path, where: str, directory: Path) -> dict[str, list[int]]:
    """Each tensor's shape from the file's header, which also checks the file's length."""
    if not path.is_file():
        raise EmitError(f"{where} are missing; {recompile_hint(directory)}")
    size = path.stat().st_size
    if size == 0:
        raise EmitError(f"{where} are empty (0 bytes); {recompile_hint(directory)}")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_slice(k).get_shape() for k in f.keys()}
    except (SafetensorError, OSError) as err:
        raise EmitError(
            f"{where} are damaged or truncated ({size} bytes: {err}); {recompile_hint(directory)}"
        ) from None


def _stage_label(entry: StageEntry) -> str:
    found = re.fullmatch(r"Stage(\d+)", entry.class_name)
    return f"stage {found.group(1)}" if found else f"stage {entry.class_name}"


def _line_in(err: BaseException, source: Path) -> str:
    """`` line N`` of the innermost frame of ``err``'s traceback in ``source``, if any."""
    line = innermost_in(err, source)
    return f" line {line}" if line is not None else ""


def _names(names: list[str], shown: int = 3) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more if names else "nothing"
