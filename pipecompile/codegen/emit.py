"""Write a compiled pipeline to a directory: stage sources, weights, program, manifest.

The directory is built beside the target under a temporary name and renamed into place only
when complete, so a failure never leaves a half-written directory or destroys a previous one.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_model

from pipecompile import __version__
from pipecompile.codegen.lower import lower_stage
from pipecompile.codegen.stage_source import class_name, stage_source
from pipecompile.compiler import Compiled
from pipecompile.errors import EmitError
from pipecompile.stage_graph import StageGraph
from pipecompile.viz.layers import layer_groups

__all__ = ["ModelRef", "emit", "swap_into_place", "FORMAT", "MANIFEST"]

FORMAT = "pipecompile/1"
MANIFEST = "manifest.json"
PROGRAM = "program.txt"


@dataclass(frozen=True)
class ModelRef:
    """Where the model came from: its file and factory name (None when compiled from Python)."""

    file: Path | None
    name: str
    label: str


def emit(compiled: Compiled, out: Path, *, model: ModelRef) -> Path:
    """Write ``compiled`` to directory ``out`` (replacing a previous pipecompile output there).

    Raises:
        EmitError: ``out`` is a file, or a non-empty directory that pipecompile did not write.
    """
    out = Path(out)
    _check_target(out)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        _write_all(compiled, tmp, model, out)
        swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _check_target(out: Path) -> None:
    if out.is_file():
        raise EmitError(f"output {str(out)!r} is a file; pass a directory with -o")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise EmitError(
            f"output directory {str(out)!r} is not empty and holds no {MANIFEST}; "
            "pipecompile only replaces its own output - choose another -o"
        )
    out.parent.mkdir(parents=True, exist_ok=True)


def _write_all(compiled: Compiled, tmp: Path, model: ModelRef, out: Path) -> None:
    graph = compiled.graph
    count = len(graph.stages)
    for stage in graph.stages:
        lowered = lower_stage(stage)
        source = stage_source(stage, lowered, num_stages=count, model=model.label)
        (tmp / f"stage_{stage.index}.py").write_text(source)
        save_model(lowered, str(tmp / f"stage_{stage.index}.safetensors"))
    (tmp / PROGRAM).write_text(str(compiled.program))
    manifest = build_manifest(compiled, model, out)
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def build_manifest(compiled: Compiled, model: ModelRef, out: Path) -> dict[str, object]:
    """The manifest as a JSON-ready dict (documented in docs/FORMAT.md)."""
    graph, program = compiled.graph, compiled.program
    model_file = None
    if model.file is not None:
        model_file = os.path.relpath(Path(model.file).resolve(), Path(out).resolve())
    return {
        "format": FORMAT,
        "pipecompile_version": __version__,
        "model": {"file": model_file, "name": model.name, "tracer": graph.tracer},
        "inputs": list(graph.model_inputs),
        "input_values": _input_values(graph),
        "outputs": list(graph.model_outputs),
        "output_spec": graph.output_spec,
        "batch_dim": 0,
        "microbatches": program.microbatches,
        "microbatch_size": compiled.microbatch_size,
        "schedule": program.schedule,
        "device_map": list(program.stage_device),
        "replicas": list(compiled.replicas or [1] * len(graph.stages)),
        "balance": compiled.balance,
        "program": PROGRAM,
        "stages": [
            {
                "file": f"stage_{s.index}.py",
                "class": class_name(s.index),
                "weights": f"stage_{s.index}.safetensors",
                "inputs": list(s.inputs),
                "outputs": list(s.outputs),
                "params": {name: list(originals) for name, originals in s.params.items()},
                "flops": s.flops,
                "param_bytes": s.param_bytes,
                "device": program.stage_device[s.index],
                **_activation_bytes(compiled, s.index),
                "layers": [[path, ops] for path, ops in layer_groups(s.module.graph)],
            }
            for s in graph.stages
        ],
        "edges": [
            {
                "value": e.value,
                "src": e.src,
                "dst": e.dst,
                "shape": list(e.shape),
                "dtype": e.dtype,
                "bytes": e.nbytes,
            }
            for e in graph.edges
        ],  # fmt: skip
    }


def _input_values(graph: StageGraph) -> list[dict[str, object]]:
    """Shape and dtype of each tensor model input per micro-batch (stage 0's placeholders)."""
    placeholders = [n for n in graph.stages[0].module.graph.nodes if n.op == "placeholder"]
    values: list[dict[str, object]] = []
    for name, node in zip(graph.model_inputs, placeholders):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            dtype = str(val.dtype).removeprefix("torch.")
            values.append({"value": name, "shape": list(val.shape), "dtype": dtype})
    return values


def _activation_bytes(compiled: Compiled, j: int) -> dict[str, object]:
    if not compiled.memory:
        return {}
    mem = compiled.memory[j]
    return {"activation_bytes": {"saved": mem.saved, "inputs": mem.inputs}}


def swap_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished directory ``tmp`` to ``out``; a previous ``out`` is moved aside
    first and removed only once the new one is in place."""
    if not out.exists():
        tmp.rename(out)
        return
    old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
    out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
