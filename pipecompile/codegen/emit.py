"""Write a compiled pipeline to a directory: stage sources, weights, program, manifest.

The directory is built beside the target under a temporary name and renamed into place only
when complete, so a failure never leaves a half-written directory or destroys a previous one.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_model

from pipecompile import __version__
from pipecompile.codegen.output_dir import (
    FORMAT,
    MANIFEST,
    check_replaceable,
    new_temp_dir,
    replace_output,
)
from pipecompile.codegen.stage_source import class_name, stage_source
from pipecompile.errors import EmitError
from pipecompile.ir.compiled import Compiled
from pipecompile.ir.layers import layer_groups
from pipecompile.ir.lower import lower_stage
from pipecompile.ir.stage_graph import StageGraph
from pipecompile.model.fingerprint import file_fingerprint

__all__ = ["ModelRef", "emit", "FORMAT", "MANIFEST"]

PROGRAM = "program.txt"


@dataclass(frozen=True)
class ModelRef:
    """Where the model came from: its file and factory name (None when compiled from Python)."""

    file: Path | None
    name: str
    label: str


def emit(compiled: Compiled, out: Path, *, model: ModelRef, force: bool = False) -> Path:
    """Write ``compiled`` to directory ``out``, replacing a previous pipecompile output there
    (only the files it wrote; see ``output_dir``).

    Raises:
        EmitError: ``out`` is a file, cannot be created, or holds files pipecompile did not
            write (unless ``force``: then they are kept and pipecompile's files written
            beside them).
    """
    out = Path(out)
    keep = check_replaceable(out, force=force)
    tmp = new_temp_dir(out)
    try:
        _write_all(compiled, tmp, model, out)
        replace_output(tmp, out, keep=keep)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise EmitError(f"cannot write {str(out)!r}: {err.strerror or err}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


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
    model_file = file_sha = None
    if model.file is not None:
        model_file = os.path.relpath(Path(model.file).resolve(), Path(out).resolve())
        file_sha = file_fingerprint(model.file)
    return {
        "format": FORMAT,
        "pipecompile_version": __version__,
        "model": {
            "file": model_file,
            "name": model.name,
            "tracer": graph.tracer,
            "file_sha256": file_sha,
            "graph_sha256": compiled.fingerprint or None,
        },  # fmt: skip
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
