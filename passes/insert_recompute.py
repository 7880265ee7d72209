"""Pass: insert_recompute — choose which forwards keep only their inputs (FC) and are
recomputed in backward (activation checkpointing).

Requires: a compute-only program and, per stage, the bytes a plain and a recomputed forward
store (``activation_memory``) and the forward FLOPs a recomputation costs.
Guarantees: a new program in which the chosen ``jF i`` became ``jFC i``: for a policy, the
same micro-batches on every stage (``never``: none, ``except_last``: all but the last,
``always``: all); for a memory budget, on each device the recomputation of the first k_j
micro-batches of each of its stages j that recomputes the fewest FLOPs while the device's
predicted peak of stored activation bytes fits the budget.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from pipecompile.errors import MemoryBudgetError
from pipecompile.ir.graph.saved_bytes import StageMemory
from pipecompile.ir.programs.memory_model import device_peak_bytes
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.recompute_policy import (
    POLICIES,
    check_policy,
    policy_counts,
    with_recompute,
)
from pipecompile.ir.records.sizes import format_size

__all__ = ["POLICIES", "insert_recompute"]

_MAX_CANDIDATES = 20_000  # beyond this, a device's stages choose among the three policies


def insert_recompute(
    program: Program,
    *,
    memory: Sequence[StageMemory],
    flops: Sequence[int],
    policy: str = "never",
    budget: int | None = None,
) -> Program:
    """Return ``program`` with the chosen forwards recomputed (see the module docstring).

    Raises:
        PipecompileError: unknown policy.
        MemoryBudgetError: some device exceeds ``budget`` even with every forward recomputed.
    """
    check_policy(policy)
    if budget is None:
        return with_recompute(program, policy_counts(policy, program))
    counts: dict[int, int] = {}
    for d in range(len(program.devices)):
        counts.update(_fit_device(program, d, memory, flops, budget))
    return with_recompute(program, counts)


def _fit_device(
    program: Program, d: int, memory: Sequence[StageMemory], flops: Sequence[int], budget: int
) -> dict[int, int]:
    """The per-stage counts for device ``d`` with the least recomputation that fits."""
    stages = [j for j, dev in enumerate(program.stage_device) if dev == d]
    m = program.microbatches
    levels: list[int] = list(range(m + 1))
    if (m + 1) ** len(stages) > _MAX_CANDIDATES:
        levels = sorted({0, m - 1, m})
    saved = [s.saved for s in memory]
    inputs = [s.inputs for s in memory]
    candidates = sorted(
        itertools.product(levels, repeat=len(stages)),
        key=lambda ks: (sum(k * flops[j] for k, j in zip(ks, stages)), sum(ks)),
    )
    for ks in candidates:
        counts = dict(zip(stages, ks))
        instrs = with_recompute(program, counts).devices[d]
        if device_peak_bytes(instrs, saved, inputs) <= budget:
            return counts
    every = with_recompute(program, dict.fromkeys(stages, m)).devices[d]
    least = device_peak_bytes(every, saved, inputs)
    raise MemoryBudgetError(
        f"device {d} (stage{'s' if len(stages) > 1 else ''} {', '.join(map(str, stages))}) "
        "stores at least "
        f"{format_size(least)} of activations even with every forward recomputed, above "
        f"--memory-budget {format_size(budget)}; raise the budget, use more stages, or split "
        "the mini-batch into more, smaller micro-batches"
    )
