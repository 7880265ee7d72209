"""The table printed after compiling: per stage ops, FLOPs, parameters and traffic; balance."""

from __future__ import annotations

from pipecompile.compiler import Compiled, topology
from pipecompile.markers import is_recv, is_send
from pipecompile.memory_model import peak_stored_bytes
from pipecompile.simulate import Costs, simulate
from pipecompile.sizes import format_count, format_size

__all__ = ["summary"]


def summary(compiled: Compiled, out: str) -> str:
    """A few lines a person reads after `pipecompile MODEL --stages N`."""
    graph = compiled.graph
    total = sum(s.flops for s in graph.stages) or 1
    rows = ["stage  ops   fwd FLOPs  share   params   in/out values   sent bytes"]
    for s in graph.stages:
        ops = sum(
            1 for n in s.module.graph.nodes
            if n.op.startswith("call_") and not is_recv(n) and not is_send(n)
        )  # fmt: skip
        sent = sum(e.nbytes for e in graph.edges if e.src == s.index)
        rows.append(
            f"{s.index:>5} {ops:>4} {format_count(s.flops):>11} {100 * s.flops / total:5.1f}% "
            f"{format_count(s.param_bytes, 'B'):>8}   {len(s.inputs):>3} / {len(s.outputs):<3}     "
            f"{format_count(sent, 'B'):>9}"
        )
    worst = max(s.flops for s in graph.stages)
    bound = total / len(graph.stages)
    rows.append(
        f"bottleneck {format_count(worst)} FLOPs = {worst / bound:.3f} x the perfect split "
        f"({format_count(bound)}); tracer {graph.tracer}; schedule {compiled.program.schedule}, "
        f"{compiled.program.microbatches} micro-batches of {compiled.microbatch_size}"
    )
    rows.append(_schedule_line(compiled))
    rows.append(f"wrote {out}")
    return "\n".join(rows)


def _schedule_line(compiled: Compiled) -> str:
    program = compiled.program
    costs = Costs.from_flops([s.flops for s in compiled.graph.stages])
    timeline = simulate(program, topology(compiled.graph), costs)
    line = (
        f"predicted: bubble {timeline.bubble_fraction:.3f} (FLOP costs), peak in-flight "
        f"micro-batches per device {list(timeline.peak_inflight)}"
    )
    if compiled.memory:
        peaks = peak_stored_bytes(
            program, [m.saved for m in compiled.memory], [m.inputs for m in compiled.memory]
        )
        line += f", peak activations {format_size(max(peaks))}"
    checkpointed = sum(1 for _, _, x in program.instructions() if x.op == "FC")
    if checkpointed:
        line += f"; {checkpointed} checkpointed forwards"
    return line
