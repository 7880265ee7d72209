"""Load a model, its example inputs and its training hooks from a user's ``model.py[:NAME]``."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from pipecompile.errors import ModelFileError
from pipecompile.ir.graph.user_frame import innermost_in
from pipecompile.ir.graph.values import non_tensor_input
from pipecompile.ir.records.manifest import MANIFEST, Manifest
from pipecompile.model.fingerprint import file_fingerprint

__all__ = [
    "ModelSpec",
    "load_model_file",
    "split_ref",
    "import_file",
    "named_inputs",
    "dynamic_shapes",
    "recorded_model",
    "check_fresh",
    "recompile_command",
]

DEFAULT_FACTORY = "build_model"


@dataclass
class ModelSpec:
    """What a model file provides. ``inputs`` maps forward() parameter names to tensors.
    ``model`` is None when the file was read to run compiled stages (``build=False``)."""

    path: Path
    name: str
    model: nn.Module | None
    inputs: dict[str, torch.Tensor]
    targets: tuple[torch.Tensor, ...] | None
    loss_fn: Callable[..., torch.Tensor] | None
    module: ModuleType
    input_names: list[str] = field(default_factory=list)  # forward()'s, in order


def split_ref(ref: str) -> tuple[Path, str]:
    """``"dir/model.py:NAME"`` -> (path, NAME); NAME defaults to ``build_model``."""
    path, sep, name = ref.rpartition(":")
    if not sep or not name.isidentifier():
        return Path(ref), DEFAULT_FACTORY
    return Path(path), name


def import_file(path: Path) -> ModuleType:
    """Import a Python file by path (its folder is importable while it loads)."""
    if not path.is_file():
        raise ModelFileError(f"model file {str(path)!r} does not exist; pass a path to a .py file")
    unique = f"pipecompile_model_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(unique, path)
    if spec is None or spec.loader is None:
        raise ModelFileError(f"cannot import {str(path)!r}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.resolve().parent))
    sys.modules[unique] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[unique]
        where = _user_frame(err, path)
        raise ModelFileError(
            f"importing {str(path)!r} failed{where}: {type(err).__name__}: {err}"
        ) from err
    finally:
        sys.path.remove(str(path.resolve().parent))
    return module


def load_model_file(
    ref: str, *, build: bool = True, input_names: list[str] | None = None
) -> ModelSpec:
    """Load ``path.py[:NAME]`` per the model-file contract; raise ModelFileError otherwise.

    With ``build=False`` the model is not built (compiled stages run without it: a rank never
    holds the whole model); positional example inputs are then named by ``input_names``, the
    compiled model's inputs in order.
    """
    path, name = split_ref(ref)
    module = import_file(path)
    model = _make_model(module, name, path) if build else None
    raw = _call_hook(module, "example_inputs", path, required=True)
    params = _forward_params(model) if model is not None else list(input_names or [])
    inputs = named_inputs(params, raw, path, "forward()" if build else "the compiled model")
    targets = _call_hook(module, "example_targets", path, required=False)
    if targets is not None and not isinstance(targets, tuple):
        targets = (targets,)
    loss_fn = getattr(module, "loss_fn", None)
    if loss_fn is not None and not callable(loss_fn):
        raise ModelFileError(f"{path}: loss_fn is a {type(loss_fn).__name__}, expected a function")
    return ModelSpec(path, name, model, inputs, targets, loss_fn, module, params)


def _make_model(module: ModuleType, name: str, path: Path) -> nn.Module:
    if not hasattr(module, name):
        found = sorted(
            k for k, v in vars(module).items() if not k.startswith("_") and _looks_like_model(v)
        )
        hint = (
            f"; candidates found: {', '.join(found)} (select one with {path}:NAME)" if found else ""
        )
        raise ModelFileError(
            f"{path} has no {name!r}: define build_model() returning an nn.Module, "
            f"or pass {path}:NAME{hint}"
        )
    obj = getattr(module, name)
    if isinstance(obj, nn.Module):
        return obj
    if not callable(obj):
        raise ModelFileError(f"{path}:{name} is a {type(obj).__name__}, not a model or factory")
    try:
        model = obj()
    except Exception as err:
        raise ModelFileError(
            f"calling {path}:{name}() failed{_user_frame(err, path)}: {type(err).__name__}: {err}"
        ) from err
    if not isinstance(model, nn.Module):
        raise ModelFileError(
            f"{path}:{name}() returned a {type(model).__name__}, expected a torch.nn.Module"
        )
    return model


def _looks_like_model(value: Any) -> bool:
    return isinstance(value, nn.Module) or (
        inspect.isclass(value) and issubclass(value, nn.Module) and value.__module__ != "torch.nn"
    )


def _call_hook(module: ModuleType, hook: str, path: Path, *, required: bool) -> Any:
    fn = getattr(module, hook, None)
    if fn is None:
        if required:
            raise ModelFileError(
                f"{path} has no {hook}(): define it to return a tuple of tensors "
                "(positional inputs) or a dict of keyword tensors"
            )
        return None
    try:
        return fn()
    except Exception as err:
        raise ModelFileError(
            f"{path}: {hook}() failed{_user_frame(err, path)}: {type(err).__name__}: {err}"
        ) from err


def _forward_params(model: nn.Module) -> list[str]:
    return [
        p.name
        for p in inspect.signature(model.forward).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


def named_inputs(
    params: list[str],
    raw: Any,
    path: Path,
    taker: str = "forward()",
    hook: str = "example_inputs()",
) -> dict[str, torch.Tensor]:
    """``raw`` (a tensor, tuple or dict, as ``hook`` gave it) named by forward's ``params``."""
    if isinstance(raw, torch.Tensor):
        raw = (raw,)
    if isinstance(raw, (tuple, list)):
        if len(raw) > len(params):
            raise ModelFileError(
                f"{path}: {hook} gives {len(raw)} values but {taker} takes "
                f"{len(params)} ({', '.join(params)})"
            )
        named = dict(zip(params, raw))
    elif isinstance(raw, dict):
        unknown = [k for k in raw if k not in params]
        if unknown:
            raise ModelFileError(
                f"{path}: {hook} has keys {unknown} that {taker} does not take "
                f"({', '.join(params)})"
            )
        named = {k: raw[k] for k in params if k in raw}
    else:
        raise ModelFileError(
            f"{path}: {hook} returned a {type(raw).__name__}; "
            "expected a tuple of tensors or a dict of keyword tensors"
        )
    problem = non_tensor_input(named)
    if problem:
        raise ModelFileError(f"{path}: {problem}")
    return named


def _user_frame(err: BaseException, path: Path) -> str:
    line = innermost_in(err, path)
    return f" at {path.name}:{line}" if line is not None else ""


def recorded_model(
    model: str | None,
    directory: Path,
    manifest: Manifest,
    *,
    allow_stale: bool = False,
    build: bool = True,
) -> ModelSpec:
    """The model file ``model`` if given, else the one the emitted ``manifest`` records;
    ``build=False`` reads its hooks without building the model (see ``load_model_file``).

    Raises:
        ModelFileError: the recorded file changed since the directory was compiled (its
            sha256 differs from the manifest's), unless ``allow_stale``.
    """
    names = list(manifest.inputs)
    if model:
        return load_model_file(model, build=build, input_names=names)
    recorded = manifest.model
    if recorded is None or not recorded.file:
        raise ModelFileError(
            f"{directory}/{MANIFEST} records no model file; pass --model FILE.py[:NAME]"
        )
    path = (Path(directory) / recorded.file).resolve()
    if not allow_stale:
        check_fresh(directory, manifest)
    return load_model_file(f"{path}:{recorded.name}", build=build, input_names=names)


def check_fresh(
    directory: Path, manifest: Manifest, *, allowed: str = "pass --allow-stale to use"
) -> None:
    """Refuse a compiled ``directory`` whose model file changed after it was compiled (its
    sha256 is not the manifest's): its stages, weights and plans may no longer be that model.
    A directory compiled from Python, or whose file is gone, has nothing to compare.

    Raises:
        ModelFileError: naming the file, the directory, the recompile command and
            ``allowed`` (how to go on with the compiled stages as they are).
    """
    recorded = manifest.model
    if recorded is None or not recorded.file or recorded.file_sha256 is None:
        return
    path = (Path(directory) / recorded.file).resolve()
    if not path.is_file() or file_fingerprint(path) == recorded.file_sha256:
        return
    raise ModelFileError(
        f"{directory} is stale: {path} changed after it was compiled, so the compiled stages "
        f"may no longer be that model; recompile ({recompile_command(directory, manifest)}), "
        f"or {allowed} the compiled stages as they are"
    )


def recompile_command(directory: Path, manifest: Manifest) -> str:
    """The command that compiles ``directory`` again from its recorded model file: its
    stage count, schedule and micro-batches as the manifest records them (a plan the search
    chose is searched again)."""
    recorded = manifest.model
    assert recorded is not None and recorded.file
    path = (Path(directory) / recorded.file).resolve()
    if manifest.plan is not None:
        devices = max(manifest.device_map, default=0) + 1
        shape = f"--devices {devices}"
    else:
        shape = (
            f"--stages {len(manifest.stages)} --schedule {manifest.schedule} "
            f"--microbatches {manifest.microbatches}"
        )
    more = " --generate" if manifest.generate else ""
    return f"`pipecompile {path}:{recorded.name} {shape}{more} -o {directory}`"


def _symbol(value: Any) -> bool:
    """A symbol name, or (name, positive maximum)."""
    if isinstance(value, str):
        return True
    return (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
        and value[1] > 0
    )


def dynamic_shapes(spec: ModelSpec) -> dict[str, dict[int, Any]] | None:
    """The model file's ``dynamic_shapes()``: input name -> dimension -> symbol, the
    dimensions batches may vary in (None without the hook).

    Raises:
        ModelFileError: the hook fails or returns something else.
    """
    raw = _call_hook(spec.module, "dynamic_shapes", spec.path, required=False)
    if raw is None:
        return None
    ok = isinstance(raw, dict) and all(
        isinstance(name, str)
        and isinstance(dims, dict)
        and all(isinstance(d, int) and _symbol(s) for d, s in dims.items())
        for name, dims in raw.items()
    )
    if not ok:
        raise ModelFileError(
            f"{spec.path}: dynamic_shapes() returned {type(raw).__name__} {str(raw)[:80]}; "
            "return {input name: {dimension: symbol or (symbol, maximum)}}, e.g. "
            '{"idx": {0: "batch", 1: ("seq", 128)}}'
        )
    return raw
