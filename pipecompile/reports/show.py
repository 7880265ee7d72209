"""`pipecompile show OUT`: the simulated schedule of an emitted pipeline, as text or JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipecompile.ir.programs.instr import Op
from pipecompile.ir.programs.memory_model import peak_stored_bytes
from pipecompile.ir.programs.simulate import Costs, Timeline, simulate
from pipecompile.ir.programs.topology import topology_from_manifest
from pipecompile.ir.programs.verify_program import verify_program
from pipecompile.ir.records.balance_report import BalanceReport
from pipecompile.ir.records.plan_record import PlanRecord
from pipecompile.ir.records.sizes import counted, format_size
from pipecompile.reports.balance_table import balance_lines, shape_lines, stage_costs, stage_rows
from pipecompile.reports.plan_table import plan_table
from pipecompile.reports.timeline_text import timeline_text
from pipecompile.runtime.load import open_emitted
from pipecompile.schedules.closed_forms import uniform_bubble

__all__ = ["schedule_report", "format_report"]

_MAX_DRAWN_CLOCKS = 160
_COSTS_IN = {
    "ns": "predicted stage times in ns (F = 1/3, B = 2/3 of each)",
    "flops": "forward FLOPs (B = 2 F)",
}


def schedule_report(
    directory: str | Path, *, program_path: str | Path | None = None, uniform: bool = False
) -> tuple[dict[str, Any], Timeline]:
    """Simulate the directory's program (or ``program_path``, verified first).

    Costs are the balancer's predicted stage times (forward a third, backward two thirds),
    the stages' forward FLOPs (backward twice that) for manifests without them, or, with
    ``uniform``, F = 1 and B = 2 per stage. Returns the JSON-ready figures and the timeline.
    """
    directory = Path(directory)
    _, manifest, program = open_emitted(directory, program_path)
    topology = topology_from_manifest(manifest)
    verify_program(program, topology)
    stages = manifest.stages
    if uniform:
        costs, what = Costs.uniform(len(stages)), "uniform (F=1, B=2, I=W=1)"
    else:
        costs, unit = stage_costs(manifest)
        what = _COSTS_IN[unit]
    timeline = simulate(program, topology, costs)
    recomputed = sum(1 for _, _, x in program.instructions() if x.op == Op.FC)
    report: dict[str, Any] = {
        "schedule": program.schedule,
        "stages": program.num_stages,
        "devices": len(program.devices),
        "microbatches": program.microbatches,
        "costs": what,
        **timeline.as_dict(),
        "closed_form_bubble": uniform_bubble(program),
        "recomputed_forwards": recomputed,
        "checkpointed_forwards": recomputed,  # the old key, kept for tools that read it
    }
    held = [s.activation_bytes for s in stages]
    if all(held):
        saved = [a.saved for a in held if a]
        inputs = [a.inputs for a in held if a]
        report["peak_activation_bytes"] = list(peak_stored_bytes(program, saved, inputs))
    report["balance"] = manifest.balance.as_json() if manifest.balance else {}
    report["stage_table"] = stage_rows(manifest, program)
    report["shape"] = shape_lines(manifest, program)
    if manifest.plan:
        report["plan"] = manifest.plan.as_json()
    if manifest.generate:
        report["generate"] = manifest.generate
    return report, timeline


def format_report(report: dict[str, Any], timeline: Timeline) -> str:
    """The human-readable form: figures, one row per device, and the timetable if small."""
    lines = [
        f"schedule {report['schedule']}: {report['stages']} stages on {report['devices']} "
        f"devices, {counted(report['microbatches'], 'micro-batch')}; costs: {report['costs']}",
        f"makespan {report['makespan']:.6g}   bubble fraction {report['bubble_fraction']:.4f}"
        + (
            f"   (closed form with uniform costs {report['closed_form_bubble']:.4f})"
            if report["closed_form_bubble"] is not None
            else ""
        ),
    ]
    if report["recomputed_forwards"]:
        lines.append(f"recomputed forwards (FC): {report['recomputed_forwards']}")
    peaks = report.get("peak_activation_bytes")
    lines.append("device   busy        peak in-flight   peak activations")
    for d in range(report["devices"]):
        mem = format_size(peaks[d]) if peaks else "-"
        lines.append(
            f"{d:>6}   {report['busy'][d]:<10.6g}  {report['peak_inflight'][d]:>14}   {mem:>16}"
        )
    lines += ["", *balance_lines(BalanceReport.from_json(report["balance"]), report["stage_table"])]
    lines += report.get("shape", [])
    if report.get("plan"):
        record = PlanRecord.from_json(report["plan"])
        lines += ["", plan_table(record)] if record is not None else []
    if report.get("generate"):
        from pipecompile.ir.records.generation_plan import GenerationPlan

        try:
            lines += ["", *GenerationPlan.from_json(report["generate"]).lines()]
        except (KeyError, TypeError, ValueError) as err:
            lines += ["", f"generate: the record is damaged ({err}); recompile with --generate"]
    if report["costs"].startswith("uniform") and timeline.makespan <= _MAX_DRAWN_CLOCKS:
        lines += ["", timeline_text(timeline)]
    return "\n".join(lines)
