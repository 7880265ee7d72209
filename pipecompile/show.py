"""`pipecompile show OUT`: the simulated schedule of an emitted pipeline, as text or JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipecompile.compiler import topology_from_manifest
from pipecompile.memory_model import peak_stored_bytes
from pipecompile.program import Program
from pipecompile.runtime.load import read_manifest, read_program
from pipecompile.simulate import Costs, Timeline, simulate
from pipecompile.sizes import format_count as _num
from pipecompile.sizes import format_size
from pipecompile.timeline_text import timeline_text
from pipecompile.verify_program import verify_program

__all__ = ["schedule_report", "format_report", "closed_form"]

_MAX_DRAWN_CLOCKS = 160


def schedule_report(
    directory: str | Path, *, program_path: str | Path | None = None, uniform: bool = False
) -> tuple[dict[str, Any], Timeline]:
    """Simulate the directory's program (or ``program_path``, verified first).

    Costs are the stages' forward FLOPs (backward twice that) or, with ``uniform``, F = 1
    and B = 2 per stage. Returns the JSON-ready figures and the timeline.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    program = read_program(Path(program_path) if program_path else directory / manifest["program"])
    topology = topology_from_manifest(manifest)
    verify_program(program, topology)
    stages = manifest["stages"]
    costs = (
        Costs.uniform(len(stages)) if uniform else Costs.from_flops([s["flops"] for s in stages])
    )
    timeline = simulate(program, topology, costs)
    report: dict[str, Any] = {
        "schedule": program.schedule,
        "stages": program.num_stages,
        "devices": len(program.devices),
        "microbatches": program.microbatches,
        "costs": "uniform (F=1, B=2, I=W=1)" if uniform else "forward FLOPs (B = 2 F)",
        **timeline.as_dict(),
        "closed_form_bubble": closed_form(program),
        "checkpointed_forwards": sum(1 for _, _, x in program.instructions() if x.op == "FC"),
    }
    if all("activation_bytes" in s for s in stages):
        saved = [s["activation_bytes"]["saved"] for s in stages]
        inputs = [s["activation_bytes"]["inputs"] for s in stages]
        report["peak_activation_bytes"] = list(peak_stored_bytes(program, saved, inputs))
    report["balance"] = manifest.get("balance", {})
    report["stage_table"] = _stage_table(manifest, program)
    return report, timeline


def _stage_table(manifest: dict[str, Any], program: Program) -> list[dict[str, Any]]:
    """Per stage: ops, balanced cost, FLOPs, parameter, activation and traffic bytes."""
    balance = manifest.get("balance", {})
    edges = manifest.get("edges", [])
    rows = []
    for j, s in enumerate(manifest["stages"]):
        rows.append({
            "stage": j,
            "device": program.stage_device[j],
            "ops": (balance.get("stage_ops") or [None] * (j + 1))[j],
            "cost": (balance.get("stage_costs") or [None] * (j + 1))[j],
            "flops": s["flops"],
            "param_bytes": s["param_bytes"],
            "activation_bytes": s.get("activation_bytes", {}).get("saved"),
            "sent_bytes": sum(e["bytes"] for e in edges if e["src"] == j),
            "received_bytes": sum(e["bytes"] for e in edges if e["dst"] == j),
        })  # fmt: skip
    return rows


def closed_form(program: Program) -> float | None:
    """The textbook bubble fraction of the program's schedule with uniform costs, if any."""
    p, m = len(program.devices), program.microbatches
    v = program.num_stages // p
    if program.schedule in ("gpipe", "1f1b", "pipedream", "pipedream-vsync"):
        return (p - 1) / (m + p - 1)
    if program.schedule == "interleaved":
        return (p - 1) / (v * m + p - 1)
    if program.schedule == "zb1p" and m >= p:  # the zero-bubble closed form needs m >= p
        return (p - 1) / (3 * m + p - 1)
    return None


def _balance_lines(report: dict[str, Any]) -> list[str]:
    balance = report.get("balance") or {}
    rows = report.get("stage_table") or []
    lines = ["", "stage device   ops      cost     FLOPs    params  act/mb    sent  received"]
    for r in rows:
        lines.append(
            f"{r['stage']:>5} {r['device']:>6} {r['ops'] or '-':>5} {_num(r['cost']):>9} "
            f"{_num(r['flops']):>9} {format_size(r['param_bytes']):>9} "
            f"{format_size(r['activation_bytes'] or 0):>7} {format_size(r['sent_bytes']):>7} "
            f"{format_size(r['received_bytes']):>9}"
        )
    if balance:
        lines.append(
            f"balance on {balance['cost']}: bottleneck {_num(balance['bottleneck'])}, lower bound "
            f"{_num(balance['lower_bound'])} "
            f"({balance['bottleneck'] / max(balance['lower_bound'], 1):.3f}x), "
            f"optimum {_num(balance['bottleneck'])} (exact)"
            + (
                f"; without the {balance['requested_boundaries']} requested boundaries "
                f"{_num(balance['unconstrained_optimum'])}"
                if balance.get("requested_boundaries")
                else ""
            )
        )
    return lines


def format_report(report: dict[str, Any], timeline: Timeline) -> str:
    """The human-readable form: figures, one row per device, and the timetable if small."""
    lines = [
        f"schedule {report['schedule']}: {report['stages']} stages on {report['devices']} "
        f"devices, {report['microbatches']} micro-batches; costs: {report['costs']}",
        f"makespan {report['makespan']:.6g}   bubble fraction {report['bubble_fraction']:.4f}"
        + (
            f"   (closed form with uniform costs {report['closed_form_bubble']:.4f})"
            if report["closed_form_bubble"] is not None
            else ""
        ),
    ]
    if report["checkpointed_forwards"]:
        lines.append(f"checkpointed forwards (FC): {report['checkpointed_forwards']}")
    peaks = report.get("peak_activation_bytes")
    lines.append("device   busy        peak in-flight   peak activations")
    for d in range(report["devices"]):
        mem = format_size(peaks[d]) if peaks else "-"
        lines.append(
            f"{d:>6}   {report['busy'][d]:<10.6g}  {report['peak_inflight'][d]:>14}   {mem:>16}"
        )
    lines += _balance_lines(report)
    if report["costs"].startswith("uniform") and timeline.makespan <= _MAX_DRAWN_CLOCKS:
        lines += ["", timeline_text(timeline)]
    return "\n".join(lines)
