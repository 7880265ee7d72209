"""The schedule picture: the simulated timeline, one row per device, one box per instruction.

Boxes sit at their simulated start and end on a common time axis (``neato -n2`` keeps the
positions given), coloured by kind - forward, recomputed forward, backward, its input and
weight halves - with the micro-batch inside; idle time is a grey box::

    device 0 │ 0 │ 1 │ 2 │ 3 │░░░░░░░░░░░│ 3 │ 2 │ 1 │ 0 │
    device 1 │░░░│ 0 │ 1 │ 2 │ 3 │░░░│ 3 │ 2 │ 1 │ 0 │░░░│
             └──────┴──────┴──────┴──────┴──────┴──────┴─► time (us)

Costs are those ``pipecompile show`` uses by default: the balancer's predicted stage times,
or the stages' forward FLOPs for manifests without them.
"""

from __future__ import annotations

import math

import graphviz  # type: ignore[import-untyped]

from pipecompile.ir.programs.instr import Op
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.simulate import Span, Timeline, simulate
from pipecompile.ir.programs.topology import topology_from_manifest
from pipecompile.ir.records.manifest import Manifest
from pipecompile.ir.records.sizes import counted, format_count
from pipecompile.reports.balance_table import stage_costs

__all__ = ["simulated_timeline", "schedule_dot", "OP_COLORS", "IDLE_COLOR"]

OP_COLORS = {Op.F: "#7eb0e0", Op.FC: "#7fd1c1", Op.B: "#f4a259", Op.I: "#f6d365", Op.W: "#c39bd3"}
OP_NAMES = {
    Op.F: "forward",
    Op.FC: "recomputed forward",
    Op.B: "backward",
    Op.I: "backward (input gradients)",
    Op.W: "weight gradients",
}
IDLE_COLOR = "#e6e6e6"
_FONT = "Helvetica"
_ROW, _GAP, _GUTTER, _BOX_MIN = 24.0, 8.0, 96.0, 16.0  # points


def simulated_timeline(manifest: Manifest, program: Program) -> tuple[Timeline, str]:
    """Simulate ``program`` on the manifest's predicted stage times (unit ``"ns"``), or on its
    forward FLOPs (unit ``"flops"``) when the balancer recorded no times.

    Raises:
        ProgramError: the program deadlocks.
    """
    costs, unit = stage_costs(manifest)
    return simulate(program, topology_from_manifest(manifest), costs), unit


def schedule_dot(timeline: Timeline, program: Program, *, unit: str) -> graphviz.Digraph:
    """The schedule picture as a graphviz graph of pinned boxes (render with ``neato -n2``).

    Args:
        timeline: the simulated run (see ``simulated_timeline``).
        program: the program simulated (its schedule, stages and micro-batches for the title).
        unit: ``"ns"`` or ``"flops"``: what the timeline's times count.

    Returns:
        The graph; ``.source`` is its DOT text, which also draws with plain ``dot``
        (it names ``layout=neato``).
    """
    spans = [s for s in timeline.spans if s.instr.op in OP_COLORS and s.end > s.start]
    makespan = timeline.makespan or 1.0
    shortest = min((s.end - s.start for s in spans), default=makespan)
    width = min(max(_BOX_MIN * makespan / shortest, 640.0), 2000.0)
    scale = width / makespan  # points per time unit
    dot = graphviz.Digraph(
        "schedule",
        comment="pipecompile schedule picture: neato -n2 -Tsvg schedule.dot (plain dot works too)",
    )
    dot.attr(layout="neato", inputscale="72", notranslate="true", pad="0.2")
    dot.attr(
        "node",
        shape="box",
        style="filled",
        fixedsize="true",
        fontname=_FONT,
        fontsize="10",
        penwidth="0.6",
        color="#444444",
    )
    for d in range(timeline.devices):
        _device_row(dot, timeline, spans, d, scale)
    bottom = _row_y(timeline.devices - 1) - _ROW / 2
    _time_axis(dot, makespan, scale, bottom - 6, unit)
    ops = sorted({s.instr.op for s in spans}, key=list(OP_COLORS).index)
    shared = len(program.devices) < program.num_stages
    _legend(dot, ops, bottom - 40, primes=shared)
    _text(
        dot,
        "title",
        _title(timeline, program, unit),
        _GUTTER + width / 2,
        _row_y(0) + _ROW + 4,
        size=13,
    )
    return dot


def _title(timeline: Timeline, program: Program, unit: str) -> str:
    cost = "predicted stage times" if unit == "ns" else "forward FLOPs, backward 2x"
    return (
        f"schedule {program.schedule}: {program.num_stages} stages on "
        f"{counted(timeline.devices, 'device')}, "
        f"{counted(program.microbatches, 'micro-batch')} - bubble "
        f"{timeline.bubble_fraction:.1%}, makespan {_time(timeline.makespan, unit)} "
        f"({cost})"
    )


def _row_y(d: int) -> float:
    """The centre of device ``d``'s row (device 0 on top; y grows upward)."""
    return -d * (_ROW + _GAP)


def _device_row(
    dot: graphviz.Digraph, timeline: Timeline, spans: list[Span], d: int, scale: float
) -> None:
    mine = sorted((s for s in spans if s.device == d), key=lambda s: s.start)
    stages = sorted({s.instr.stage for s in mine})
    busy = sum(s.end - s.start for s in mine) / (timeline.makespan or 1.0)
    names = ", ".join(str(j) for j in stages)
    label = f"device {d}\\nstage{'s' * (len(stages) > 1)} {names}"
    _text(dot, f"row{d}", label, _GUTTER / 2, _row_y(d), size=10)
    right = _GUTTER + timeline.makespan * scale + 30
    _text(dot, f"busy{d}", f"{busy:.0%} busy", right, _row_y(d), size=9)
    clock = 0.0
    for k, s in enumerate(mine):
        if s.start > clock:
            _idle(dot, f"d{d}_idle{k}", clock, s.start, d, scale)
        primes = "'" * stages.index(s.instr.stage)
        tip = (
            f"device {d}: {s.instr} - {OP_NAMES[s.instr.op]} of stage {s.instr.stage}, "
            f"micro-batch {s.instr.microbatch}"
        )
        _box(
            dot,
            f"d{d}_{k}",
            s.start,
            s.end,
            d,
            scale,
            label=f"{s.instr.microbatch}{primes}",
            fillcolor=OP_COLORS[s.instr.op],
            tooltip=tip,
        )
        clock = s.end
    if clock < timeline.makespan:
        _idle(dot, f"d{d}_idle_end", clock, timeline.makespan, d, scale)


def _idle(dot: graphviz.Digraph, name: str, start: float, end: float, d: int, scale: float) -> None:
    _box(
        dot,
        name,
        start,
        end,
        d,
        scale,
        label="",
        fillcolor=IDLE_COLOR,
        color=IDLE_COLOR,
        tooltip=f"device {d}: idle",
    )


def _box(
    dot: graphviz.Digraph,
    name: str,
    start: float,
    end: float,
    d: int,
    scale: float,
    **attrs: str,
) -> None:
    width = (end - start) * scale
    if width < 10:  # too narrow for a digit; the tooltip still says which it is
        attrs["label"] = ""
    x = _GUTTER + (start + end) / 2 * scale
    dot.node(
        name,
        pos=f"{x:.2f},{_row_y(d):.2f}!",
        width=f"{width / 72:.4f}",
        height=f"{_ROW / 72:.4f}",
        **attrs,
    )


def _time_axis(dot: graphviz.Digraph, makespan: float, scale: float, y: float, unit: str) -> None:
    line = {"shape": "box", "style": "filled", "fillcolor": "#444444", "penwidth": "0"}
    width = makespan * scale
    dot.node(
        "axis",
        label="",
        pos=f"{_GUTTER + width / 2:.2f},{y:.2f}!",
        width=f"{width / 72:.4f}",
        height=f"{0.8 / 72:.4f}",
        **line,
    )
    step = _tick_step(makespan)
    for k in range(int(makespan / step + 1e-9) + 1):
        x = _GUTTER + k * step * scale
        dot.node(
            f"tick{k}",
            label="",
            pos=f"{x:.2f},{y - 3:.2f}!",
            width=f"{0.8 / 72:.4f}",
            height=f"{6 / 72:.4f}",
            **line,
        )
        _text(dot, f"tick{k}_label", _time(k * step, unit, bare=True), x, y - 14, size=9)
    what = "time (us)" if unit == "ns" else "time (forward FLOPs)"
    _text(dot, "axis_label", what, _GUTTER / 2, y - 14, size=9)


def _tick_step(span: float) -> float:
    """A round step (1, 2 or 5 times a power of ten) giving at most about ten ticks."""
    raw = span / 10
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _time(value: float, unit: str, *, bare: bool = False) -> str:
    if unit == "ns":
        return f"{value / 1e3:g}" + ("" if bare else " us")
    return format_count(value) + ("" if bare else " FLOPs")


def _legend(dot: graphviz.Digraph, ops: list[str], y: float, *, primes: bool) -> None:
    """A key box per colour; with several stages per device, what a prime means."""
    x = _GUTTER
    entries = [(OP_COLORS[op], f"{op} {OP_NAMES[op]}") for op in ops] + [(IDLE_COLOR, "idle")]
    for k, (color, text) in enumerate(entries):
        dot.node(
            f"key{k}",
            label="",
            pos=f"{x + 7:.2f},{y:.2f}!",
            width=f"{14 / 72:.4f}",
            height=f"{12 / 72:.4f}",
            fillcolor=color,
        )
        width = 5.0 * len(text)
        _text(dot, f"key{k}_label", text, x + 18 + width / 2, y, size=9, width=width)
        x += 30 + width
    if primes:
        text = "3' = micro-batch 3 on the device's second stage"
        _text(dot, "key_primes", text, x + 2.5 * len(text), y, size=9)


def _text(
    dot: graphviz.Digraph,
    name: str,
    label: str,
    x: float,
    y: float,
    *,
    size: int,
    width: float | None = None,
) -> None:
    dot.node(
        name,
        label=label,
        pos=f"{x:.2f},{y:.2f}!",
        shape="plaintext",
        style="",
        fixedsize="false",
        fontsize=str(size),
        **({"width": f"{width / 72:.4f}"} if width else {}),
    )
