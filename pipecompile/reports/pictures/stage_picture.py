"""The stage picture: each stage a coloured cluster of its layers, send and receive nodes at its
edges, and every cross-stage value an arrow labelled with its shape and bytes.

Read from an emitted manifest (``stages[j].layers``, ``edges``) and the program (which stages
run recomputed forwards). Stages are columns from left to right; a column's layers run down,
the next column's up, so each boundary's arrow is short (a snake). Arrows between a stage's
layers follow program order, not data flow::

    ┌ stage 0 ─────────────────────────┐      ┌ stage 1 ─────────────────────────────┐
    │ transformer.h.0                  │      │                     transformer.h.11 │
    │        ▼                         │      │                            ▲         │
    │ transformer.h.5 ─▶ send add_27 ──┼──────┼─▶ recv add_27 ─▶ transformer.h.6    │
    └──────────────────────────────────┘  ▲   └──────────────────────────────────────┘
                       add_27 [1, 16, 256] float32 16.00 KiB
"""

from __future__ import annotations

from collections.abc import Sequence

import graphviz  # type: ignore[import-untyped]

from pipecompile.ir.programs.instr import Op
from pipecompile.ir.programs.program import Program
from pipecompile.ir.records.manifest import Manifest, StageEntry
from pipecompile.ir.records.sizes import counted, format_count, format_size

__all__ = ["stage_dot", "STAGE_COLORS"]

# Pastel fills, one per stage (cycled); the cluster background is a lighter tint of each.
STAGE_COLORS = (
    "#a6cee3",
    "#b2df8a",
    "#fdbf6f",
    "#cab2d6",
    "#fb9a99",
    "#ffff99",
    "#8dd3c7",
    "#bebada",
    "#80b1d3",
    "#fccde5",
)
SEND_STYLE = {"shape": "cds", "fillcolor": "#fddbc7", "color": "#b2182b", "style": "filled"}
RECV_STYLE = {"shape": "cds", "fillcolor": "#d1e5f0", "color": "#2166ac", "style": "filled"}
_FONT = "Helvetica"


def stage_dot(manifest: Manifest, program: Program) -> graphviz.Digraph:
    """The stage picture of an emitted pipeline, as a graphviz graph for ``dot``.

    Args:
        manifest: the directory's ``manifest.json``; stages without ``layers`` (written by an
            older pipecompile) are drawn as one node with their op count.
        program: the directory's program; a stage with ``FC`` instructions is drawn with a
            dashed border and labelled recomputed.

    Returns:
        The graph; ``.source`` is its DOT text.
    """
    dot = graphviz.Digraph("stages", comment="pipecompile stage picture: dot -Tsvg stages.dot")
    # Left to right, a stage's layers share one rank (a column): ranks keep the columns in
    # stage order, and the flat edges between layers keep each column in program order.
    dot.attr(
        rankdir="LR",
        newrank="true",
        fontname=_FONT,
        labelloc="t",
        fontsize="16",
        nodesep="0.18",
        ranksep="0.3",
        label=_title(manifest),
    )
    dot.attr(
        "node",
        shape="box",
        style="rounded,filled",
        fontname=_FONT,
        fontsize="10",
        margin="0.08,0.03",
        height="0.3",
    )
    dot.attr("edge", fontname=_FONT, fontsize="9", color="#555555")
    recomputed = _recomputed(program)
    for j, stage in enumerate(manifest.stages):
        _stage_cluster(dot, manifest, j, stage, recomputed.get(j, 0))
    _model_inputs(dot, manifest)
    _model_outputs(dot, manifest)
    for e in manifest.edges:
        label = f"{e.value}\\n{_shape(e.shape)} {e.dtype}\\n{format_size(e.nbytes)}"
        # A value skipping stages is drawn lighter and left out of the ranking, so it cannot
        # stretch the columns it passes.
        skip = {} if e.dst == e.src + 1 else {"constraint": "false", "color": "#9a9a9a"}
        dot.edge(
            _send_id(e.src, e.value), _recv_id(e.dst, e.value), label=label, penwidth="1.5", **skip
        )
    return dot


def _title(manifest: Manifest) -> str:
    model = manifest.model
    name = (model and model.name) or "model"
    source = f"{model.file.rsplit('/', 1)[-1]}:{name}" if model and model.file else name
    stages, devices = len(manifest.stages), len(set(manifest.device_map))
    return (
        f"{source}: {stages} stages on {devices} devices, schedule {manifest.schedule},"
        f" {counted(manifest.microbatches, 'micro-batch')}"
    )


def _recomputed(program: Program) -> dict[int, int]:
    """Per stage, how many of its forwards are recomputed (``FC``)."""
    counts: dict[int, int] = {}
    for _, _, instr in program.instructions():
        if instr.op == Op.FC:
            counts[instr.stage] = counts.get(instr.stage, 0) + 1
    return counts


def _stage_cluster(
    dot: graphviz.Digraph, manifest: Manifest, j: int, stage: StageEntry, fc: int
) -> None:
    color = STAGE_COLORS[j % len(STAGE_COLORS)]
    style = "rounded,filled" + (",dashed" if fc else "")
    with dot.subgraph(name=f"cluster_{j}") as cluster:
        cluster.attr(
            label=_stage_label(manifest, j, stage, fc),
            style=style,
            color=_shade(color),
            fillcolor=_tint(color),
            penwidth="2" if fc else "1",
            fontsize="11",
            labeljust="l",
        )
        layers = _layer_ids(cluster, j, stage, manifest, color)
        with cluster.subgraph() as column:
            column.attr(rank="same")
            for node in layers:
                column.node(node)
        for a, b in zip(layers, layers[1:]):
            _down_or_up(cluster, a, b, up=j % 2 == 1)
        for value, _ in _incoming(manifest, j):
            cluster.node(_recv_id(j, value), f"recv {value}", **RECV_STYLE)
            cluster.edge(_recv_id(j, value), layers[0])
        for value in _outgoing(manifest, j):
            cluster.node(_send_id(j, value), f"send {value}", **SEND_STYLE)
            cluster.edge(layers[-1], _send_id(j, value))


def _down_or_up(graph: graphviz.Digraph, a: str, b: str, *, up: bool) -> None:
    """An arrow from ``a`` to ``b`` within a column: ``b`` below ``a``, or above it when the
    column runs up. Left to right, a flat edge puts its head above its tail, so a downward
    arrow is an edge from ``b`` to ``a`` drawn with its head at the tail."""
    if up:
        graph.edge(a, b)
    else:
        graph.edge(b, a, dir="back")


def _stage_label(manifest: Manifest, j: int, stage: StageEntry, fc: int) -> str:
    replicas = manifest.replica_counts[j]
    device = f"device {stage.device if stage.device is not None else manifest.device_map[j]}"
    if replicas > 1:
        device += f" ×{replicas} replicas"
    head = f"stage {j} · {device} · {format_count(stage.flops)} FLOPs · "
    head += f"{format_size(stage.param_bytes)} params\\l"
    if fc:
        head += f"recomputed: {fc} of {manifest.microbatches} forwards\\l"
    return head


def _layer_ids(
    cluster: graphviz.Digraph, j: int, stage: StageEntry, manifest: Manifest, color: str
) -> list[str]:
    """Add one node per layer group of stage ``j``; returns their ids in order."""
    groups: Sequence[tuple[str, int | None]] | None = stage.layers
    if not groups:  # an older manifest: one node for the whole stage
        ops = manifest.balance.at("stage_ops", j) if manifest.balance else None
        groups = [(stage.class_name, ops)]
    ids = []
    for k, (path, ops) in enumerate(groups):
        node = f"s{j}_l{k}"
        count = "" if ops is None else f"\\n{ops} op{'s' * (ops != 1)}"
        cluster.node(node, f"{path or '(top level)'}{count}", fillcolor=color)
        ids.append(node)
    return ids


def _incoming(manifest: Manifest, j: int) -> list[tuple[str, int]]:
    return [(e.value, e.src) for e in manifest.edges if e.dst == j]


def _outgoing(manifest: Manifest, j: int) -> list[str]:
    """The values stage ``j`` sends, each once however many stages read it."""
    values = [e.value for e in manifest.edges if e.src == j]
    return list(dict.fromkeys(values))


def _model_inputs(dot: graphviz.Digraph, manifest: Manifest) -> None:
    for name in manifest.inputs:
        dot.node(f"in_{name}", name, shape="oval", style="filled", fillcolor="white")
        dot.edge(f"in_{name}", "s0_l0")


def _model_outputs(dot: graphviz.Digraph, manifest: Manifest) -> None:
    last = len(manifest.stages) - 1
    groups = manifest.stages[last].layers or [None]
    names = manifest.outputs
    shown = ", ".join(names[:3]) + (f", … ({len(names)} values)" if len(names) > 3 else "")
    dot.node("out", f"output: {shown}", shape="oval", style="filled", fillcolor="white")
    dot.edge(f"s{last}_l{len(groups) - 1}", "out")


def _send_id(j: int, value: str) -> str:
    return f"s{j}_send_{value}"


def _recv_id(j: int, value: str) -> str:
    return f"s{j}_recv_{value}"


def _shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _tint(color: str, keep: float = 0.3) -> str:
    """``color`` mixed with white, keeping ``keep`` of it (a cluster's background)."""
    rgb = [int(color[k : k + 2], 16) for k in (1, 3, 5)]
    return "#" + "".join(f"{round(255 - (255 - c) * keep):02x}" for c in rgb)


def _shade(color: str, keep: float = 0.6) -> str:
    """``color`` darkened to ``keep`` of its brightness (a cluster's border)."""
    rgb = [int(color[k : k + 2], 16) for k in (1, 3, 5)]
    return "#" + "".join(f"{round(c * keep):02x}" for c in rgb)
