"""The cost models a plan search prices with: this machine's calibration for each rank count a
plan may run on (``calibrate.calibrated_ranks``), each corrected by the model's own eager
timing on that count's share of the cores (``model_probe``; timed once per share, and kept:
``model_timings``), then scaled by the ratio ``--tune`` learned for the model on that many
ranks (after the correction: applied before it, the correction undid it on the model's ops).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from pipecompile.ir.programs.cost_model import DEFAULT_BANDWIDTH, CostModel
from pipecompile.planner.calibrate import calibrated_ranks, kept_scales, scaled_by
from pipecompile.planner.calibration_quality import Quality
from pipecompile.planner.model_facts import ModelFacts
from pipecompile.planner.model_probe import Probe, corrected, probe_model, probe_sizes
from pipecompile.planner.model_timings import example_key, keep_timing, kept_timing
from pipecompile.planner.rank_models import RankModels
from pipecompile.planner.search import Space, divisors
from pipecompile.runtime.process.threads import fair_share

__all__ = [
    "microbatch_counts",
    "probe_applied",
    "probe_timing",
    "rank_models",
]

Say = Callable[[str], None]


def rank_models(
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    facts: ModelFacts,
    machine: CostModel,
    space: Space,
    say: Say | None,
    model_key: str,
) -> RankModels:
    """``machine`` calibrated for each rank count the search may use (``calibrated_ranks``;
    ``space.ranks``: those alone) and corrected by the model's own timing on each count's
    share of the cores (timed once per share)."""
    counts = space.ranks or tuple(range(1, space.devices + 1))
    made = calibrated_ranks(machine, space.devices, say, model_key, counts, scaled=False)
    scales = kept_scales(counts, model_key)  # applied after the timing's correction
    given = machine.bandwidth != DEFAULT_BANDWIDTH
    probes: dict[int, Probe | None] = {}
    factors: dict[tuple[CostModel, int], CostModel] = {}  # by compute figures and threads
    models = []
    for k, (calibrated, _) in enumerate(made, start=1):
        if k in counts:
            threads = fair_share(k)
            first = threads not in probes
            if first:
                key = example_key(model_key, inputs)
                probes[threads] = probe_timing(model, inputs, facts, threads, say, key)
            compute = replace(calibrated, bandwidth=0.0, message_latency=0.0, concurrency=0.0)
            if (compute, threads) not in factors:
                factors[compute, threads] = probe_applied(facts, compute, probes[threads])
            fixed = factors[compute, threads]
            if first and say is not None and probes[threads] is not None:
                say(_probe_line(probes[threads], threads, fixed))
            calibrated = replace(
                calibrated, fixed_scale=fixed.fixed_scale, work_scale=fixed.work_scale
            )
            calibrated = scaled_by(calibrated, scales[k], bandwidth=not given)
        models.append(calibrated)
    return RankModels(tuple(models), tuple(source for _, source in made))


def microbatch_counts(model: nn.Module, batch: int) -> tuple[int, ...]:
    """The micro-batch counts to search: the batch's divisors, but none that leaves one
    sample per micro-batch when a BatchNorm trains (its statistics need two)."""
    norms = any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training for m in model.modules()
    )
    return tuple(m for m in divisors(batch) if not (norms and batch // m < 2)) or (1,)


def probe_timing(
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    facts: ModelFacts,
    threads: int,
    say: Say | None = None,
    key: str = "",
) -> Probe | None:
    """The model's own eager timing on ``threads`` threads (``model_probe``) at the
    smallest micro-batch the model allows and at the whole batch: the same sizes whatever
    micro-batch counts the search may choose, so that compiles of one model with different
    counts price it alike, and as far apart as the batch allows (and this machine's free
    memory: ``probe_sizes``); None where it cannot be timed. With ``key``
    (``model_timings.example_key``), the timing kept for it when there is one, else the one
    taken now is kept."""
    batch = next(iter(inputs.values())).shape[0] if inputs else 0
    sizes = (
        probe_sizes(facts, [batch // m for m in microbatch_counts(model, batch)]) if batch else ()
    )
    if key and sizes and (kept := kept_timing(key, sizes, threads)) is not None:
        return kept
    start = time.perf_counter()
    probe = probe_model(model, inputs, sizes, threads) if sizes else None
    if say is not None and probe is None:
        why = "could not be timed eagerly" if sizes else "would not fit in memory whole"
        say(f"the model {why}: priced by the calibration alone")
    if probe is None:
        return None
    probe = replace(probe, took=time.perf_counter() - start)
    if key:
        keep_timing(key, threads, probe)
    return probe


def _probe_line(probe: Probe, threads: int, fixed: CostModel) -> str:
    """``the model timed eagerly on 1 thread (2.9 ms at 2, 4.2 ms at 8 samples; 0.1 s): the
    calibration's fixed costs x2.56, its work x1.02``."""
    timed = ", ".join(f"{t * 1e3:.1f} ms at {s}" for s, t in zip(probe.sizes, probe.seconds))
    timed += " samples"
    threads_ = f"{threads} thread{'s' * (threads != 1)}"
    factors = (
        f"the calibration's fixed costs x{fixed.fixed_scale:.2f}, its work x{fixed.work_scale:.2f}"
    )
    if probe.kept_from:
        when = Quality(0.0, {}, probe.kept_from).when()
        return f"the model's eager timing on {threads_} kept from {when} ({timed}): {factors}"
    return f"the model timed eagerly on {threads_} ({timed}; {probe.took:.1f} s): {factors}"


def probe_applied(facts: ModelFacts, machine: CostModel, probe: Probe | None) -> CostModel:
    """``machine`` with the factors that make its seconds for the model's work the
    probe's (``model_probe.corrected``; unchanged without a probe)."""
    return machine if probe is None else corrected(machine, facts, probe)
