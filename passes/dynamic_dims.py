"""Pass: dynamic_dims — which input dimensions may change from batch to batch, and how the
shape of every value crossing a stage boundary follows them.

Requires: split_stages has run (each traced node has its stage).
Guarantees: a ``DynamicDims`` whose every message shape is predicted exactly by
``DynamicDims.shape_of`` from the sizes of the dimensions (its symbols) in a micro-batch, so a
rank receiving a message of a batch of another shape allocates it without asking the sender.

Each symbol (``batch``, ``seq``, or a name the model file's ``dynamic_shapes()`` gives) is
probed on fake tensors: the traced model runs with that symbol's dimensions doubled, and then
with every symbol one larger. A message dimension must be its traced size times a power of
each symbol's ratio (``B``, ``B*T``, ``T``: exponents 0, 1, 2) in both probes. Two things make a
symbol impossible, and each is named with the op, its module and its line: the model fails or
fixes the size itself (a ``view`` with a constant), or a number computed from it by other
means than sizes and arithmetic crosses a boundary (the split writes such numbers into the
consumer stage as constants; numbers of sizes it computes again there, ``split_stages``'s
``sizes_follow``). A symbol asked for is then an error. ``batch`` (dim 0 of every input) is
probed on every compile, asked or not: one that was not asked for is dropped instead when the
model fixes it, and the result says why (``fixed``; the compile prints it: batches must then
have the traced size under ``--nproc``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.fx as fx

from pipecompile.errors import ShapeError
from pipecompile.ir.graph.dynamic import DynamicDims, Exponents, with_batch
from pipecompile.ir.graph.node_info import info
from pipecompile.ir.graph.size_values import size_sources
from pipecompile.ir.graph.stage_graph import StageGraph
from pipecompile.ir.graph.user_frame import op_place

__all__ = ["DynamicDims", "dynamic_dims"]

Evaluate = Callable[..., tuple[dict[str, Any], Any, Any]]  # see dynamic_dims


def dynamic_dims(
    balanced: fx.GraphModule,
    graph: StageGraph,
    micro: dict[str, torch.Tensor],
    *,
    asked: dict[str, dict[int, str]] | None,
    evaluate: Evaluate,
    batch_dim: int = 0,
    batch: bool = True,
) -> DynamicDims:
    """Probe the symbols of ``asked`` (input -> dim -> symbol), and with ``batch`` also
    ``batch`` on every input's ``batch_dim`` that ``asked`` leaves free, on ``balanced``,
    traced on the micro-batch ``micro``. ``evaluate(module, [(shape, dtype)])``: every node's
    fake value on inputs of those shapes, with the node that failed and its error (the front
    end's ``fake_values``). A batch the model fixes is dropped, and the result's ``fixed``
    says why.

    Raises:
        ShapeError: a symbol ``asked`` for cannot change (named with its op).
    """
    asked = asked or {}
    wanted = with_batch(asked, micro, batch_dim) if batch else asked
    probe = (balanced, graph, micro, evaluate, batch_dim)
    found, problem = _probed(*probe, wanted, strict=asked)
    if problem is None or wanted == asked:
        if problem is not None:
            raise ShapeError(problem)
        return found
    alone, own = _probed(*probe, asked, strict=asked)
    if own is not None:
        raise ShapeError(own)  # what was asked for fails on its own
    return replace(alone, fixed=problem)


def _probed(  # type: ignore[no-untyped-def]
    balanced, graph, micro, evaluate, batch_dim, wanted, *, strict
) -> tuple[DynamicDims, str | None]:
    """The dimensions of ``wanted``, and why one cannot change or None (the sizes of the
    symbols ``strict`` asks for must agree between inputs)."""
    sizes = _sizes(wanted, micro, strict={s for dims in strict.values() for s in dims.values()})
    if not sizes:
        return DynamicDims(), None
    edges, problem = _measure(balanced, graph, micro, wanted, sizes, evaluate)
    inputs = {n: dict(dims) for n, dims in wanted.items() if dims}
    split = tuple(
        sorted({s for dims in inputs.values() for d, s in dims.items() if d == batch_dim})
    )
    return DynamicDims(inputs, sizes, edges, split), problem


def _sizes(
    wanted: dict[str, dict[int, str]], micro: dict[str, torch.Tensor], *, strict: set[str]
) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for name, dims in wanted.items():
        if name not in micro:
            raise ShapeError(
                f"dynamic_shapes() names input {name!r}, which the model does not take "
                f"(its inputs: {', '.join(micro)})"
            )
        tensor = micro[name]
        for d, symbol in dims.items():
            if not 0 <= d < tensor.dim():
                raise ShapeError(
                    f"dynamic_shapes() makes dim {d} of input {name!r} {symbol!r}, but it has "
                    f"{tensor.dim()} dims (shape {tuple(tensor.shape)})"
                )
            size = tensor.shape[d]
            if sizes.setdefault(symbol, size) != size and symbol in strict:
                raise ShapeError(
                    f"{symbol!r} is dim {d} of input {name!r} (size {size}) and another input's "
                    f"of size {sizes[symbol]}: one symbol, one size in the example batch"
                )
    return sizes


def _probe_inputs(
    micro: dict[str, torch.Tensor], wanted: dict[str, dict[int, str]], sizes: dict[str, int]
) -> list[tuple[tuple[int, ...], torch.dtype]]:
    shapes = []
    for name, tensor in micro.items():
        dims = wanted.get(name, {})
        shape = tuple(sizes[dims[d]] if d in dims else n for d, n in enumerate(tensor.shape))
        shapes.append((shape, tensor.dtype))
    return shapes


def _run(balanced, micro, wanted, sizes, evaluate) -> tuple[dict[str, Any], str | None]:  # type: ignore[no-untyped-def]
    values, node, err = evaluate(balanced, _probe_inputs(micro, wanted, sizes))
    if err is None:
        return values, None
    assert node is not None
    return values, f"{op_place(node)} fails: {type(err).__name__}: {str(err).splitlines()[0][:200]}"


def _probes(sizes: dict[str, int]) -> list[tuple[str, dict[str, int]]]:
    """Each symbol doubled alone, then every symbol one larger."""
    doubled = [(s, {**sizes, s: 2 * n}) for s, n in sorted(sizes.items())]
    return [*doubled, ("", {s: n + 1 for s, n in sizes.items()})]


def _measure(
    balanced, graph, micro, wanted, sizes, evaluate
) -> tuple[dict[str, dict[int, Exponents]], str | None]:  # type: ignore[no-untyped-def]
    """Each message's exponents, measured on the doubling probes and checked on the last;
    or why a symbol cannot change (the first reason found)."""
    base = {n.name: n.meta.get("val") for n in balanced.graph.nodes}
    crossing = _crossing_numbers(balanced)
    found: dict[str, dict[int, Exponents]] = {}
    for symbol, probe in _probes(sizes):
        named = symbol or ", ".join(sorted(sizes))
        values, failure = _run(balanced, micro, wanted, probe, evaluate)
        if failure is not None:
            return found, f"the model cannot take another {named} ({_sized(probe)}): {failure}"
        for node in crossing:
            if _plain(values.get(node.name)) != _plain(base[node.name]):
                return found, (
                    f"{op_place(node)} computes {_plain(base[node.name])} from the {named} and "
                    f"stage {_users_stage(node)} uses it: a number crossing a stage boundary is "
                    "written "
                    "into the stage that reads it as a constant, so it cannot follow the "
                    f"{named}; compute it in that stage (e.g. from a tensor it receives)"
                )
        for edge in graph.edges:
            have = _shape(values.get(_node_name(balanced, edge.value)))
            if have is not None and len(have) == len(edge.shape):
                if symbol:  # a doubling probe: measure
                    for d, (a, b) in enumerate(zip(edge.shape, have)):
                        if a != b:
                            found.setdefault(edge.value, {}).setdefault(d, {})[symbol] = _power(
                                a, b
                            )
                    exps = found.get(edge.value, {})
                    if all(e >= 0 for dims in exps.values() for e in dims.values()):
                        continue
                elif DynamicDims({}, sizes, found).shape_of(edge.value, edge.shape, probe) == have:
                    continue  # the last probe: predicted
            return found, (
                f"message {edge.value!r} (stage {edge.src} -> {edge.dst}, traced shape "
                f"{list(edge.shape)}) has shape {list(have or ())} for {_sized(probe)}, not its "
                f"traced size times a power of the {named} in each dimension, so no rank could "
                "size it ahead"
            )
    return found, None


def _power(old: int, new: int) -> int:
    ratio = new // old if old else 0
    if old == 0 or new % old or ratio & (ratio - 1):
        return -1
    return ratio.bit_length() - 1


def _crossing_numbers(balanced: fx.GraphModule) -> list[fx.Node]:
    """Nodes of non-tensor value read by a node of a later stage and written into it as
    constants (split_stages computes a number of sizes again there instead)."""
    out = []
    for node in balanced.graph.nodes:
        if node.op not in ("call_function", "call_method") or isinstance(
            node.meta.get("val"), torch.Tensor
        ):
            continue
        if size_sources(node) is not None:
            continue
        own = info(node).stage
        if any(u.op != "output" and info(u).stage not in (None, own) for u in node.users):
            out.append(node)
    return out


def _users_stage(node: fx.Node) -> int | None:
    own = info(node).stage
    return next((info(u).stage for u in node.users if info(u).stage not in (None, own)), None)


def _node_name(balanced: fx.GraphModule, value: str) -> str:
    """The traced node a message carries (an input travels under its parameter name)."""
    for node in balanced.graph.nodes:
        if node.op == "placeholder" and str(node.target) == value:
            return node.name
    return value


def _shape(value: Any) -> tuple[int, ...] | None:
    return tuple(int(n) for n in value.shape) if isinstance(value, torch.Tensor) else None


def _plain(value: Any) -> Any:
    if isinstance(value, (torch.Size, tuple, list)):
        return tuple(_plain(v) for v in value)
    return value if isinstance(value, (int, float, bool, str, type(None))) else repr(value)


def _sized(sizes: dict[str, int]) -> str:
    return ", ".join(f"{s}={n}" for s, n in sorted(sizes.items()))
