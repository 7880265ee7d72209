"""The table printed after compiling: the balance report, the schedule's predictions, and
where the output went."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipecompile.ir.instr import Op
from pipecompile.ir.memory_model import peak_stored_bytes
from pipecompile.ir.program import Program
from pipecompile.ir.simulate import Costs, simulate
from pipecompile.ir.sizes import counted, format_size
from pipecompile.ir.topology import topology_from_manifest
from pipecompile.reports.balance_table import balance_lines, stage_costs, stage_rows
from pipecompile.runtime.load import read_manifest, read_program

__all__ = ["summary"]


def summary(out: Path) -> str:
    """A few lines a person reads after `pipecompile MODEL --stages N -o OUT`, read from the
    emitted directory ``out``."""
    manifest = read_manifest(Path(out))
    program = read_program(Path(out) / manifest["program"])
    rows = balance_lines(manifest, stage_rows(manifest, program))
    rows.append(
        f"tracer {manifest['model']['tracer']}; schedule {program.schedule}, "
        f"{counted(program.microbatches, 'micro-batch')} of {manifest['microbatch_size']}"
    )
    rows.append(_schedule_line(manifest, program, *stage_costs(manifest)))
    weights = _weights_line(manifest.get("weights") or {})
    if weights:
        rows.append(weights)
    rows.append(f"wrote {out}")
    return "\n".join(rows)


def _weights_line(weights: dict[str, Any]) -> str | None:
    """``weights: 148 of 148 tensors from model.safetensors (prefix 'transformer.' added)``."""
    if "loaded" not in weights:
        return None
    line = f"weights: {weights['loaded']} of {weights['model_tensors']} tensors from "
    line += Path(weights.get("checkpoint") or "the checkpoint").name
    for how, prefix in (weights.get("prefix") or {}).items():
        line += f" (prefix {prefix!r} {how})"
    if weights.get("missing"):
        line += f", {len(weights['missing'])} initialised (--allow-missing)"
    return line


def _schedule_line(manifest: dict[str, Any], program: Program, costs: Costs, unit: str) -> str:
    timeline = simulate(program, topology_from_manifest(manifest), costs)
    line = f"predicted: bubble {timeline.bubble_fraction:.3f}"
    if unit == "ns":
        line += f", step {timeline.makespan / 1e3:.1f} us"
    line += f", peak in-flight micro-batches per device {list(timeline.peak_inflight)}"
    stages = manifest["stages"]
    if all("activation_bytes" in s for s in stages):
        peaks = peak_stored_bytes(
            program,
            [s["activation_bytes"]["saved"] for s in stages],
            [s["activation_bytes"]["inputs"] for s in stages],
        )
        line += f", peak activations {format_size(max(peaks))}"
    checkpointed = sum(1 for _, _, x in program.instructions() if x.op == Op.FC)
    if checkpointed:
        line += f"; {checkpointed} checkpointed forwards"
    return line
