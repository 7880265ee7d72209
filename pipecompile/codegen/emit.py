"""Write a compiled pipeline to a directory: stage sources, weights, program, manifest.

The directory is built beside the target under a temporary name and renamed into place only
when complete, so a failure never leaves a half-written directory or destroys a previous one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file, save_model
from torch.utils import _pytree as pytree

from pipecompile import __version__
from pipecompile.codegen.device_literals import drop_device_literals
from pipecompile.codegen.output_dir import (
    check_replaceable,
    kept_note,
    new_temp_dir,
    replace_output,
)
from pipecompile.codegen.prove import Example, StageFiles, prove_stages
from pipecompile.codegen.stage_source import TAIL_CLASS, class_name, stage_source, tail_source
from pipecompile.codegen.weight_sources import (
    StageSources,
    WeightPlan,
    stage_sources,
    unused_in_pretrained,
)
from pipecompile.errors import EmitError, PipecompileError
from pipecompile.files import names as files
from pipecompile.files.disk import disk_message, os_error
from pipecompile.files.names import INIT, INIT_CONSTANTS, MODEL_CONFIGS, PROGRAM, TAIL
from pipecompile.ir.graph.dynamic import fixed_batch_note
from pipecompile.ir.graph.graph_copy import copy_graph_module
from pipecompile.ir.graph.layers import layer_groups
from pipecompile.ir.graph.lower import lower_stage
from pipecompile.ir.graph.random_ops import random_nodes
from pipecompile.ir.graph.stage_graph import Stage, StageGraph
from pipecompile.ir.records.compiled import Compiled
from pipecompile.ir.records.manifest import (
    FORMAT,
    ActivationBytes,
    Edge,
    Manifest,
    ModelRecord,
    StageEntry,
    TailRecord,
    ValueSpec,
    WeightsRecord,
    write_manifest,
)
from pipecompile.model.fingerprint import file_fingerprint

__all__ = ["ModelRef", "emit", "build_manifest", "WeightPlan"]


@dataclass(frozen=True)
class ModelRef:
    """Where the model came from: its file and factory name (None when compiled from Python);
    ``configs``: a Hugging Face model's own configs (``model.model_configs``), written beside
    the stages for ``export``."""

    file: Path | None
    name: str
    label: str
    configs: dict[str, str] = field(default_factory=dict)
    unsaved: tuple[str, ...] = ()  # buffers the model's own state_dict() leaves out


def emit(
    compiled: Compiled,
    out: Path,
    *,
    model: ModelRef,
    force: bool = False,
    weights: WeightPlan | None = None,
    notes: list[str] | None = None,
    compile_stages: str | None = None,
    prove: Example | None = None,
    timings: list[tuple[str, float]] | None = None,
    generate: tuple[dict[str, Any], dict[str, str | bytes]] | None = None,
) -> Path:
    """Write ``compiled`` to directory ``out``, replacing a previous pipecompile output there
    (only the files it wrote; see ``output_dir``). ``weights`` says where tensors come from
    when not every value is written (``weight_sources``); ``compile_stages`` is the
    torch.compile backend runs use by default (the manifest's ``compile``); what a user
    should know about it (converted dtypes, pretrained tensors the model does not use) is
    appended to ``notes``. With ``prove``, the stage files are run on its micro-batch and
    compared with the eager model and the traced graph before the directory is put in place
    (``codegen.prove``); ``timings`` gets ``("verify", seconds)``.

    Raises:
        VerifyError: ``prove`` found a stage file that computes something else (nothing is
            written, and a previous directory at ``out`` is kept).
        EmitError: ``out`` is a file, cannot be created or written (a full disk: named),
            or holds files pipecompile did not write (unless ``force``: then they are kept,
            pipecompile's files are written beside them, and ``notes`` says so; a user's
            file named as one of pipecompile's is refused regardless).
        WeightsError: a tensor has no source, or the pretrained weights do not fit the model.
    """
    out = Path(out)
    keep = check_replaceable(out, force=force)
    tmp = new_temp_dir(out)
    try:
        written = _write_all(
            compiled, tmp, model, out, weights or WeightPlan(), notes, compile_stages, generate
        )
        if prove is not None:
            start = time.perf_counter()
            tail = (tmp / TAIL).read_text() if compiled.tail is not None else None
            prove_stages(compiled.graph, written, prove, tail)
            if timings is not None:
                timings.append(("verify", time.perf_counter() - start))
        replace_output(tmp, out, keep=keep)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        cause = (
            os_error(err) if not isinstance(err, (PipecompileError, KeyboardInterrupt)) else None
        )
        if cause is not None:  # a full disk, or a permission (safetensors wraps them)
            raise EmitError(disk_message("write output directory", out, cause)) from None
        raise
    if keep and notes is not None:
        notes.append(kept_note(out, keep))
    return out


def _write_all(
    compiled: Compiled,
    tmp: Path,
    model: ModelRef,
    out: Path,
    plan: WeightPlan,
    notes: list[str] | None,
    compile_stages: str | None,
    generate: tuple[dict[str, Any], dict[str, str | bytes]] | None = None,
) -> list[StageFiles]:
    """Write every file; return each stage as written (what ``prove_stages`` reads)."""
    graph = compiled.graph
    count = len(graph.stages)
    sources, randoms, written = [], [], []
    for stage in graph.stages:
        lowered = lower_stage(stage)
        drop_device_literals(lowered)
        randoms.append([n.name for n in random_nodes(lowered)])
        source = stage_source(stage, lowered, num_stages=count, model=model.label)
        (tmp / files.stage_file_name(stage.index)).write_text(source)
        found = stage_sources(stage, lowered, plan)
        weights = tmp / files.stage_weights(stage.index)
        if found.all_values:
            save_model(lowered, str(weights))
        elif found.values:
            save_file({k: v.contiguous() for k, v in found.values.items()}, str(weights))
        sources.append(found)
        whole = weights if found.all_values else None
        cls = class_name(stage.index)
        written.append(StageFiles(stage, source, cls, whole, lowered, bool(randoms[-1])))
    (tmp / PROGRAM).write_text(str(compiled.program))
    tail = compiled.tail
    if tail is not None:  # emit's own copy, without device literals as a stage's
        lowered = copy_graph_module(tail.module)
        drop_device_literals(lowered)
        (tmp / TAIL).write_text(tail_source(lowered, tail.inputs, model.label))
    for name, text in model.configs.items():
        (tmp / MODEL_CONFIGS[name]).write_text(text)
    init = _write_init(tmp, plan, sources)
    weights = _weights_entry(plan, sources, init, out)
    manifest = build_manifest(compiled, model, out, sources, randoms, weights)
    record = None
    if generate is not None:  # --generate: its record, its stages' files
        record, extra = generate
        for name, content in extra.items():
            path = tmp / name
            path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    write_manifest(tmp, replace(manifest, compile=compile_stages, generate=record))
    if notes is not None:
        notes.extend(_notes(plan, sources))
        if compiled.dynamic.fixed:
            notes.append(
                fixed_batch_note(
                    compiled.dynamic, compiled.microbatch_size, compiled.program.microbatches
                )
            )
    return written


def _write_init(tmp: Path, plan: WeightPlan, sources: list[StageSources]) -> str | None:
    """init.json: the recipe of every tensor a stage initialises (and the constants they
    copy, in init_constants.safetensors); None, "steps" or "constants": what was written."""
    wanted = sorted({name for s in sources for name in s.init.values()})
    if not wanted or plan.recipe is None:
        return None
    steps = {name: [step.to_json() for step in plan.recipe.steps[name]] for name in wanted}
    used = {c for name in wanted for c in _constants(steps[name])}
    record = {"seed": plan.seed, "methods": plan.recipe.methods, "tensors": steps}
    if used:
        save_file({k: plan.recipe.constants[k] for k in sorted(used)}, str(tmp / INIT_CONSTANTS))
        record["constants"] = INIT_CONSTANTS
    (tmp / INIT).write_text(json.dumps(record, indent=1) + "\n")
    return "constants" if used else "steps"


def _constants(raw: object) -> list[str]:
    if isinstance(raw, dict):
        if "const" in raw:
            return [raw["const"]]
        return [c for v in raw.values() for c in _constants(v)]
    if isinstance(raw, list):
        return [c for v in raw for c in _constants(v)]
    return []


def _weights_entry(
    plan: WeightPlan, sources: list[StageSources], init: str | None, out: Path
) -> WeightsRecord:
    """The manifest's ``weights``: where the tensors come from (docs/FORMAT.md)."""
    entry = WeightsRecord("stage_files")
    if init is not None:
        constants = INIT_CONSTANTS if init == "constants" else None
        entry = WeightsRecord("init", init=INIT, seed=plan.seed, init_constants=constants)
    if plan.pretrained is not None and any(s.pretrained for s in sources):
        root = plan.pretrained.path.resolve()
        base = root.parent if root.is_file() else root
        names = {n for s in sources for n in s.pretrained.values()}
        shards = sorted({os.path.relpath(plan.pretrained.files[n].resolve(), base) for n in names})
        where = os.path.relpath(root, Path(out).resolve())
        entry = dataclasses.replace(
            entry, source="checkpoint", shards=tuple(shards), pretrained=where
        )
    if plan.held is not None:
        entry = _with_held(entry, plan)
    return entry


def _with_held(entry: WeightsRecord, plan: WeightPlan) -> WeightsRecord:
    """How many of the model's tensors the pretrained weights gave, under which names, and which it
    lacked (initialised instead: --allow-missing)."""
    held = plan.held
    assert held is not None
    prefix = None
    if held.names.added:
        prefix = {"added": held.names.added}
    elif held.names.removed:
        prefix = {"removed": held.names.removed}
    missing = tuple(held.missing) or None
    return dataclasses.replace(
        entry, loaded=held.loaded, model_tensors=held.total, prefix=prefix, missing=missing
    )


def _notes(plan: WeightPlan, sources: list[StageSources]) -> list[str]:
    notes = []
    held = plan.held
    if held is not None and (held.names.added or held.names.removed):
        lacks = "lack the model's" if held.names.added else "carry the extra"
        notes.append(
            f"the names in {plan.pretrained.path} {lacks} prefix "  # type: ignore[union-attr]
            f"{(held.names.added or held.names.removed)!r}"
            f"{' (weights of the base model)' if held.names.added else ''}: read with the "
            f"{held.names}, as from_pretrained does"
        )
    if plan.loaded is not None:
        paths = ", ".join(p or "(the model)" for p in plan.own[:3])
        more = f" and {len(plan.own) - 3} more" if len(plan.own) > 3 else ""
        notes.append(
            f"{paths}{more} load state dicts with code of their own: {plan.pretrained.path} "  # type: ignore[union-attr]
            "was read whole and loaded through it, and the stage files hold what it gave"
        )
    if held is not None and held.missing:
        shown = ", ".join(held.missing[:10])
        more = f" and {len(held.missing) - 10} more" if len(held.missing) > 10 else ""
        notes.append(
            f"--allow-missing: {len(held.missing)} of the model's {held.total} tensors are not "
            f"in {plan.pretrained.path} and are initialised instead: {shown}{more}"  # type: ignore[union-attr]
        )
    converted = [c for s in sources for c in s.converted]
    if converted:
        notes.append(
            f"{len(converted)} pretrained tensors are converted to the model's dtype when "
            f"loaded (e.g. {converted[0]})"
        )
    unused = unused_in_pretrained(plan, sources)
    if unused:
        notes.append(
            f"{len(unused)} tensors of {plan.pretrained.path} are not in the model and are "  # type: ignore[union-attr]
            f"not loaded (e.g. {unused[0]})"
        )
    return notes


def build_manifest(
    compiled: Compiled,
    model: ModelRef,
    out: Path,
    sources: list[StageSources],
    randoms: list[list[str]],
    weights: WeightsRecord,
) -> Manifest:
    """The manifest (docs/FORMAT.md) of ``compiled`` written to ``out``: ``sources`` and
    ``randoms`` are each stage's tensor sources and random ops, ``weights`` where they come
    from."""
    graph, program = compiled.graph, compiled.program
    model_file = file_sha = None
    if model.file is not None:
        model_file = os.path.relpath(Path(model.file).resolve(), Path(out).resolve())
        file_sha = file_fingerprint(model.file)
    configs = {name: MODEL_CONFIGS[name] for name in model.configs} or None
    record = ModelRecord(
        model_file,
        model.name,
        graph.tracer,
        file_sha,
        compiled.fingerprint or None,
        configs,
        model.unsaved or None,
    )
    stages = zip(graph.stages, sources, randoms)
    return Manifest(
        format=FORMAT,
        pipecompile_version=__version__,
        model=record,
        inputs=tuple(graph.model_inputs),
        input_values=_input_values(graph),
        outputs=tuple(graph.model_outputs),
        output_spec=graph.output_spec,
        batch_dim=0,
        microbatches=program.microbatches,
        microbatch_size=compiled.microbatch_size,
        schedule=program.schedule,
        device_map=tuple(program.stage_device),
        replicas=tuple(compiled.replicas or [1] * len(graph.stages)),
        balance=compiled.balance,
        program=PROGRAM,
        stages=tuple(_stage_entry(compiled, s, found, names) for s, found, names in stages),
        edges=tuple(
            Edge(e.value, e.src, e.dst, tuple(e.shape), e.dtype, e.nbytes) for e in graph.edges
        ),
        weights=weights,
        plan=compiled.plan,
        dynamic=compiled.dynamic,
        batch_coupling=compiled.coupling,
        tail=_tail_record(compiled),
    )


def _tail_record(compiled: Compiled) -> TailRecord | None:
    tail = compiled.tail
    if tail is None:
        return None
    spec = pytree.treespec_dumps(tail.output_spec)
    return TailRecord(TAIL, TAIL_CLASS, tail.inputs, tail.outputs, spec)


def _stage_entry(
    compiled: Compiled, stage: Stage, found: StageSources, random_ops: list[str]
) -> StageEntry:
    j = stage.index
    written = bool(found.values or found.all_values)
    return StageEntry(
        file=files.stage_file_name(j),
        class_name=class_name(j),
        weights=files.stage_weights(j) if written else None,
        inputs=tuple(stage.inputs),
        outputs=tuple(stage.outputs),
        params={name: tuple(originals) for name, originals in stage.params.items()},
        flops=stage.flops,
        param_bytes=stage.param_bytes,
        device=compiled.program.stage_device[j],
        activation_bytes=_activation_bytes(compiled, j),
        layers=tuple((path, ops) for path, ops in layer_groups(stage.module.graph)),
        random_ops=tuple(random_ops),
        from_pretrained=found.pretrained or None,
        from_init=found.init or None,
    )


def _input_values(graph: StageGraph) -> tuple[ValueSpec, ...]:
    """Shape and dtype of each tensor model input per micro-batch (stage 0's placeholders)."""
    placeholders = [n for n in graph.stages[0].module.graph.nodes if n.op == "placeholder"]
    values: list[ValueSpec] = []
    for name, node in zip(graph.model_inputs, placeholders):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            dtype = str(val.dtype).removeprefix("torch.")
            values.append(ValueSpec(name, tuple(val.shape), dtype))
    return tuple(values)


def _activation_bytes(compiled: Compiled, j: int) -> ActivationBytes | None:
    if not compiled.memory:
        return None
    mem = compiled.memory[j]
    return ActivationBytes(mem.saved, mem.inputs)
