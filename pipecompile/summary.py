"""The table printed after compiling: the balance report, the schedule's predictions, and
where the output went."""

from __future__ import annotations

from pathlib import Path

from pipecompile.balance_table import balance_lines, stage_costs, stage_rows
from pipecompile.compiler import Compiled, topology
from pipecompile.memory_model import peak_stored_bytes
from pipecompile.runtime.load import read_manifest
from pipecompile.simulate import Costs, simulate
from pipecompile.sizes import format_size

__all__ = ["summary"]


def summary(compiled: Compiled, out: str) -> str:
    """A few lines a person reads after `pipecompile MODEL --stages N -o OUT` (OUT emitted)."""
    manifest = read_manifest(Path(out))
    graph = compiled.graph
    rows = balance_lines(manifest, stage_rows(manifest, compiled.program))
    rows.append(
        f"tracer {graph.tracer}; schedule {compiled.program.schedule}, "
        f"{compiled.program.microbatches} micro-batch"
        f"{'es' if compiled.program.microbatches != 1 else ''} of {compiled.microbatch_size}"
    )
    rows.append(_schedule_line(compiled, *stage_costs(manifest)))
    rows.append(f"wrote {out}")
    return "\n".join(rows)


def _schedule_line(compiled: Compiled, costs: Costs, unit: str) -> str:
    program = compiled.program
    timeline = simulate(program, topology(compiled.graph), costs)
    line = f"predicted: bubble {timeline.bubble_fraction:.3f}"
    if unit == "ns":
        line += f", step {timeline.makespan / 1e3:.1f} us"
    line += f", peak in-flight micro-batches per device {list(timeline.peak_inflight)}"
    if compiled.memory:
        peaks = peak_stored_bytes(
            program, [m.saved for m in compiled.memory], [m.inputs for m in compiled.memory]
        )
        line += f", peak activations {format_size(max(peaks))}"
    checkpointed = sum(1 for _, _, x in program.instructions() if x.op == "FC")
    if checkpointed:
        line += f"; {checkpointed} checkpointed forwards"
    return line
