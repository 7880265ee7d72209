"""The balance report: per stage its ops, parameters, FLOPs, predicted time, activation and
communication bytes and memory, then the bottleneck against the lower bound and the optimum.

Read from an emitted manifest (``balance`` as the balancer wrote it, the stages' measured
activation bytes, the edges) and the program, so `pipecompile show` and the compile summary
print the same figures.
"""

from __future__ import annotations

from typing import Any

from pipecompile.ir.programs.memory_model import peak_stored_bytes, peak_weight_copies
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.simulate import Costs
from pipecompile.ir.programs.topology import side_by_side, topology_from_manifest
from pipecompile.ir.records.balance_report import BalanceReport
from pipecompile.ir.records.manifest import Manifest
from pipecompile.ir.records.sizes import format_count, format_size

__all__ = ["stage_rows", "balance_lines", "shape_lines", "stage_costs"]


def stage_rows(manifest: Manifest, program: Program) -> list[dict[str, Any]]:
    """Per stage, the report's figures (None where the manifest lacks them)."""
    balance = manifest.balance
    edges, stages = manifest.edges, manifest.stages
    states = 2 + int(((balance.model if balance else None) or {}).get("optimizer_states", 2))
    timed = balance is not None and balance.unit == "ns"
    saved = [s.activation_bytes.saved if s.activation_bytes else 0 for s in stages]
    inputs = [s.activation_bytes.inputs if s.activation_bytes else 0 for s in stages]
    replicas = manifest.replica_counts
    rows = []
    for j, s in enumerate(stages):
        d = program.stage_device[j]
        own = [x if k == j else 0 for k, x in enumerate(saved)]
        own_inputs = [x if k == j else 0 for k, x in enumerate(inputs)]
        activations = peak_stored_bytes(program, own, own_inputs)[d]
        copies = peak_weight_copies([x for x in program.devices[d] if x.stage == j])
        rows.append(
            {
                "stage": j,
                "device": d,
                "replicas": replicas[j],
                "ops": balance.at("stage_ops", j) if balance else None,
                "param_bytes": s.param_bytes,
                "flops": s.flops,
                "time_ns": balance.at("stage_costs", j) if timed else None,  # type: ignore[union-attr]
                "compute_ns": balance.at("stage_compute", j) if timed else None,  # type: ignore[union-attr]
                "comm_ns": balance.at("stage_comm", j) if timed else None,  # type: ignore[union-attr]
                "activation_bytes": saved[j],
                "sent_bytes": sum(e.nbytes for e in edges if e.src == j),
                "received_bytes": sum(e.nbytes for e in edges if e.dst == j),
                "memory_bytes": (states + copies) * s.param_bytes + activations,
            }
        )
    return rows


def stage_costs(manifest: Manifest) -> tuple[Costs, str]:
    """The costs to simulate the program with, and their unit: the balancer's predicted
    stage times split one third forward, two thirds backward (``"ns"``), or, for manifests
    without them, the stages' forward FLOPs with a backward of twice that (``"flops"``)."""
    balance = manifest.balance
    if balance is None or balance.unit != "ns":
        return Costs.from_flops([s.flops for s in manifest.stages]), "flops"
    times = [float(t) for t in balance.stage_costs]
    return Costs(tuple(t / 3 for t in times), tuple(2 * t / 3 for t in times)), "ns"


def balance_lines(balance: BalanceReport | None, rows: list[dict[str, Any]]) -> list[str]:
    """The report as text: ``balance`` is the manifest's (``Manifest.balance``)."""
    header = (
        "stage",
        "device",
        "ops",
        "params",
        "FLOPs",
        "time us",
        "comm us",
        "act/mb",
        "sent",
        "received",
        "memory",
    )
    table = [header]
    for r in rows:
        device = f"{r['device']}" + (f" x{r['replicas']}" if r["replicas"] > 1 else "")
        table.append(
            (
                str(r["stage"]),
                device,
                str(r["ops"] or "-"),
                format_size(r["param_bytes"]),
                format_count(r["flops"]),
                _us(r["time_ns"]),
                _us(r["comm_ns"]),
                format_size(r["activation_bytes"]),
                format_size(r["sent_bytes"]),
                format_size(r["received_bytes"]),
                format_size(r["memory_bytes"]),
            )
        )
    widths = [max(len(row[k]) for row in table) for k in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in table]
    if balance:
        lines.append(_verdict(balance))
    return lines


def _verdict(balance: BalanceReport) -> str:
    unit = balance.unit
    show = (lambda v: f"{v / 1000:.2f} us") if unit == "ns" else format_count
    if unit == "bytes":
        show = format_size
    model = balance.model or {}
    what = f"balance on {balance.cost}"
    if unit == "ns" and model.get("bandwidth"):
        what += f", links at {format_count(model['bandwidth'], 'B/s')}"
    elif unit == "ns":
        what += ", communication ignored"
    line = (
        f"{what}: bottleneck {show(balance.bottleneck)}, lower bound "
        f"{show(balance.lower_bound)} "
        f"({balance.bottleneck / max(balance.lower_bound, 1e-9):.3f}x), "
        f"optimum {show(balance.bottleneck)} (exact)"
    )
    if balance.requested_boundaries:
        line += (
            f"; without the {balance.requested_boundaries} requested boundaries "
            f"{show(balance.unconstrained_optimum)}"
        )
    return line


def _us(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1000:.2f}"


def shape_lines(manifest: Manifest, program: Program) -> list[str]:
    """The plan's shape where the compile priced a stage graph: which stages run side by
    side, and the priced steps of both shapes."""
    balance = manifest.balance
    if balance is None or not balance.shapes:
        return []
    ratio = balance.shapes["graph"] / balance.shapes["chain"]
    if balance.shape != "graph" and ratio >= 1:
        return [
            f"plan: a chain; a stage graph (branches on devices of their own) was priced at "
            f"{ratio:.2f}x its step (--graph takes it)"
        ]
    if balance.shape != "graph":
        return [
            f"plan: a chain; a stage graph (branches on devices of their own) was priced at "
            f"{ratio:.2f}x its step, too little gain for its extra stages (--graph takes it)"
        ]
    apart = side_by_side(topology_from_manifest(manifest), program.stage_device)
    devices = len(program.devices)
    return [
        f"plan: a stage graph, {len(program.stage_device)} stages on {devices} devices; stages "
        f"{', '.join(map(str, apart[:-1]))} and {apart[-1]} run side by side; priced step "
        f"{ratio:.2f}x the best chain's (--chain takes the chain)"
    ]
