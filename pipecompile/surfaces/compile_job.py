"""One compile, from options to a proved directory: what `pipecompile MODEL` and
``pipecompile.compile`` both run.

``check_compile_options`` refuses what is wrong with the options alone (before a model file loads);
``compile_into`` compiles the model with them (the plan search and ``--tune`` included),
writes the directory and proves it against the model unless ``no_verify``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.codegen.prove import proof_example
from pipecompile.codegen.weight_sources import WeightPlan, weight_plan
from pipecompile.compiler import compile_model
from pipecompile.compiler.options import CompileOptions
from pipecompile.errors import PipecompileError, PlanError, WeightsError
from pipecompile.frontend.kept_traces import traces_kept
from pipecompile.ir.records.compiled import Compiled
from pipecompile.ir.records.plan_record import PlanRow
from pipecompile.model.init_recipe import is_meta_model
from pipecompile.model.kv_cache import CACHE_NOTE, without_kv_cache
from pipecompile.surfaces.loss_probe import loss_coupling

__all__ = ["check_compile_options", "compile_into"]


def check_compile_options(options: CompileOptions, out: Path) -> bool:
    """Refuse the options that are wrong whatever the model (the search's, the schedule's,
    ``-o``'s, ``--allow-missing``'s); returns whether the plan is searched.

    Raises:
        PipecompileError: a subclass naming the option and what to give instead.
    """
    from pipecompile.codegen.output_dir import check_replaceable
    from pipecompile.planner.choose import check_search, open_choices
    from pipecompile.schedules import compute_program

    o = options
    schedule, microbatches, searching = open_choices(o.devices, o.schedule, o.microbatches)
    if o.tune and not searching:
        raise PlanError(
            f"--tune {o.tune} measures the best plans a search found: give --devices N "
            "(or --schedule auto / --microbatches auto)"
        )
    machine = o.cost_model()  # bad machine flags fail here, before the model loads
    if searching or o.stages is None:
        replicas = () if o.replicate else None
        check_search(
            o.devices,
            o.stages,
            replicas,
            o.balance,
            o.memory_budget,
            machine,
            schedule,
            o.virtual_stages,
        )
    else:
        assert isinstance(microbatches, int)
        compute_program(
            schedule,
            o.stages,
            microbatches,
            virtual_stages=o.virtual_stages,
            vertical_sync=o.vertical_sync,
        )
    check_replaceable(out, force=o.force)
    loose = [
        f
        for f, v in (
            ("--max-length", o.max_length),
            ("--lanes", o.lanes),
            ("--lane-rows", o.lane_rows),
        )
        if v is not None
    ]
    if loose and not o.generate:
        raise PlanError(
            f"{', '.join(loose)} without --generate: add --generate (they size its KV cache)"
        )
    if o.allow_missing and o.weights is None:
        raise WeightsError("--allow-missing applies to --weights; pass --weights PATH or drop it")
    return searching


def compile_into(
    model: nn.Module,
    inputs: dict[str, Any],
    options: CompileOptions,
    out: Path,
    *,
    model_ref: ModelRef,
    pretrained: Any = None,
    model_file: object = None,
    loss: tuple[Callable[..., torch.Tensor] | None, Sequence[Any] | None] = (None, None),
) -> tuple[Compiled, list[str]]:
    """Compile ``model`` on ``inputs`` as ``options`` ask, write it to ``out`` (proved against
    the model unless ``options.no_verify``), and return it with the notes the writing left.

    ``pretrained`` is ``options.weights`` already opened (or None: opened here);
    ``model_file`` the module whose ``init_weights`` a meta model's recipe replays;
    ``loss``: the model file's ``loss_fn`` and ``example_targets()``, where it has them (a
    loss over the whole batch is then found and computed so: ``surfaces/loss_probe``).

    Raises:
        PipecompileError: a subclass naming what is wrong with the model or the options.
    """
    _check_init_seed(options.init_seed, model)
    steps = _decoding_steps(model, inputs, options)  # a model that cannot decode: refused first
    weights = weight_plan(
        model,
        pretrained if pretrained is not None else options.weights,
        options.init_seed or 0,
        model_file,
        allow_missing=options.allow_missing,
    )
    # --tune's candidates trace once per micro-batch size; a KV cache is no training output
    with traces_kept(), without_kv_cache(model) as cached:
        if options.loss_coupling is None:
            options.loss_coupling = loss_coupling(model, inputs, *loss)
        compiled = compile_model(model, inputs, options)
        if options.tune:
            compiled = _tuned(model, inputs, options, compiled, model_ref, weights)
        notes = _emit_proved(model, inputs, options, compiled, out, model_ref, weights, steps)
    if cached:
        notes.insert(0, CACHE_NOTE.format(name=type(model).__name__))
    return compiled, notes


def _say(options: CompileOptions, text: str) -> None:
    if not options.quiet:
        print(text, file=sys.stderr)


def _emit_proved(
    model: nn.Module,
    inputs: dict[str, Any],
    options: CompileOptions,
    compiled: Compiled,
    out: Path,
    model_ref: ModelRef,
    weights: WeightPlan | None,
    steps: Any = None,
) -> list[str]:
    """Write ``compiled`` into ``out`` (proved unless ``--no-verify``), print what the
    writing and the proof took, and return the notes the writing left; ``steps``: the
    decoding steps ``--generate`` traced."""
    start = time.perf_counter()
    notes: list[str] = []
    timings: list[tuple[str, float]] = []
    generate = _generation(model, inputs, options, compiled, timings, steps)
    emit(
        compiled,
        out,
        model=model_ref,
        force=options.force,
        weights=weights,
        notes=notes,
        compile_stages=options.compile_stages,
        prove=None if options.no_verify else proof_example(model, inputs, compiled),
        timings=timings,
        generate=generate,
    )
    proving = sum(seconds for _, seconds in timings)
    _say(options, f"  {'emit':<22} {(time.perf_counter() - start - proving) * 1000:8.1f} ms")
    for name, seconds in timings:
        _say(options, f"  {name:<22} {seconds * 1000:8.1f} ms")
    return notes


def _example_ids(inputs: dict[str, Any]) -> Any:
    """The example's token ids (a 2-D LongTensor), or None."""
    import torch

    return next(
        (
            v
            for v in inputs.values()
            if isinstance(v, torch.Tensor) and v.dtype == torch.long and v.dim() == 2
        ),
        None,
    )


def _decoding_steps(model: nn.Module, inputs: dict[str, Any], options: CompileOptions) -> Any:
    """``--generate``: the model's prefill and decode steps, traced before the compile."""
    if not options.generate:
        return None
    from pipecompile.generation.plan import trace_generation

    ids = _example_ids(inputs)
    tokens = int(ids.shape[-1]) if ids is not None else 16
    return trace_generation(
        model, max_length=options.max_length, rows=options.lane_rows, prompt_tokens=tokens
    )


def _generation(
    model: nn.Module,
    inputs: dict[str, Any],
    options: CompileOptions,
    compiled: Compiled,
    timings: list[tuple[str, float]],
    steps: Any,
) -> tuple[dict[str, Any], dict[str, str | bytes]] | None:
    """``--generate``: the decoding plan of ``compiled`` over the traced ``steps`` and the
    files it adds (by name), proved on the example's first sequence unless ``--no-verify``
    (or the model has no weights)."""
    if steps is None:
        return None
    from pipecompile.generation.plan import plan_generation, prove_generation

    start = time.perf_counter()
    params = [[o for names in st.params.values() for o in names] for st in compiled.graph.stages]
    out = plan_generation(model, steps, params, lanes=options.lanes)
    out.sources = _generation_sources(out.split, out.plan.stages, type(model).__name__)
    out.plan = out.plan.with_digests(out.sources)
    timings.append(("trace generation", steps.seconds + time.perf_counter() - start))
    ids = _example_ids(inputs)
    if not options.no_verify and ids is not None and not is_meta_model(model):
        start = time.perf_counter()
        prove_generation(model, out, ids)
        timings.append(("verify generation", time.perf_counter() - start))
    for line in out.plan.lines():
        _say(options, line)
    return out.plan.to_json(), out.files()


def _generation_sources(split: dict[str, Any], count: int, label: str) -> dict[str, str]:
    """Each decoding stage file's source, by its name."""
    from pipecompile.codegen.device_literals import drop_device_literals
    from pipecompile.codegen.stage_source import step_source
    from pipecompile.files.names import decode_file, prefill_file
    from pipecompile.generation.stages import stage_class

    out = {}
    for kind, file in (("decode", decode_file), ("prefill", prefill_file)):
        what = "one token a row" if kind == "decode" else "a prompt's tokens"
        for s in split[kind]:
            drop_device_literals(s.module)
            doc = f"Stage {s.index} of {count} of {label}'s {kind} step ({what}), by pipecompile."
            cls = stage_class(kind, s.index)
            out[file(s.index)] = step_source(s.module, cls, doc, s.inputs, s.outputs)
    return out


def _tuned(
    model: nn.Module,
    inputs: dict[str, Any],
    options: CompileOptions,
    compiled: Compiled,
    model_ref: ModelRef,
    weights: WeightPlan | None,
) -> Compiled:
    """``--tune K``: the measured best of the search's K best plans, each compiled with the
    same options, every choice fixed to the plan's."""
    from pipecompile.planner.tune import tune

    assert options.tune is not None

    def rebuild(p: PlanRow) -> Compiled:
        fixed = replace(
            options,
            devices=options.devices or options.stages,
            stages=p.stages,
            microbatches=p.microbatches,
            schedule=p.schedule,
            virtual_stages=p.virtual_stages,
            recompute=p.recompute,
            ranks=p.devices_used,
            quiet=True,
        )
        return compile_model(model, inputs, fixed)

    def write(c: Compiled, directory: Path) -> None:
        emit(c, directory, model=model_ref, weights=weights, compile_stages=options.compile_stages)

    say = None if options.quiet else lambda line: _say(options, f"  {line}")
    return tune(compiled, options.tune, rebuild=rebuild, write=write, say=say)


def _check_init_seed(seed: int | None, model: object) -> None:
    """--init-seed seeds the initialisation of meta tensors only: refused for a model
    built with its weights, where it would change nothing."""
    if seed is not None and not is_meta_model(model):
        raise PipecompileError(
            f"--init-seed {seed} seeds the initialisation of a model built on the meta "
            f"device, but {type(model).__name__} was built with its weights, which it would "
            "not change: drop it (seed build_model() itself, e.g. torch.manual_seed)"
        )
