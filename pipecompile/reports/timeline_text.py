"""Draw a simulated timeline as a clock table, one row per device (integer costs only)."""

from __future__ import annotations

from pipecompile.ir.programs.instr import Op
from pipecompile.ir.programs.simulate import Timeline

__all__ = ["timeline_text"]

_SHOWN = (Op.F, Op.FC, Op.B, Op.I, Op.W)


def timeline_text(timeline: Timeline, *, width: int = 4) -> str:
    """One column per clock, each busy clock labelled with its instruction (``F3``, ``B0`` …;
    a stage other than the device's first is primed: ``F3'``), idle clocks shown as ``.``.

    Raises:
        ValueError: a span does not start and end on whole clocks.
    """
    spans = [s for s in timeline.spans if s.instr.op in _SHOWN and s.end > s.start]
    if any(s.start != int(s.start) or s.end != int(s.end) for s in spans):
        raise ValueError("timeline_text needs whole-number costs (use uniform costs)")
    clocks = int(timeline.makespan)
    held = {
        d: sorted({s.instr.stage for s in spans if s.device == d}) for d in range(timeline.devices)
    }
    rows = ["clock     " + "".join(f"{k:<{width}}" for k in range(clocks)).rstrip()]
    for d in range(timeline.devices):
        cells = ["."] * clocks
        for s in spans:
            if s.device != d:
                continue
            op = Op.F if s.instr.op == Op.FC else s.instr.op
            prime = "'" * held[d].index(s.instr.stage)  # the device's first stage unprimed
            for k in range(int(s.start), int(s.end)):
                cells[k] = f"{op}{s.instr.microbatch}{prime}"
        rows.append(f"device {d:<2}" + "".join(f"{c:<{width}}" for c in cells).rstrip())
    return "\n".join(rows)
