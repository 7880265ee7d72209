"""`run --trace FILE`: the traced steps as a Chrome/Perfetto trace, the simulated step beside.

The file is trace-event JSON (``{"traceEvents": [...]}``): one process row per rank (or, in one
process, per device) with a ``compute``, a ``communication`` and a ``step`` track, and one
complete event (``ph: X``, microseconds) per span with its category, step, stage and
micro-batch in ``args``. The last traced step is also simulated with the stage times this
trace measured (each stage's mean forward and backward over that step's micro-batches) and
drawn as its own process rows, starting where that step started. ``otherData`` says what was
traced and which device each row ran (``row_devices``: under ``--dp``, the ranks of every copy
share the devices); ``pipecompile show OUT --measured FILE`` reads it back.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict, TypeGuard

from pipecompile.errors import EmitError
from pipecompile.files.atomic import write_atomically
from pipecompile.files.disk import writing
from pipecompile.files.writable import check_file
from pipecompile.ir.programs.instr import Op
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.simulate import Costs, simulate
from pipecompile.ir.programs.topology import Topology
from pipecompile.runtime.timeline import CATEGORY, TRACKS, DeviceSpan, SpanArgs, SpanTimes

__all__ = [
    "FORMAT",
    "SIMULATED_PID",
    "EventArgs",
    "MetaEvent",
    "RankSpan",
    "SpanEvent",
    "TraceDocument",
    "TraceInfo",
    "check_trace_file",
    "is_trace_document",
    "trace_document",
    "write_trace",
]

FORMAT = "pipecompile-trace-1"
SIMULATED_PID = 1000  # simulated device d is process SIMULATED_PID + d


class RankSpan(DeviceSpan):
    """A span as a rank sends it to rank 0, which writes the trace."""

    rank: int


class EventArgs(SpanArgs):
    """A complete event's ``args``: its step, stage and micro-batch; a simulated one says so."""

    step: int
    simulated: NotRequired[bool]


class SpanEvent(TypedDict):
    """A complete event (``ph: X``): one span, in microseconds since the first."""

    ph: Literal["X"]
    name: str
    cat: str
    pid: int
    tid: int
    ts: float
    dur: float
    args: EventArgs


class MetaArgs(TypedDict, total=False):
    name: str
    sort_index: int


class MetaEvent(TypedDict):
    """A metadata event (``ph: M``): a process's or a thread's name, a process's place."""

    ph: Literal["M"]
    name: str
    pid: int
    tid: NotRequired[int]
    args: MetaArgs


class TraceInfo(TypedDict):
    """The trace's ``otherData``: what was traced (``row_devices``: not in older traces)."""

    format: str
    schedule: str
    devices: int
    stages: int
    microbatches: int
    traced_steps: list[int]
    one_process: bool
    row_devices: NotRequired[dict[str, int]]
    simulated: str


class TraceDocument(TypedDict):
    """The trace file's JSON object."""

    traceEvents: list[SpanEvent | MetaEvent]
    displayTimeUnit: str
    otherData: TraceInfo


def check_trace_file(path: Path) -> None:
    """Refuse, before a run starts, a trace file that cannot be written or that is not one a
    run wrote (a user's file named by mistake).

    Raises:
        EmitError: naming ``path`` and the way out.
    """
    check_file(path, "the trace")
    if path.exists() and not is_our_trace(path):
        raise EmitError(
            f"cannot write the trace to {path}: the file is not a trace pipecompile wrote; "
            "name a new file with --trace FILE"
        )


def is_our_trace(path: Path) -> bool:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return is_trace_document(document)


def is_trace_document(document: Any) -> TypeGuard[TraceDocument]:
    """Whether parsed JSON is a trace `run --trace` wrote (its ``otherData`` marker)."""
    return isinstance(document, dict) and document.get("otherData", {}).get("format") == FORMAT


def write_trace(path: Path, document: TraceDocument) -> None:
    """Write ``document`` to ``path`` whole or not at all (a temporary file renamed)."""
    with writing("write the trace to", path):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(document))


def trace_document(
    spans: Sequence[RankSpan],
    program: Program,
    topology: Topology,
    *,
    one_process: bool,
    traced_steps: Sequence[int],
    threads: dict[int, int] | None = None,
) -> TraceDocument:
    """The trace of ``spans`` (``MeasuredSpan.as_dict()`` plus ``rank``) and the simulated step;
    ``threads``: each rank's intra-op threads, shown in its row's name."""
    threads = threads or {}
    origin = min((s["start"] for s in spans), default=0)
    events: list[SpanEvent | MetaEvent] = []
    rows: dict[int, str] = {}
    row_devices: dict[str, int] = {}
    for s in spans:
        pid = s["device"] if one_process else s["rank"]
        row_devices[str(pid)] = s["device"]
        count = threads.get(s["rank"])
        using = f" ({count} thread{'s' * (count != 1)})" if count else ""
        where = (
            f"device {s['device']}" if one_process else f"rank {s['rank']}, device {s['device']}"
        )
        rows[pid] = where + using
        events.append(
            {
                "ph": "X",
                "name": s["name"],
                "cat": s["category"],
                "pid": pid,
                "tid": TRACKS.index(s["track"]),
                "ts": (s["start"] - origin) / 1e3,
                "dur": (s["end"] - s["start"]) / 1e3,
                "args": {"step": s["step"], **s["args"]},
            }
        )
    events += _names(rows, "measured")
    simulated, note = _simulated(spans, program, topology, origin)
    events += simulated
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "format": FORMAT,
            "schedule": program.schedule,
            "devices": len(program.devices),
            "stages": program.num_stages,
            "microbatches": program.microbatches,
            "traced_steps": list(traced_steps),
            "one_process": one_process,
            "row_devices": dict(sorted(row_devices.items(), key=lambda item: int(item[0]))),
            "simulated": note,
        },
    }


def _names(rows: dict[int, str], kind: str) -> list[MetaEvent]:
    events: list[MetaEvent] = []
    for pid, name in sorted(rows.items()):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}
        )
        for tid, track in enumerate(TRACKS if kind == "measured" else ("compute",)):
            events.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": track}}
            )
    return events


def measured_costs(spans: Sequence[SpanTimes], stages: int, step: int) -> Costs | None:
    """Each stage's mean forward and backward (B, or I plus W) over ``step``'s micro-batches,
    in ns; None when a stage has no forward in it."""
    forward: dict[int, list[int]] = defaultdict(list)
    recomputed: set[tuple[int, int]] = set()
    backward: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for s in spans:
        if s["step"] != step or "stage" not in s["args"] or "microbatch" not in s["args"]:
            continue
        op = _op(s["name"])
        j, i, took = s["args"]["stage"], s["args"]["microbatch"], s["end"] - s["start"]
        if op in (Op.F, Op.FC):
            forward[j].append(took)
            if op == Op.FC:
                recomputed.add((j, i))
        elif op in (Op.B, Op.I, Op.W):
            backward[j][i] += took
    if any(not forward[j] for j in range(stages)):
        return None
    mean_forward = [sum(forward[j]) / len(forward[j]) for j in range(stages)]
    mean_backward = []
    for j in range(stages):
        # the simulator adds the recomputation to a recomputed micro-batch's backward itself
        own = [t - mean_forward[j] * ((j, i) in recomputed) for i, t in backward[j].items()]
        mean_backward.append(max(sum(own) / len(own), 0.0) if own else 0.0)
    return Costs(tuple(mean_forward), tuple(mean_backward))


def _op(name: str) -> Op | None:
    """The op of an instruction's span name (``1F0`` -> F); None for other spans."""
    body = name.lstrip("0123456789").rstrip("0123456789")
    return Op(body) if body in CATEGORY else None


def _simulated(
    spans: Sequence[RankSpan], program: Program, topology: Topology, origin: int
) -> tuple[list[SpanEvent | MetaEvent], str]:
    steps = sorted({s["step"] for s in spans if s["category"] == "step"})
    if not steps:
        return [], "no step was traced"
    last = steps[-1]
    costs = measured_costs(spans, program.num_stages, last)
    if costs is None:
        return [], f"step {last} has no forward of every stage (an inference-only trace?)"
    timeline = simulate(program, topology, costs)
    begin = min(s["start"] for s in spans if s["category"] == "step" and s["step"] == last)
    events: list[SpanEvent | MetaEvent] = [
        {
            "ph": "X",
            "name": str(span.instr),
            "cat": CATEGORY.get(span.instr.op, "other"),
            "pid": SIMULATED_PID + span.device,
            "tid": 0,
            "ts": (begin - origin + span.start) / 1e3,
            "dur": (span.end - span.start) / 1e3,
            "args": {"step": last, "stage": span.instr.stage, "simulated": True},
        }
        for span in timeline.spans
        if span.end > span.start
    ]
    rows = {SIMULATED_PID + d: f"simulated device {d}" for d in range(len(program.devices))}
    note = (
        f"step {last} with the stage times it measured: makespan {timeline.makespan / 1e6:.3f} ms"
    )
    return events + _names(rows, "simulated"), note
