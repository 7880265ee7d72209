"""From a model and its example batch to the searched plans: trace once on the whole batch,
gather the model's facts, search the space the options leave open, and write the record the
manifest keeps under ``plan``."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, replace

import torch
from torch import nn

from pipecompile.errors import PlanError
from pipecompile.frontend.tracer import trace
from pipecompile.ir.programs.cost_model import CostModel
from pipecompile.ir.records.batch_coupling import Coupling, mixes
from pipecompile.ir.records.plan_record import PlanRecord, PlanRow
from pipecompile.model.fingerprint import graph_fingerprint
from pipecompile.model.init_recipe import is_meta_model
from pipecompile.passes import annotate_costs, batch_coupling
from pipecompile.planner.model_facts import ModelFacts, model_facts
from pipecompile.planner.plan import Plan, Predicted
from pipecompile.planner.pricing import microbatch_counts, rank_models
from pipecompile.planner.rank_models import RankModels
from pipecompile.planner.search import (
    SearchResult,
    Space,
    check_placing,
    search,
)
from pipecompile.schedules import DEFAULT_SCHEDULE, ORDER, SYNCHRONOUS, WHOLE_BATCH, schedule_of

__all__ = [
    "check_search",
    "choose_plan",
    "open_choices",
    "traced_facts",
    "plan_record",
    "RUNNERS_UP",
]

RUNNERS_UP = 4  # the table shows the best plan and this many more


def open_choices(
    devices: int | None, schedule: str | None, microbatches: int | str | None
) -> tuple[str, int | str, bool]:
    """The schedule and micro-batch count a compile asks for (not given: ``"auto"`` with
    ``devices``, else the default schedule and 1), and whether that asks for a plan search."""
    searched = "auto" if devices is not None else None  # what --devices leaves open
    schedule = schedule or searched or DEFAULT_SCHEDULE
    microbatches = microbatches or searched or 1
    return schedule, microbatches, devices is not None or "auto" in (schedule, microbatches)


def choose_plan(
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    *,
    devices: int | None,
    stages: int | None,
    microbatches: int | str,
    schedule: str,
    virtual_stages: int | None,
    recompute: str,
    split_at: tuple[str, ...],
    machine: CostModel,
    progress: bool,
    replicas: tuple[int, ...] | None = None,
    balance: str = "flops",
    memory_budget: int | None = None,
    ranks: int | None = None,
    whole_loss: bool = False,
    shapes: tuple[str, ...] = ("chain", "graph"),
) -> tuple[Plan, CostModel, PlanRecord]:
    """The best plan for ``devices`` (default: ``stages``, one stage each) with the given
    choices fixed (``"auto"``: searched), the cost model it was priced with (that of the
    ranks it runs on, calibrated on this machine unless ``PIPECOMPILE_CALIBRATION=off``),
    and the manifest's record. ``ranks``: only plans on that many ranks (``--tune``
    compiling a plan the search priced); ``whole_loss``: the loss is one over the whole
    batch (only the schedules that wait for it split the batch, ``WHOLE_BATCH``).

    Raises:
        PlanError: options the search cannot take, or no plan that fits (see ``search``).
    """
    check_search(
        devices, stages, replicas, balance, memory_budget, machine, schedule, virtual_stages
    )
    batch = next(iter(inputs.values())).shape[0] if inputs else 0
    facts, key, mixing = _traced(model, inputs, split_at, meta=is_meta_model(model))
    if any(c.kind == "middle" for c in mixing) and microbatches == "auto":
        if progress:
            _say(f"{mixing[0].op} mixes the samples of the batch: plans of one micro-batch")
        microbatches = 1  # a split batch would change what the model computes
    whole_loss = whole_loss or any(c.kind == "tail" for c in mixing)  # run on the whole batch
    space = replace(_space(devices, stages, schedule, virtual_stages), shapes=shapes)
    if whole_loss:  # every micro-batch's outputs on one last stage: no replicas
        space = replace(space, replicate=False)
        waiting = tuple(s for s in space.schedules if s in WHOLE_BATCH)
        if waiting:
            space = replace(space, schedules=waiting)
        elif microbatches == "auto":
            microbatches = 1  # a schedule that cannot wait for the loss: the batch whole
    space = replace(
        space,
        microbatches=microbatch_counts(model, batch)
        if microbatches == "auto"
        else (int(microbatches),),
        recompute=(recompute,) if recompute != "never" else (),
        ranks=(ranks,) if ranks is not None else (),
    )
    models = RankModels.same(machine, space.devices)
    if os.environ.get("PIPECOMPILE_CALIBRATION") != "off":
        say = _say if progress else None
        models = rank_models(model, inputs, facts, machine, space, say, key)
    result = search(
        facts,
        batch=batch,
        space=space,
        machine=models,
        progress=_say if progress else None,
        keep=1 + RUNNERS_UP,
    )
    used = result.best.devices
    record = plan_record(result, space, models.at(used), models.source(used), key)
    return result.best.plan, _on_used(models.at(used), result.best), record


_PER_DEVICE = (("--memory-limit", "memory_limit"), ("--device-speed", "device_speed"))


def _check_per_device(machine: CostModel, devices: int) -> None:
    """``--memory-limit`` and ``--device-speed`` give one value, or one per searched device."""
    for flag, name in _PER_DEVICE:
        values = getattr(machine, name)
        if len(values) not in (0, 1, devices):
            raise PlanError(
                f"{flag} gives {len(values)} values for --devices {devices}; give one per "
                "device (or one for all)"
            )


def _on_used(machine: CostModel, best: Predicted) -> CostModel:
    """The cost model of the devices the chosen plan uses, the first of those searched (a plan
    may leave some out): per-device values cut to them; a replicated stage's device takes
    the smallest memory limit and speed of its ranks (each replica holds and runs the whole
    stage)."""
    replicas = best.plan.replicas or (1,) * best.devices
    bases = [sum(replicas[:d]) for d in range(len(replicas))]
    cut = {
        name: tuple(min(values[b : b + r]) for b, r in zip(bases, replicas))
        for _, name in _PER_DEVICE
        if len(values := getattr(machine, name)) > 1
    }
    return replace(machine, **cut) if cut else machine


def _devices_for(stages: int, schedule: str, virtual_stages: int | None) -> int:
    """The devices ``stages`` stages take under ``schedule`` (``auto``: one stage each)."""
    each = 1 if schedule == "auto" else schedule_of(schedule).stages_a_device(virtual_stages)
    if stages % each:
        raise PlanError(
            f"--schedule {schedule} puts {each} stages on each device: --stages {stages} is "
            f"not a multiple of {each}; give --stages {stages + each - stages % each}, or "
            "--devices N to search"
        )
    return stages // each


def check_search(
    devices: int | None,
    stages: int | None,
    replicas: tuple[int, ...] | None,
    balance: str,
    memory_budget: int | None,
    machine: CostModel,
    schedule: str = "auto",
    virtual_stages: int | None = None,
) -> None:
    """Raise PlanError for options the plan search cannot take (before any tracing): a
    schedule it does not price, a stage count no schedule places on the devices, per-device
    values for another device count."""
    if schedule != "auto" and schedule not in SYNCHRONOUS:
        raise PlanError(
            f"--schedule {schedule} updates weights asynchronously (weight stashing), and the "
            "plan search (--devices, --microbatches auto) prices synchronous schedules only: "
            f"fix the plan with --stages N --microbatches M --schedule {schedule}, or drop "
            "--schedule to search"
        )
    if devices is None and stages is None:
        raise PlanError(
            "give --stages N (the pipeline you want) or --devices N (pipecompile searches "
            "the plan for N devices)"
        )
    if replicas is not None or machine.workers is not None:
        flag = "--replicate" if replicas is not None else "--workers"
        raise PlanError(
            f"{flag} fixes how stages are replicated, which the plan search (--devices, "
            f"--schedule auto, --microbatches auto) chooses itself: drop {flag} or the search"
        )
    if memory_budget is not None:
        raise PlanError(
            "--memory-budget chooses recomputation for a fixed plan; the plan search takes "
            "--memory-limit (everything a device holds) instead"
        )
    if balance != "flops":
        raise PlanError(
            f"--balance {balance}: the plan search prices every plan by FLOPs under its cost "
            "model; drop --balance, or fix the plan with --stages, --microbatches and "
            "--schedule"
        )
    space = _space(devices, stages, schedule, virtual_stages)
    check_placing(space)
    _check_per_device(machine, space.devices)


def _space(
    devices: int | None, stages: int | None, schedule: str, virtual_stages: int | None
) -> Space:
    """The search's devices, stage count, schedules and virtual stages (without
    ``devices``: those the schedule puts ``stages`` on)."""
    if devices is None:  # --stages with a searched part: the devices the schedule puts them on
        devices = _devices_for(stages or 0, schedule, virtual_stages)
    return Space(
        devices=devices,
        stages=(stages,) if stages is not None else (),
        schedules=tuple(s for s in ORDER if s in SYNCHRONOUS)
        if schedule == "auto"
        else (schedule,),
        virtual_stages=(virtual_stages,) if virtual_stages is not None else (2, 4),
    )


def traced_facts(
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    split_at: tuple[str, ...] = (),
    *,
    meta: bool = False,
) -> tuple[ModelFacts, str]:
    """``model`` traced on its whole example batch: the search's facts, and the traced
    graph's fingerprint (the key of what ``--tune`` learned about this model)."""
    facts, key, _ = _traced(model, inputs, split_at, meta=meta)
    return facts, key


def _traced(
    model: nn.Module, inputs: dict[str, torch.Tensor], split_at: tuple[str, ...], *, meta: bool
) -> tuple[ModelFacts, str, tuple[Coupling, ...]]:
    """``traced_facts``, and the ops where the model mixes the samples of its batch (batch
    norm aside: its statistics per micro-batch are the pipeline's semantics)."""
    batch = next(iter(inputs.values())).shape[0] if inputs else 0
    shown = {k: v.to("meta") for k, v in inputs.items()} if meta else inputs
    traced = trace(model, shown)
    annotated = annotate_costs(traced.module, root=traced.root)
    facts = model_facts(annotated, max(batch, 1), split_at)
    real = [inputs[n] for n in traced.input_names]
    found = None if meta else batch_coupling(traced.module, inputs=real)
    return facts, graph_fingerprint(traced.module), mixes(found or ())


def _say(line: str) -> None:
    print(f"  {line}", file=sys.stderr)


def plan_record(
    result: SearchResult,
    space: Space,
    machine: CostModel,
    calibration: str | None = None,
    model_key: str = "",
) -> PlanRecord:
    """The manifest's ``plan``: the chosen plan, its predicted step, the runners-up, how
    many plans were searched, and the cost model they were priced with."""
    model = {k: v for k, v in asdict(machine).items() if k != "workers"}
    return PlanRecord(
        devices=space.devices,
        chosen=PlanRow.from_json(result.best.as_json()),
        plans_searched=result.tried + result.bounded,
        plans_bounded=result.bounded,
        search_seconds=round(result.seconds, 3),
        runners_up=tuple(PlanRow.from_json(p.as_json()) for p in result.ranked[1 : 1 + RUNNERS_UP]),
        cost_model={k: list(v) if isinstance(v, tuple) else v for k, v in model.items()}
        | {"calibration": calibration, "model_key": model_key},
    )
