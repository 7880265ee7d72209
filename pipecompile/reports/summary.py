"""The table printed after compiling: the balance report, the schedule's predictions, and
where the output went."""

from __future__ import annotations

from pathlib import Path

from pipecompile.ir.programs.instr import Op
from pipecompile.ir.programs.memory_model import peak_stored_bytes
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.simulate import Costs, simulate
from pipecompile.ir.programs.topology import topology_from_manifest
from pipecompile.ir.records.batch_coupling import coupling_lines
from pipecompile.ir.records.manifest import Manifest, WeightsRecord
from pipecompile.ir.records.sizes import counted, format_size
from pipecompile.reports.balance_table import balance_lines, shape_lines, stage_costs, stage_rows
from pipecompile.reports.plan_table import plan_table, seconds_text
from pipecompile.runtime.load import open_emitted

__all__ = ["summary"]


def summary(out: Path) -> str:
    """A few lines a person reads after `pipecompile MODEL --stages N -o OUT`, read from the
    emitted directory ``out``."""
    _, manifest, program = open_emitted(out)
    rows = [plan_table(manifest.plan)] if manifest.plan else []
    rows += balance_lines(manifest.balance, stage_rows(manifest, program))
    rows += shape_lines(manifest, program)
    rows.append(
        f"tracer {manifest.model.tracer if manifest.model else '?'}; schedule "
        f"{program.schedule}, {counted(program.microbatches, 'micro-batch')} of "
        f"{manifest.microbatch_size}"
    )
    rows.append(_schedule_line(manifest, program, *stage_costs(manifest)))
    rows.append(_sizes_line(manifest, program.microbatches))
    rows += coupling_lines(
        manifest.batch_coupling, manifest.microbatch_size or 0, manifest.tail is not None
    )
    weights = _weights_line(manifest.weights)
    if weights:
        rows.append(weights)
    rows.append(f"wrote {out}")
    return "\n".join(rows)


def _sizes_line(manifest: Manifest, microbatches: int) -> str:
    """Which sizes a batch may have: ``sizes: batch, seq (at most 128) vary``, or why the
    batch is fixed (the model fixes it, or ``--dynamic none``)."""
    dynamic = manifest.dynamic
    rows = manifest.microbatch_size * microbatches
    if dynamic.fixed:
        return f"sizes: the batch is fixed at {rows} rows (the note above says where)"
    if not dynamic.symbols:
        return f"sizes: every size as traced (--dynamic none), a batch of {rows} rows"
    named = [
        f"{s} (at most {dynamic.maxima[s]})" if s in dynamic.maxima else s
        for s in (*dynamic.split, *(s for s in dynamic.symbols if s not in dynamic.split))
    ]
    return f"sizes: {', '.join(named)} may vary from batch to batch"


def _weights_line(weights: WeightsRecord | None) -> str | None:
    """``weights: 148 of 148 tensors from model.safetensors (prefix 'transformer.' added)``."""
    if weights is None or weights.loaded is None:
        return None
    line = f"weights: {weights.loaded} of {weights.model_tensors} tensors from "
    line += Path(weights.pretrained or "the pretrained weights").name
    for how, prefix in (weights.prefix or {}).items():
        line += f" (prefix {prefix!r} {how})"
    if weights.missing:
        line += f", {len(weights.missing)} initialised (--allow-missing)"
    return line


def _schedule_line(manifest: Manifest, program: Program, costs: Costs, unit: str) -> str:
    timeline = simulate(program, topology_from_manifest(manifest), costs)
    line = f"predicted: bubble {timeline.bubble_fraction:.3f}"
    plan_step = manifest.plan.chosen.predicted_step_s if manifest.plan else None
    if plan_step is not None:  # the search's own price: its model, not the flags' FLOP rate
        line += f", step {seconds_text(plan_step)} (the plan search's price, on this machine's "
        line += "calibration)"
    elif unit == "ns":
        line += f", step {timeline.makespan / 1e3:.1f} us"
    line += f", peak in-flight micro-batches per device {list(timeline.peak_inflight)}"
    held = [s.activation_bytes for s in manifest.stages]
    if all(held):
        peaks = peak_stored_bytes(
            program, [a.saved for a in held if a], [a.inputs for a in held if a]
        )
        line += f", peak activations {format_size(max(peaks))}"
    recomputed = sum(1 for _, _, x in program.instructions() if x.op == Op.FC)
    if recomputed:
        line += f"; {recomputed} recomputed forwards"
    return line
