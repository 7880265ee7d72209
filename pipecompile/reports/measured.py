"""`pipecompile show OUT --measured TRACE`: where each rank's step went, next to the prediction.

Per rank (per device when one process ran them all), in ms per step over the traced steps
after the first (the first warms up; with one traced step, that one, and the report says so).
A span counts for the step whose span on its row holds it (a trace written before evaluations
went untraced recorded them after their step, under its number):

* compute: forwards, backwards, weight gradients (with the loss and the recomputation inside);
* waiting: blocked in a receive for a message not yet there, or at the end of the step for
  this rank's sends: the measured bubble;
* communication: sends, receives and all-reduces, less the waiting inside them;
* optimizer: the optimizer steps (and the instruction that ends each stage's step);
* data: reading the mini-batch;
* other: the rest of the step (the interpreter, gradient scaling, metrics).

Next to it: the bubble the simulator predicts for the row's device from the compile-time costs
(under ``--dp``, every copy's rank of a device gets that device's), and the step simulated with
the stage times this trace measured, against the measured step.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import TypedDict

from pipecompile.errors import PipecompileError
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.simulate import simulate
from pipecompile.ir.programs.topology import topology_from_manifest
from pipecompile.reports.balance_table import stage_costs
from pipecompile.runtime.load import open_emitted
from pipecompile.runtime.timeline import SpanTimes
from pipecompile.runtime.timeline_file import (
    SIMULATED_PID,
    TraceDocument,
    TraceInfo,
    is_trace_document,
    measured_costs,
)

__all__ = ["MeasuredReport", "RowSpan", "measured_report", "format_measured", "COLUMNS"]

COLUMNS = ("compute", "waiting", "communication", "optimizer", "data", "other")
_COMPUTE = {"forward", "backward", "weight-gradient"}  # the loss and recompute are inside
_COMMUNICATION = {"send", "receive", "all-reduce"}


class RowSpan(SpanTimes):
    """A measured span read back from a trace, on its process row (a rank, or a device)."""

    row: int


class MeasuredReport(TypedDict):
    """``show --measured``'s figures (its ``--json``): per row, ms per step in each column."""

    trace: str
    schedule: str
    one_process: bool
    steps: list[int]
    warm_up_only: bool
    rows: dict[int, dict[str, float]]
    row_devices: dict[int, int]
    spans_outside_steps: int
    predicted_bubble: list[float]
    predicted_costs: str
    simulated_step_ms: float | None
    measured_step_ms: float
    measured_over_simulated: float | None


def read_trace(path: Path) -> TraceDocument:
    """The trace ``run --trace`` wrote.

    Raises:
        PipecompileError: the file is missing, not JSON, or not such a trace.
    """
    try:
        document = json.loads(Path(path).read_text())
    except OSError as err:
        raise PipecompileError(f"cannot read the trace {path}: {err.strerror}") from None
    except ValueError as err:
        raise PipecompileError(
            f"{path} is not JSON ({err}); pass a file `run --trace` wrote"
        ) from None
    if not is_trace_document(document):
        raise PipecompileError(f"{path} is not a trace `pipecompile run --trace` wrote")
    return document


def spans_of(document: TraceDocument) -> list[RowSpan]:
    """The measured spans of a trace, back in the shape ``trace_document`` took (ns)."""
    spans = []
    for e in document["traceEvents"]:
        if e.get("ph") != "X" or e["pid"] >= SIMULATED_PID:
            continue
        start = round(e["ts"] * 1e3)
        args = dict(e["args"])
        spans.append(
            RowSpan(
                row=e["pid"],
                name=e["name"],
                category=e["cat"],
                start=start,
                end=start + round(e["dur"] * 1e3),
                step=args.pop("step"),
                args=args,
            )
        )
    return spans


def measured_report(directory: str | Path, trace: str | Path) -> MeasuredReport:
    """The figures of ``trace`` (a run of ``directory``'s program), JSON-ready.

    Raises:
        PipecompileError: the trace is unreadable or of another program.
    """
    directory = Path(directory)
    _, manifest, program = open_emitted(directory)
    document = read_trace(Path(trace))
    info = document["otherData"]
    _check_same_program(info, program, Path(trace), directory)
    spans = spans_of(document)
    steps = sorted({s["step"] for s in spans if s["category"] == "step"})
    if not steps:
        raise PipecompileError(f"{trace} holds no complete step; trace a run of at least one")
    used = steps[1:] or steps
    rows, counted, outside = _rows(spans, used, one_process=info.get("one_process", False))
    topology = topology_from_manifest(manifest)
    costs, unit = stage_costs(manifest)
    predicted = simulate(program, topology, costs)
    measured = measured_costs(counted, program.num_stages, steps[-1])
    simulated_ms = simulate(program, topology, measured).makespan / 1e6 if measured else None
    step_ms = max(r["step"] for r in rows.values())
    return MeasuredReport(
        trace=str(trace),
        schedule=program.schedule,
        one_process=info.get("one_process", False),
        steps=used,
        warm_up_only=len(steps) == 1,
        rows=rows,
        row_devices=_row_devices(document),
        spans_outside_steps=outside,
        predicted_bubble=[
            1 - predicted.busy(d) / predicted.makespan if predicted.makespan else 0.0
            for d in range(len(program.devices))
        ],
        predicted_costs=unit,
        simulated_step_ms=simulated_ms,
        measured_step_ms=step_ms,
        measured_over_simulated=step_ms / simulated_ms if simulated_ms else None,
    )


def _check_same_program(info: TraceInfo, program: Program, trace: Path, directory: Path) -> None:
    ours = (program.schedule, len(program.devices), program.num_stages, program.microbatches)
    theirs = (
        info.get("schedule"),
        info.get("devices"),
        info.get("stages"),
        info.get("microbatches"),
    )
    if ours != theirs:
        raise PipecompileError(
            f"{trace} traced a {theirs[0]} program of {theirs[1]} devices, {theirs[2]} stages and "
            f"{theirs[3]} micro-batches, but {directory} holds a {ours[0]} program of {ours[1]} "
            f"devices, {ours[2]} stages and {ours[3]} micro-batches; pass the directory whose "
            "run was traced"
        )


def _rows(
    spans: list[RowSpan], used: list[int], *, one_process: bool
) -> tuple[dict[int, dict[str, float]], list[RowSpan], int]:
    """Each row's figures in ms per step over the steps ``used``; the spans counted; how many
    were left out, lying outside their step."""
    rows: dict[int, dict[str, float]] = {}
    counted: list[RowSpan] = []
    outside = 0
    for row in sorted({s["row"] for s in spans}):
        mine, left = _inside_steps([s for s in spans if s["row"] == row and s["step"] in used])
        counted += mine
        outside += left
        figures = {k: v / len(used) / 1e6 for k, v in _breakdown(mine).items()}
        if one_process:  # the device was not running: another one was
            figures["waiting"] += figures["other"]
            figures["other"] = 0.0
        rows[row] = figures
    return rows, counted, outside


def _inside_steps(spans: list[RowSpan]) -> tuple[list[RowSpan], int]:
    """The spans of one row that lie inside their step's span, and how many do not."""
    windows = {s["step"]: (s["start"], s["end"]) for s in spans if s["category"] == "step"}
    bounds = [windows.get(s["step"], (0, -1)) for s in spans]  # no step span: none inside
    inside = [
        s for s, (begin, end) in zip(spans, bounds) if begin <= s["start"] and s["end"] <= end
    ]
    return inside, len(spans) - len(inside)


def _row_devices(document: TraceDocument) -> dict[int, int]:
    """The device each row ran: the trace's ``row_devices``, or in a trace written before it
    had them, the device its row's name gives (``rank 2, device 0``)."""
    recorded = document["otherData"].get("row_devices")
    if recorded is not None:
        return {int(row): device for row, device in recorded.items()}
    names = {
        e["pid"]: re.search(r"device (\d+)", e["args"]["name"])
        for e in document["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "process_name" and e["pid"] < SIMULATED_PID
    }
    return {row: int(found.group(1)) for row, found in names.items() if found}


def _breakdown(spans: list[RowSpan]) -> dict[str, float]:
    """Summed ns per column, and the step's own length, over ``spans`` of one row."""
    total: dict[str, float] = defaultdict(float)
    for s in spans:
        took = s["end"] - s["start"]
        category = s["category"]
        if category == "step":
            total["step"] += took
        elif category in _COMPUTE:
            total["compute"] += took
        elif category == "wait":
            total["waiting"] += took
            if s["name"] == "wait":  # inside a receive, which counted it too
                total["communication"] -= took
        elif category in _COMMUNICATION:
            total["communication"] += took
        elif category == "optimizer":
            total["optimizer"] += took
        elif category == "data":
            total["data"] += took
    total["other"] = total["step"] - sum(total[c] for c in COLUMNS if c != "other")
    return {c: total[c] for c in ("step", *COLUMNS)}


def format_measured(report: MeasuredReport) -> str:
    steps = report["steps"]
    which = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
    who = "device" if report["one_process"] else "rank"
    lines = [f"measured: {report['trace']}, {report['schedule']}, ms per step over {which}"]
    if report.get("warm_up_only"):
        lines.append(
            f"step {steps[0]} is the only traced step, the warm-up one (first calls, "
            "allocations): these are not a steady step's figures; trace 2 steps or more "
            "(run --steps and --trace-steps, default 3), and the first is left out"
        )
    lines += [
        "",
        f"{who:>6} {'step':>9} " + " ".join(f"{c:>13}" for c in COLUMNS) + "   bubble  predicted",
    ]
    devices = {int(row): device for row, device in report.get("row_devices", {}).items()}
    predicted = report["predicted_bubble"]
    for row, figures in report["rows"].items():
        step = figures["step"]
        cells = " ".join(f"{figures[c]:>13.3f}" for c in COLUMNS)
        bubble = figures["waiting"] / step if step else 0.0
        device = devices.get(int(row))
        guess = f"{predicted[device]:>9.1%}" if device is not None else f"{'-':>9}"
        lines.append(f"{row:>6} {step:>9.3f} {cells}   {bubble:>6.1%}  {guess}")
    if report["one_process"]:
        lines.append(
            "one process ran every device in turn: a device's waiting is the time the others "
            "ran, not a bubble (trace with --nproc for that)"
        )
    if report.get("spans_outside_steps"):
        lines.append(
            f"{report['spans_outside_steps']} spans outside their step (recorded between "
            "steps, an evaluation) are left out"
        )
    simulated = report["simulated_step_ms"]
    if simulated:
        lines.append(
            f"simulated step from the measured stage times: {simulated:.3f} ms; measured step "
            f"{report['measured_step_ms']:.3f} ms ({report['measured_over_simulated']:.2f}x)"
        )
    lines.append(f"predicted bubble: the simulator with the {report['predicted_costs']} costs")
    return "\n".join(lines)
