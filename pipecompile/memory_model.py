"""How many micro-batches each device holds, and how many activation bytes, in program order.

A micro-batch is held on a stage from its forward until its last backward instruction (B,
or W when the backward is split). A plain forward stores ``saved[j]`` bytes; a checkpointed
forward (FC) stores only the stage inputs, ``inputs[j]``, and its backward briefly holds
``saved[j]`` again while it recomputes. Both counts depend only on each device's order.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipecompile.instr import Instr
from pipecompile.program import Program

__all__ = ["peak_inflight", "peak_stored_bytes", "device_peak_bytes"]


def peak_inflight(program: Program) -> tuple[int, ...]:
    """Per device, the largest number of micro-batches held at once: the byte count when every
    micro-batch weighs one unit, checkpointed or not."""
    ones = [1] * program.num_stages
    return peak_stored_bytes(program, ones, ones)


def peak_stored_bytes(
    program: Program, saved: Sequence[int], inputs: Sequence[int]
) -> tuple[int, ...]:
    """Per device, the largest number of activation bytes stored at once (see module doc)."""
    return tuple(device_peak_bytes(instrs, saved, inputs) for instrs in program.devices)


def device_peak_bytes(instrs: Sequence[Instr], saved: Sequence[int], inputs: Sequence[int]) -> int:
    """The largest number of activation bytes one device's instructions store at once."""
    split = {(x.stage, x.microbatch) for x in instrs if x.op == "I"}
    held: dict[tuple[int, int | None], int] = {}
    total = peak = 0
    for x in instrs:
        key = (x.stage, x.microbatch)
        before = held.get(key, 0)
        if x.op == "F":
            held[key] = saved[x.stage]
        elif x.op == "FC":
            held[key] = inputs[x.stage]
        elif x.op in ("B", "I") and key in held:
            held[key] = max(before, saved[x.stage])  # recomputed for the backward
        total += held.get(key, 0) - before
        peak = max(peak, total)
        if x.op == "W" or (x.op == "B" and key not in split):
            total -= held.pop(key, 0)
    return peak
