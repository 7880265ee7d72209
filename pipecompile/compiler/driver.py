"""The compiler driver: runs the passes in order, verifies the IR after each, times them."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from pipecompile.errors import InternalError, PipecompileError
from pipecompile.frontend.tracer import trace
from pipecompile.ir.compiled import Compiled
from pipecompile.ir.cost_model import CostModel
from pipecompile.ir.microbatch import split_microbatches
from pipecompile.ir.program import Program
from pipecompile.ir.stage_graph import StageGraph
from pipecompile.ir.topology import topology
from pipecompile.ir.traced import Traced
from pipecompile.ir.verify_program import verify_program
from pipecompile.model.fingerprint import graph_fingerprint
from pipecompile.model.init_recipe import is_meta_model
from pipecompile.passes import (
    activation_memory,
    annotate_costs,
    balance_stages,
    insert_checkpoints,
    insert_communication,
    insert_replication,
    profile_costs,
    split_stages,
)
from pipecompile.passes.balance_stages import BALANCE_KEY
from pipecompile.schedules import generate

__all__ = ["PASSES", "Compiled", "compile_model"]

# The passes, in the order they run; `--print-after NAME` prints the IR after any of them.
PASSES = (
    "schedule",
    "trace",
    "annotate_costs",
    "profile_costs",
    "balance_stages",
    "split_stages",
    "activation_memory",
    "insert_checkpoints",
    "insert_communication",
    "insert_replication",
)

T = TypeVar("T")


def compile_model(
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    *,
    stages: int,
    microbatches: int = 1,
    schedule: str = "gpipe",
    balance: str = "flops",
    split_at: tuple[str, ...] = (),
    pinned: dict[str, int] | None = None,
    virtual_stages: int | None = None,
    vertical_sync: bool = False,
    checkpoint: str = "never",
    memory_budget: int | None = None,
    replicas: tuple[int, ...] | None = None,
    machine: CostModel | None = None,
    print_after: frozenset[str] = frozenset(),
    progress: bool = False,
) -> Compiled:
    """Trace ``model`` on one micro-batch of ``inputs`` and compile it into stages and a program.

    Args:
        model: the model; it is not modified.
        inputs: the model's example mini-batch, by forward() parameter name.
        stages: how many pipeline stages to cut.
        microbatches: how many micro-batches a mini-batch splits into (along dim 0).
        schedule: the schedule generator's name (see ``pipecompile.schedules``).
        balance: the cost the stages are balanced on: ``flops``, ``params``, or ``time``
            (each op's forward + backward time measured on this machine, cached).
        split_at: ``[before:|after:]MODULE_PATH`` boundaries where a stage must start (as do
            ``pipecompile.split_point()`` calls in forward); the rest is still balanced.
        pinned: MODULE_PATH -> cost that replaces the module's measured cost.
        virtual_stages: stages per device for the ``interleaved`` schedule.
        vertical_sync: ``pipedream`` only: one weight version per micro-batch on all stages.
        checkpoint: ``never``, ``except_last`` or ``always``: which micro-batches' forwards
            keep only their inputs and are recomputed in backward.
        memory_budget: bytes of stored activations a device may hold; the least
            recomputation that fits is chosen (overrides ``checkpoint``).
        replicas: ranks per stage (PipeDream's "2-1-1"); default one each.
        machine: what the balancer assumes about the devices (bandwidth, speeds, memory
            limits, workers to replicate over); default ``CostModel()``. With
            ``machine.workers`` the balancer also chooses the replica counts.
        print_after: pass names after which the IR is printed.
        progress: print one line per pass to stderr.

    Raises:
        PipecompileError: a subclass naming what is wrong with the model or the options.
    """
    unknown = sorted(print_after - set(PASSES))
    if unknown:
        raise PipecompileError(
            f"--print-after {unknown[0]}: no such pass; passes: {', '.join(PASSES)}"
        )
    options: dict[str, Any] = {"virtual_stages": virtual_stages, "vertical_sync": vertical_sync}
    runner = _PassRunner(print_after, progress)
    # The schedule comes first: it needs no graph, so bad schedule options fail before tracing,
    # and the balancer's memory model reads it.
    compute = runner("schedule", lambda: generate(schedule, stages, microbatches, **options), None)
    machine = machine or CostModel()
    _check_machine(machine, compute, replicas=replicas, memory_budget=memory_budget)
    # What the --checkpoint policy keeps, for the balancer's memory limits; the stages' real
    # bytes (and --memory-budget) only exist after splitting, where insert_checkpoints runs.
    policy = insert_checkpoints(compute, memory=(), flops=(), policy=checkpoint)
    micro = split_microbatches(inputs, microbatches)[0]
    meta = is_meta_model(model)  # no weights: traced on meta inputs, never run
    if meta and balance == "time":
        raise PipecompileError(
            f"--balance time measures each op on real weights, and {type(model).__name__} is "
            "on the meta device; balance on flops (the default) or params"
        )
    shown = {k: v.to("meta") for k, v in micro.items()} if meta else micro
    traced: Traced = runner("trace", lambda: trace(model, shown), None)
    annotated = runner(
        "annotate_costs", lambda: annotate_costs(traced.module, root=traced.root), None
    )
    if balance == "time":  # measured on this machine, cached
        inputs_now = [micro[n] for n in traced.input_names]
        annotated = runner(
            "profile_costs",
            lambda: profile_costs(annotated, inputs=inputs_now, progress=progress),
            None,
        )
    balanced = runner(
        "balance_stages",
        lambda: balance_stages(
            annotated,
            stages=stages,
            cost=balance,
            split_at=split_at,
            pinned=pinned,
            model=machine,
            program=policy,
        ),  # fmt: skip
        None,
    )
    graph = runner("split_stages", lambda: split_stages(balanced, traced=traced), StageGraph.verify)
    memory = runner("activation_memory", lambda: activation_memory(graph), None)
    checkpointed = runner(
        "insert_checkpoints",
        lambda: insert_checkpoints(
            compute,
            memory=memory,
            flops=[s.flops for s in graph.stages],
            policy=checkpoint,
            budget=memory_budget,
        ),  # fmt: skip
        None,
    )
    check = topology(graph)
    communicating = runner(
        "insert_communication", lambda: insert_communication(checkpointed, topology=check), None
    )
    report = dict(balanced.meta.get(BALANCE_KEY, {}))
    counts = tuple(replicas or report.get("replicas") or (1,) * stages)
    program = runner(
        "insert_replication",
        lambda: insert_replication(communicating, replicas=counts),
        lambda p: verify_program(p, check),
    )
    size = next(iter(micro.values())).shape[0] if micro else 0
    return Compiled(
        graph, program, size, memory, counts, report, runner.timings,
        fingerprint=graph_fingerprint(traced.module),
    )  # fmt: skip


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
        and (compute.schedule.startswith(("interleaved", "pipedream")))
    ):
        raise PipecompileError(
            f"--workers {machine.workers}: the {compute.schedule} schedule cannot replicate "
            f"stages; use --workers {compute.num_stages} or gpipe, 1f1b or zb1p"
        )
    if machine.memory_limit and memory_budget is not None:
        raise PipecompileError(
            "--memory-limit (parameters, optimizer state and activations, used to choose the "
            "split) and --memory-budget (activations only, used to choose checkpointing for "
            "the split) cannot be combined; give one"
        )


class _PassRunner:
    def __init__(self, print_after: frozenset[str], progress: bool) -> None:
        self.print_after = print_after
        self.progress = progress
        self.timings: dict[str, float] = {}

    def __call__(self, name: str, run: Callable[[], T], verify: Callable[[T], Any] | None) -> T:
        start = time.perf_counter()
        try:
            result = run()
            if verify is not None:
                verify(result)
        except PipecompileError:
            raise
        except Exception as err:
            raise InternalError(
                f"pass {name} failed: {type(err).__name__}: {err}\n"
                "This is a pipecompile bug; please report it with the model file."
            ) from err
        self.timings[name] = time.perf_counter() - start
        if self.progress:
            print(f"  {name:<22} {self.timings[name] * 1000:8.1f} ms", file=sys.stderr)
        if name in self.print_after:
            print(f"--- IR after {name} ---\n{_ir_text(result)}")
        return result


def _ir_text(value: object) -> str:
    if isinstance(value, Traced):
        return str(value.module.graph)
    graph = getattr(value, "graph", None)
    return str(graph) if graph is not None and not isinstance(value, StageGraph) else str(value)
