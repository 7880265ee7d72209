"""The compiler driver: runs the table of passes in order, each once, checks the IR after each,
times them."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from pipecompile.compiler import checks
from pipecompile.compiler.pass_names import PASS_ALIASES, PASSES
from pipecompile.errors import InternalError, MicrobatchError, PipecompileError, TraceError
from pipecompile.frontend.fake_prop import fake_values
from pipecompile.frontend.kept_traces import kept_trace
from pipecompile.frontend.quiet_logs import quiet_logs
from pipecompile.frontend.tail_cut import cut_tail
from pipecompile.frontend.tracer import fixed_batch_view, trace
from pipecompile.ir.graph.dynamic import DynamicDims, asked_dims, asked_maxima, with_batch
from pipecompile.ir.graph.microbatch import check_divides, split_microbatches
from pipecompile.ir.graph.split_point import split_requests
from pipecompile.ir.graph.stage_graph import StageGraph
from pipecompile.ir.graph.tail import Tail
from pipecompile.ir.graph.traced import Traced
from pipecompile.ir.programs.cost_model import CostModel
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.recompute_policy import check_policy
from pipecompile.ir.programs.topology import topology
from pipecompile.ir.programs.whole_batch import waits_for_whole_batch
from pipecompile.ir.records.balance_report import BalanceReport
from pipecompile.ir.records.batch_coupling import Coupling
from pipecompile.ir.records.compiled import Compiled
from pipecompile.ir.records.plan_record import PlanRecord
from pipecompile.model.fingerprint import graph_fingerprint
from pipecompile.model.init_recipe import is_meta_model
from pipecompile.passes import (
    activation_memory,
    annotate_costs,
    balance_stages,
    batch_facts,
    dynamic_dims,
    graph_plan,
    insert_communication,
    insert_recompute,
    insert_replication,
    profile_costs,
    split_stages,
)
from pipecompile.passes.batch_coupling import BatchFacts
from pipecompile.planner.choose import choose_plan, open_choices
from pipecompile.schedules import (
    GRAPHS,
    REPLICABLE,
    WHOLE_BATCH,
    compute_program,
    devices_for,
    listed,
    schedule_of,
    why_chain_only,
)

if TYPE_CHECKING:
    from pipecompile.compiler.options import CompileOptions

__all__ = ["PASSES", "PASS_ALIASES", "TABLE", "Pass", "Compiled", "compile_model"]

IR = dict[str, Any]  # the IR values by name: what the passes take and give


@dataclass(frozen=True)
class Request:
    """What compile_model was asked: the model, one micro-batch of its inputs, the options
    as given, and what they settle to (the plan search's choices where it ran, the parsed
    pins, replicas and dimensions). A pass reads an option nothing settles from
    ``options`` itself."""

    model: nn.Module
    micro: dict[str, torch.Tensor]
    meta: bool  # the model has no weights: traced on meta inputs, never run
    options: CompileOptions
    stages: int
    microbatches: int
    schedule: str
    virtual_stages: int | None
    recompute: str
    replicas: tuple[int, ...] | None
    machine: CostModel
    split_at: tuple[str, ...]
    pinned: dict[str, int] | None
    dynamic: dict[str, dict[int, str]] | None = None  # input -> dim -> symbol (--dynamic)
    maxima: dict[str, int] | None = None  # symbol -> the largest size the model file states
    batch: bool = True  # also try to let the batch vary (not with --dynamic none)
    plan: PlanRecord | None = None  # the plan search's record, where it ran

    @property
    def progress(self) -> bool:
        return not self.options.quiet

    @property
    def varying(self) -> dict[str, dict[int, str]]:
        """The dimensions traced as symbols: those asked for, and the batch."""
        asked = self.dynamic or {}
        return with_batch(asked, self.micro) if self.batch else asked


@dataclass(frozen=True)
class Pass:
    """One row of the table: the pass ``run(request, ir)`` reads the values named ``takes``
    and returns those named ``gives`` (a tuple when several); ``check`` (cheap) runs after
    it always, ``verify`` (expensive) under ``verify_each`` and, for the last pass, always;
    a pass whose ``when`` is false for the request is skipped."""

    name: str
    run: Callable[[Request, IR], Any]
    takes: tuple[str, ...]
    gives: tuple[str, ...]
    check: Callable[[IR], None]
    verify: Callable[[IR], None] | None = None
    when: Callable[[Request], bool] | None = None


def _schedule(r: Request, ir: IR) -> Program:
    # First: it needs no graph, so bad schedule options fail before tracing.
    compute = compute_program(r.schedule, r.stages, r.microbatches, virtual_stages=r.virtual_stages,
                       vertical_sync=r.options.vertical_sync)  # fmt: skip
    _check_options(r, compute)
    return compute


def _trace(r: Request, ir: IR) -> Traced:
    shown = {k: v.to("meta") for k, v in r.micro.items()} if r.meta else r.micro
    options = (_frozen(r.varying), _frozen(r.dynamic or {}), r.microbatches)
    return kept_trace(r.model, shown, options, lambda: _trace_now(r, shown))


def _frozen(dims: dict[str, dict[int, str]]) -> tuple:
    return tuple((name, tuple(sorted(d.items()))) for name, d in sorted(dims.items()))


def _trace_now(r: Request, shown: dict[str, torch.Tensor]) -> Traced:
    # a view hard-coding the example batch is looked for only on the try whose error shows
    first = r.microbatches if r.dynamic or not r.varying else 1
    try:
        return trace(r.model, shown, r.varying or None, microbatches=first)
    except TraceError:
        if r.dynamic or not r.varying:
            raise
    # the batch alone was not asked for: dynamic_dims says
    return trace(r.model, shown, None, microbatches=r.microbatches)


_FACTS = "pipecompile_batch_facts"  # where a traced graph keeps what batch_coupling found


def _coupling(r: Request, ir: IR) -> tuple[tuple[Coupling, ...] | None, BatchFacts | None]:
    traced = ir["traced"]
    if _FACTS not in traced.module.meta:  # a kept trace (``traces_kept``) is analysed once
        inputs = [r.micro[n] for n in traced.input_names]
        traced.module.meta[_FACTS] = batch_facts(traced.module, inputs=inputs)
    facts = traced.module.meta[_FACTS]
    if facts is None:
        return None, None
    found = facts.couplings
    if not any(c.kind == "tail" for c in found):  # a tail's scalar outputs are the whole batch's
        checks.refuse_scalar_outputs(traced.module, r.microbatches)  # the plainer message
    waiting = None if r.schedule in WHOLE_BATCH else WHOLE_BATCH
    checks.refuse_mixed_batches(found, r.microbatches, r.replicas, waiting)
    return found, facts


def _cut(r: Request, ir: IR) -> tuple[Traced, Tail | None]:
    traced, facts = ir["traced"], ir["batch_facts"]
    starts = [c.node for c in (facts.couplings if facts is not None else ()) if c.kind == "tail"]
    if not starts:
        return traced, None
    return cut_tail(traced, starts, facts, [r.micro[n] for n in traced.input_names])


def _annotate(r: Request, ir: IR) -> Any:
    annotated = annotate_costs(ir["traced"].module, root=ir["traced"].root)
    checks.refuse_scalar_outputs(annotated, r.microbatches)  # each value's shape known now
    return annotated


def _profile(r: Request, ir: IR) -> Any:
    inputs = [r.micro[n] for n in ir["traced"].input_names]
    return profile_costs(ir["annotated"], inputs=inputs, progress=r.progress)


def _balance(r: Request, ir: IR) -> Any:
    return balance_stages(
        ir["annotated"], stages=r.stages, cost=r.options.balance, split_at=r.split_at,
        pinned=r.pinned,
        machine=r.machine, program=ir["compute"], recompute=r.recompute,
    )  # fmt: skip


def _graph_plan(r: Request, ir: IR) -> Any:
    chain = (ir["balanced"], ir["balance"], ir["compute"])
    return graph_plan(
        ir["annotated"],
        chain,
        cost=r.options.balance,
        pinned=r.pinned,
        machine=r.machine,
        force=r.options.graph,
    )


def _split(r: Request, ir: IR) -> StageGraph:
    stages = len(ir["balance"].stage_ops)
    return split_stages(
        ir["balanced"], traced=ir["traced"], sizes_follow=bool(r.varying), stages=stages
    )


def _dynamic(r: Request, ir: IR) -> DynamicDims:
    found = dynamic_dims(
        ir["balanced"], ir["graph"], r.micro, asked=r.dynamic, evaluate=fake_values, batch=r.batch
    )
    view = fixed_batch_view(r.model, r.micro) if found.fixed and not r.meta else None
    return replace(found, maxima=dict(r.maxima or {}), fixed=view or found.fixed)


def _memory(r: Request, ir: IR) -> Any:
    # a stage whose sizes follow its data is bounded where fake tensors fail: torch's own log
    # of that failure is no news to the user
    with quiet_logs("torch._subclasses.fake_tensor"):
        return activation_memory(ir["graph"])


def _recompute(r: Request, ir: IR) -> Program:
    flops = [s.flops for s in ir["graph"].stages]
    return insert_recompute(ir["compute"], memory=ir["memory"], flops=flops,
                            policy=r.recompute, budget=r.options.memory_budget)  # fmt: skip


def _communicate(r: Request, ir: IR) -> Program:
    return insert_communication(ir["recomputed"], topology=topology(ir["graph"]))


def _replicate(r: Request, ir: IR) -> Program:
    return insert_replication(ir["communicating"], replicas=_replica_counts(r, ir["balance"]))


def _graph_check(key: str) -> Callable[[IR], None]:
    return lambda ir: checks.repropagate(ir[key] if key != "traced" else ir[key].module)


def _program_check(key: str) -> Callable[[IR], None]:
    return lambda ir: checks.check_program(ir[key])


# The passes, in the order they run, each once; `--print-after NAME` prints what a pass gives.
# `insert_recompute` runs after `activation_memory`, whose bytes a --memory-budget needs; the
# balancer models the --recompute policy's stored activations itself (ir/recompute_policy).
TABLE: tuple[Pass, ...] = (
    Pass("schedule", _schedule, (), ("compute",), _program_check("compute"),
         lambda ir: checks.verify_compute(ir["compute"])),
    Pass("trace", _trace, (), ("traced",), checks.lint_traced, _graph_check("traced")),
    Pass("batch_coupling", _coupling, ("traced",), ("coupling", "batch_facts"), lambda ir: None,
         when=lambda r: not r.meta),
    Pass("cut_tail", _cut, ("traced", "batch_facts"), ("traced", "tail"), checks.lint_traced,
         _graph_check("traced"), when=lambda r: not r.meta),
    Pass("annotate_costs", _annotate, ("traced",), ("annotated",), checks.lint_annotated,
         _graph_check("annotated")),
    Pass("profile_costs", _profile, ("traced", "annotated"), ("annotated",),
         checks.lint_annotated, _graph_check("annotated"),
         when=lambda r: r.options.balance == "time"),
    Pass("balance_stages", _balance, ("annotated", "compute"), ("balanced", "balance"),
         checks.check_balanced, _graph_check("balanced")),
    Pass("graph_plan", _graph_plan, ("annotated", "balanced", "balance", "compute"),
         ("balanced", "balance", "compute"), checks.check_balanced,
         when=lambda r: not r.options.chain and r.replicas is None and not r.options.generate),
    Pass("split_stages", _split, ("balanced", "traced"), ("graph",), checks.check_stage_graph,
         lambda ir: checks.lint_stages(ir["graph"])),
    Pass("dynamic_dims", _dynamic, ("balanced", "graph"), ("dynamic",), lambda ir: None,
         when=lambda r: bool(r.varying)),
    Pass("activation_memory", _memory, ("graph",), ("memory",), checks.check_memory),
    Pass("insert_recompute", _recompute, ("compute", "memory", "graph"), ("recomputed",),
         _program_check("recomputed"), lambda ir: checks.verify_compute(ir["recomputed"])),
    Pass("insert_communication", _communicate, ("recomputed", "graph"), ("communicating",),
         _program_check("communicating"),
         lambda ir: checks.verify_linked(ir["communicating"], ir["graph"])),
    Pass("insert_replication", _replicate, ("communicating", "balance"), ("program",),
         _program_check("program"), lambda ir: checks.verify_linked(ir["program"], ir["graph"])),
)  # fmt: skip
# the options name the passes from their own list (compiler.pass_names): it must be this table's
assert tuple(p.name for p in TABLE) == PASSES, "compiler/pass_names.py lists other passes"


def compile_model(
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    options: CompileOptions | None = None,
    **keywords: Any,
) -> Compiled:
    """Trace ``model`` on one micro-batch of ``inputs`` and compile it into stages and a program.

    Args:
        model: the model; it is not modified.
        inputs: the model's example mini-batch, by forward() parameter name.
        options: what to compile (``pipecompile.compiler.options.CompileOptions``, built once
            from the command line or the API's keywords); the compiler reads its stages,
            micro-batches, schedule, devices (the plan search), balance, split points, pins,
            virtual stages, vertical sync, recomputation, memory budget, replicas, machine,
            dynamic dimensions, ``print_after``, ``verify_each`` and ``quiet`` (progress
            lines on stderr); writing the directory (weights, ``--compile``, the proof) is
            ``pipecompile.surfaces.compile_job``'s.
        **keywords: instead of ``options``, its fields by their API names, as
            ``pipecompile.compile`` takes them (``stages=4, microbatches=8, machine=...``).

    Raises:
        PipecompileError: a subclass naming what is wrong with the model or the options.
        InternalError: a pass failed, or the IR it produced failed its check (a bug).
    """
    from pipecompile.compiler.options import CompileOptions

    if options is not None and keywords:
        raise PipecompileError("compile_model takes options or keywords, not both")
    options = options if options is not None else CompileOptions.from_keywords(**keywords)
    print_after = _print_after(options.print_after)
    request = _request(model, inputs, options)
    ir, timings = run_passes(request, print_after=print_after, verify_each=options.verify_each)
    micro = request.micro
    return Compiled(
        ir["graph"], ir["program"], next(iter(micro.values())).shape[0] if micro else 0,
        ir["memory"], _replica_counts(request, ir["balance"]), ir["balance"], timings,
        fingerprint=graph_fingerprint(ir["traced"].module), plan=request.plan,
        dynamic=ir.get("dynamic", DynamicDims()), coupling=_couplings(request, ir),
        tail=ir.get("tail"),
    )  # fmt: skip


def _couplings(r: Request, ir: IR) -> tuple[Coupling, ...] | None:
    """The traced graph's couplings and the loss function's, for the manifest."""
    found = ir.get("coupling")
    loss = r.options.loss_coupling
    if loss is None:
        return found
    return (*(found or ()), loss)


def _print_after(names: Sequence[str]) -> frozenset[str]:
    chosen = frozenset(PASS_ALIASES.get(name, name) for name in names)
    unknown = sorted(chosen - set(PASSES))
    if unknown:
        raise PipecompileError(
            f"--print-after {unknown[0]}: no such pass; passes: {', '.join(PASSES)}"
        )
    return chosen


def _request(model: nn.Module, inputs: dict[str, torch.Tensor], o: CompileOptions) -> Request:
    """The request ``o`` settles to: the plan search's choices where it runs, else the
    options' own."""
    cuts = split_requests(o.split_at)
    machine = o.cost_model()
    plan = None
    schedule, microbatches, searching = open_choices(o.devices, o.schedule, o.microbatches)
    stages, virtual_stages, recompute = o.stages, o.virtual_stages, o.recompute
    replicas = o.replicas(stages)
    if searching or stages is None:
        chosen, machine, plan = choose_plan(
            model, inputs, devices=o.devices, stages=stages, microbatches=microbatches,
            schedule=schedule, virtual_stages=virtual_stages, recompute=recompute,
            split_at=cuts, machine=machine, progress=not o.quiet, replicas=replicas,
            balance=o.balance, memory_budget=o.memory_budget, ranks=o.ranks,
            whole_loss=o.loss_coupling is not None,
            shapes=_shapes(o),
        )  # fmt: skip
        stages, microbatches, schedule = chosen.stages, chosen.microbatches, chosen.schedule
        virtual_stages, recompute = chosen.virtual_stages, chosen.recompute
        replicas = chosen.replicas or None
        o = replace(o, graph=chosen.graph, chain=not chosen.graph)  # the search's shape
        if devices_for(schedule, stages, virtual_stages) != stages:  # the search checked it
            machine = replace(machine, memory_limit=())
    assert isinstance(stages, int) and isinstance(microbatches, int)
    check_divides(inputs, microbatches)
    asked = asked_dims(o.dynamic, inputs)  # {}: --dynamic none, every size as traced
    return Request(
        model, split_microbatches(inputs, microbatches)[0], is_meta_model(model), o,
        stages, microbatches, schedule, virtual_stages, recompute, replicas, machine, cuts,
        o.pinned(), asked, asked_maxima(o.dynamic), asked != {}, plan,
    )  # fmt: skip


def run_passes(
    request: Request, *, print_after: frozenset[str] = frozenset(), verify_each: bool = False
) -> tuple[IR, tuple[tuple[str, float], ...]]:
    """Run every pass of TABLE that applies to ``request``, in order; return the IR values by
    name and the ``(name, seconds)`` timings."""
    ir: IR = {}
    timings: list[tuple[str, float]] = []
    todo = [p for p in TABLE if p.when is None or p.when(request)]
    for k, step in enumerate(todo):
        start = time.perf_counter()
        _give(step, _guarded(step.name, "failed", step.run, request, ir), ir)
        _guarded(step.name, "produced a bad IR", step.check, ir)
        _record(timings, step.name, start, request.progress)
        if step.verify is not None and (verify_each or k == len(todo) - 1):
            start = time.perf_counter()
            _guarded(step.name, "produced a bad IR", step.verify, ir)
            if verify_each:
                _record(timings, f"verify {step.name}", start, request.progress)
            else:  # the final check, timed with the last pass as it always was
                name, seconds = timings.pop()
                timings.append((name, seconds + time.perf_counter() - start))
        if step.name in print_after:
            print(f"--- IR after {step.name} ---\n{_ir_text(ir[step.gives[0]])}")
    return ir, tuple(timings)


def _give(step: Pass, result: Any, ir: IR) -> None:
    values = result if len(step.gives) > 1 else (result,)
    ir.update(zip(step.gives, values, strict=True))


def _guarded(name: str, what: str, run: Callable[..., Any], *args: Any) -> Any:
    """``run(*args)``; a user's error passes through, anything else is our bug in pass
    ``name``."""
    try:
        return run(*args)
    except PipecompileError as err:  # the user's to fix, such as a tie under PipeDream
        if what != "failed":
            err.add_note(f"(found by the check after pass {name})")
        raise
    except Exception as err:
        raise InternalError(_bug(name, what, err)) from err


def _bug(name: str, what: str, err: Exception) -> str:
    return (
        f"pass {name} {what}: {type(err).__name__}: {err}\n"
        "This is a pipecompile bug; please report it with the model file."
    )


def _record(timings: list[tuple[str, float]], name: str, start: float, progress: bool) -> None:
    seconds = time.perf_counter() - start
    timings.append((name, seconds))
    if progress:
        print(f"  {name:<22} {seconds * 1000:8.1f} ms", file=sys.stderr)


def _shapes(o: CompileOptions) -> tuple[str, ...]:
    """The plan shapes a search prices: chains only with --chain or --generate (decoding
    runs the stages as a chain), stage graphs only with --graph, else both."""
    if o.chain or o.generate:
        return ("chain",)
    return ("graph",) if o.graph else ("chain", "graph")


def _replica_counts(r: Request, report: BalanceReport) -> tuple[int, ...]:
    return tuple(r.replicas or report.replicas or (1,) * (len(report.stage_ops) or r.stages))


def _check_options(r: Request, compute: Program) -> None:
    """The options that contradict each other or the schedule, before any tracing."""
    _check_machine(r.machine, compute, replicas=r.replicas, memory_budget=r.options.memory_budget)
    check_policy(r.recompute)
    whole = r.options.loss_coupling
    if whole is not None and r.microbatches > 1 and not waits_for_whole_batch(compute):
        raise MicrobatchError(
            f"{whole.op} is a loss over the whole batch: it is computed once a step on every "
            f"micro-batch's outputs, and {r.schedule} starts the last stage's backward before "
            f"its last forward, so it cannot wait for that loss; compile with --schedule "
            f"{' or '.join(WHOLE_BATCH)}, or --microbatches 1"
        )
    if whole is not None and r.replicas is not None and max(r.replicas) > 1:
        raise MicrobatchError(
            f"{whole.op} is a loss over the whole batch, and replicas of a stage would each "
            "see part of it; compile without --replicate"
        )
    if r.options.graph:
        _check_graph(r, compute)
    if r.meta and r.options.balance == "time":
        raise PipecompileError(
            f"--balance time measures each op on real weights, and {type(r.model).__name__} is "
            "on the meta device; balance on flops (the default) or params"
        )


def _check_graph(r: Request, compute: Program) -> None:
    """--graph's refusals: with --chain, a schedule that runs chains only, fixed boundaries
    or replicas, one device."""
    why = None
    if r.options.chain:
        why = "--chain asks for the opposite; give one of them"
    elif schedule_of(r.schedule).on_graph is None:
        why = f"{why_chain_only(schedule_of(r.schedule))}; use --schedule {listed(GRAPHS)}"
    elif r.replicas is not None or r.split_at:
        why = "a stage graph is cut by the graph's branches, not by --replicate or --split-at"
    elif len(compute.devices) < 2:
        why = "branches side by side need two devices or more; raise --stages"
    elif r.options.generate:
        why = "--generate decodes through the stages as a chain; compile without --graph"
    if why is not None:
        raise PipecompileError(f"--graph: {why}")


def _check_machine(
    machine: CostModel, compute: Program, *, replicas: tuple[int, ...] | None,
    memory_budget: int | None,
) -> None:  # fmt: skip
    machine.validate(len(compute.devices), compute.num_stages)
    if machine.workers is not None and replicas:
        raise PipecompileError(
            "--workers lets the balancer choose the replica counts; --replicate fixes them: "
            "give one of the two"
        )
    if (
        machine.workers is not None
        and machine.workers > compute.num_stages
        and not schedule_of(compute.schedule).replicable
    ):
        raise PipecompileError(
            f"--workers {machine.workers}: the {compute.schedule} schedule cannot replicate "
            f"stages; use --workers {compute.num_stages} or {listed(REPLICABLE)}"
        )
    if machine.memory_limit and memory_budget is not None:
        raise PipecompileError(
            "--memory-limit (parameters, optimizer state and activations, used to choose the "
            "split) and --memory-budget (activations only, used to choose recomputation "
            "for the split) cannot be combined; give one"
        )


def _ir_text(value: object) -> str:
    if isinstance(value, Traced):
        return str(value.module.graph)
    graph = getattr(value, "graph", None)
    return str(graph) if graph is not None and not isinstance(value, StageGraph) else str(value)
