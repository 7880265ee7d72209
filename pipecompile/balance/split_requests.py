"""Where the user asked stages to start: ``pipecompile.split_point()`` markers in the graph
and ``--split-at [before:|after:]MODULE_PATH`` requests, as indices into the balancer's atoms."""

from __future__ import annotations

from collections.abc import Sequence

import torch.fx as fx

from pipecompile.errors import BalanceError
from pipecompile.ir.graph.split_point import is_split_point

__all__ = ["requested_starts", "module_paths", "pinned_costs", "parse_pins"]


def module_paths(node: fx.Node) -> list[str]:
    """The module paths ``node`` runs inside, outermost first (``h``, ``h.0``, ``h.0.attn``)."""
    stack = node.meta.get("nn_module_stack") or {}
    paths = [str(v[0]) for v in stack.values() if v and v[0]]
    if node.op == "call_module":
        paths.append(str(node.target))
    return paths


def requested_starts(
    graph: fx.Graph, atoms: list[list[fx.Node]], split_at: Sequence[str]
) -> list[int]:
    """Atom indices at which a stage must start.

    Raises:
        BalanceError: an unknown module path, or a request that falls where no stage may
            start (a value that is neither tensor nor constant crosses there).
    """
    first_atom = {atom[0]: k for k, atom in enumerate(atoms)}
    atom_of = {node: k for k, atom in enumerate(atoms) for node in atom}
    starts: set[int] = set()
    pending = False
    for node in graph.nodes:
        if is_split_point(node):
            pending = True
        elif pending and node in atom_of:
            starts.add(_must_start(first_atom, node, "pipecompile.split_point()"))
            pending = False
    ops = [node for atom in atoms for node in atom]
    for request in split_at:
        where, _, path = request.rpartition(":")
        if where not in ("", "before", "after"):
            raise BalanceError(f"--split-at {request!r}: write [before:|after:]MODULE_PATH")
        inside = [k for k, node in enumerate(ops) if path in module_paths(node)]
        if not inside:
            known = sorted({p for node in ops for p in module_paths(node)})
            near = [p for p in known if p.startswith(path.rsplit(".", 1)[0])][:8] or known[:8]
            raise BalanceError(
                f"--split-at {request!r}: no op runs inside module {path!r}; module paths "
                f"look like {', '.join(near)}"
            )
        position = inside[-1] + 1 if where == "after" else inside[0]
        if position == len(ops):
            raise BalanceError(f"--split-at {request!r}: nothing runs after {path!r}")
        if position > 0:
            starts.add(_must_start(first_atom, ops[position], f"--split-at {request!r}"))
    starts.discard(0)
    return sorted(starts)


def _must_start(first_atom: dict[fx.Node, int], node: fx.Node, what: str) -> int:
    if node not in first_atom:
        raise BalanceError(
            f"{what} asks for a stage to start at {node.name}, but a value that is neither a "
            "tensor nor a constant crosses there; move the boundary before or after it"
        )
    return first_atom[node]


def parse_pins(pairs: Sequence[str]) -> dict[str, int]:
    """``["h.0=5e6", "lm_head=0"]`` -> {"h.0": 5000000, "lm_head": 0}."""
    pins = {}
    for pair in pairs:
        path, _, value = pair.partition("=")
        try:
            pins[path] = int(float(value))
        except ValueError:
            raise BalanceError(
                f"--pin-cost {pair!r}: write MODULE_PATH=COST, e.g. h.0=2e6"
            ) from None
        if not path or pins[path] < 0:
            raise BalanceError(f"--pin-cost {pair!r}: write MODULE_PATH=COST with COST >= 0")
    return pins


def pinned_costs(
    ops: list[fx.Node], costs: dict[fx.Node, int], pins: dict[str, int]
) -> dict[fx.Node, int]:
    """``costs`` with every pinned module's ops replaced: its first op costs the pinned value,
    the others nothing (a nested pin overrides its parent's within its own ops)."""
    out = dict(costs)
    for path in sorted(pins, key=lambda p: p.count(".")):
        inside = [n for n in ops if path in module_paths(n)]
        if not inside:
            raise BalanceError(f"--pin-cost {path!r}: no op runs inside module {path!r}")
        for node in inside:
            out[node] = 0
        out[inside[0]] = pins[path]
    return out
