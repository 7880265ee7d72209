"""How many micro-batches each device holds, and how many activation bytes, in program order.

A micro-batch is held on a stage from its forward until its last backward instruction (B,
or W when the backward is split). A plain forward stores ``saved[j]`` bytes; a recomputed
forward (FC) stores only the stage inputs, ``inputs[j]``, and its backward briefly holds
``saved[j]`` again while it recomputes. Both counts depend only on each device's order.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipecompile.ir.programs.instr import INPUT_GRADIENT_OPS, Instr, Op
from pipecompile.ir.programs.program import Program

__all__ = [
    "peak_inflight",
    "peak_stored_bytes",
    "device_peak_bytes",
    "stored_counts",
    "peak_weight_copies",
]


def peak_inflight(program: Program) -> tuple[int, ...]:
    """Per device, the largest number of micro-batches held at once: the byte count when every
    micro-batch weighs one unit, recomputed or not."""
    ones = [1] * program.num_stages
    return peak_stored_bytes(program, ones, ones)


def peak_stored_bytes(
    program: Program, saved: Sequence[int], inputs: Sequence[int]
) -> tuple[int, ...]:
    """Per device, the largest number of activation bytes stored at once (see module doc)."""
    return tuple(device_peak_bytes(instrs, saved, inputs) for instrs in program.devices)


def device_peak_bytes(instrs: Sequence[Instr], saved: Sequence[int], inputs: Sequence[int]) -> int:
    """The largest number of activation bytes one device's instructions store at once."""
    split = {(x.stage, x.microbatch) for x in instrs if x.op == Op.I}
    held: dict[tuple[int, int | None], int] = {}
    total = peak = 0
    for x in instrs:
        key = (x.stage, x.microbatch)
        before = held.get(key, 0)
        if x.op == Op.F:
            held[key] = saved[x.stage]
        elif x.op == Op.FC:
            held[key] = inputs[x.stage]
        elif x.op in INPUT_GRADIENT_OPS and key in held:
            held[key] = max(before, saved[x.stage])  # recomputed for the backward
        total += held.get(key, 0) - before
        peak = max(peak, total)
        if x.op == Op.W or (x.op == Op.B and key not in split):
            total -= held.pop(key, 0)
    return peak


def stored_counts(instrs: Sequence[Instr]) -> frozenset[tuple[int, int]]:
    """For a device running one stage: the (full, inputs-only) micro-batch counts it holds at
    its peaks, so its stored bytes are max(full * saved + inputs_only * inputs) over them.
    Pairs another pair dominates are dropped."""
    split = {x.microbatch for x in instrs if x.op == Op.I}
    held: dict[int | None, tuple[int, int]] = {}
    seen: set[tuple[int, int]] = set()
    for x in instrs:
        i = x.microbatch
        if x.op == Op.F:
            held[i] = (1, 0)
        elif x.op == Op.FC:
            held[i] = (0, 1)
        elif x.op in INPUT_GRADIENT_OPS and i in held:
            held[i] = (1, held[i][1])  # recomputed: the full set again, beside the inputs
        seen.add((sum(f for f, _ in held.values()), sum(c for _, c in held.values())))
        if x.op == Op.W or (x.op == Op.B and i not in split):
            held.pop(i, None)
    return frozenset(
        a for a in seen if not any(b != a and b[0] >= a[0] and b[1] >= a[1] for b in seen)
    )


def peak_weight_copies(instrs: Sequence[Instr]) -> int:
    """The most stashed weight versions a device keeps at once: STASH copies the weights
    when an UPDATE has changed them since the last copy; a copy lives until the backward of
    the last micro-batch that uses it."""
    split = {(x.stage, x.microbatch) for x in instrs if x.op == Op.W}
    updates: dict[int, int] = {}
    version_of: dict[tuple[int, int | None], tuple[int, int]] = {}
    peak = 0
    for x in instrs:
        key = (x.stage, x.microbatch)
        if x.op == Op.UPDATE:
            updates[x.stage] = updates.get(x.stage, 0) + 1
        elif x.op == Op.STASH:
            version_of[key] = (x.stage, updates.get(x.stage, 0))
        elif key in version_of and (x.op == Op.W or (x.op == Op.B and key not in split)):
            del version_of[key]
        peak = max(peak, len(set(version_of.values())))
    return peak
