"""`run --check --batch-shapes 16x128,5x17`: the check at other sizes of the dimensions the
compile made dynamic (``--dynamic``, ``dynamic_shapes()``).

Each shape gives one size per symbol, the batch first, then the others in name order
(``batch`` x ``seq`` for ``--dynamic batch,seq``). The example batch is cut or repeated to it:
every input along its symbols' dimensions, and every target along each dimension whose size
is the example's size of a symbol (its rows, its length, or their product, flattened)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch

from pipecompile.errors import CheckError, PipecompileError
from pipecompile.ir.graph.dynamic import DynamicDims
from pipecompile.model.model_file import ModelSpec

__all__ = ["parse_batch_shapes", "symbol_order", "at_shape", "checked_shapes", "check_shapes"]


def symbol_order(dynamic: DynamicDims) -> tuple[str, ...]:
    """The symbols in the order a ``--batch-shapes`` item gives their sizes."""
    return (*dynamic.split, *(s for s in dynamic.symbols if s not in dynamic.split))


def parse_batch_shapes(text: str, dynamic: DynamicDims, count: int) -> list[dict[str, int]]:
    """``16x128,5x17`` -> one {symbol: size} per item (``count``: the micro-batches).

    Raises:
        PipecompileError: no dynamic dimensions, or an item that is not one positive size
            per symbol.
    """
    order = symbol_order(dynamic)
    if not order:
        raise PipecompileError(
            f"--batch-shapes {text}: the compile has no dimension that varies (the model fixes "
            "the batch, or it was compiled with --dynamic none: its manifest's dynamic.fixed "
            "says which); recompile without --dynamic none, or with --dynamic seq"
        )
    shapes = []
    for item in text.split(","):
        parts = item.strip().split("x")
        if len(parts) != len(order) or not all(p.isdigit() and int(p) > 0 for p in parts):
            like = "x".join(str(_example(dynamic, count)[s]) for s in order)
            raise PipecompileError(
                f"--batch-shapes: {item.strip()!r} is not {len(order)} positive "
                f"size{'s' if len(order) > 1 else ''} ({'x'.join(order)}), e.g. {like}"
            )
        sizes = dict(zip(order, map(int, parts)))
        _within_maxima(item.strip(), sizes, dynamic)
        shapes.append(sizes)
    return shapes


def _within_maxima(item: str, sizes: dict[str, int], dynamic: DynamicDims) -> None:
    for symbol, size in sizes.items():
        top = dynamic.maxima.get(symbol)
        if top is not None and size > top:
            where = ", ".join(
                f"input {name!r} dim {d}"
                for name, dims in dynamic.inputs.items()
                for d, s in dims.items()
                if s == symbol
            )
            raise PipecompileError(
                f"--batch-shapes {item}: its {symbol} ({where}) is {size}, above the maximum of "
                f"{top} that the model file's dynamic_shapes() states; check sizes up to {top}"
            )


def at_shape(spec: Any, dynamic: DynamicDims, sizes: dict[str, int], count: int) -> Any:
    """``spec`` with its example inputs and targets cut or repeated to ``sizes`` (a split
    symbol's size is the whole batch's; the example's is ``count`` micro-batches of it)."""
    example = _example(dynamic, count)
    inputs = {}
    for name, tensor in spec.inputs.items():
        for d, symbol in dynamic.inputs.get(name, {}).items():
            tensor = _resized(tensor, d, sizes[symbol])
        inputs[name] = tensor
    targets = tuple(_target(t, example, sizes) for t in spec.targets or ())
    return dataclasses.replace(spec, inputs=inputs, targets=targets)


def _example(dynamic: DynamicDims, count: int) -> dict[str, int]:
    """The example batch's size of each symbol (a split one's: ``count`` micro-batches)."""
    return {s: n * count if s in dynamic.split else n for s, n in dynamic.sizes.items()}


def _target(tensor: torch.Tensor, example: dict[str, int], sizes: dict[str, int]) -> torch.Tensor:
    whole = {math.prod(example.values()): math.prod(sizes.values())}  # flattened
    by_size = {example[s]: sizes[s] for s in example} | whole
    for d in range(tensor.dim()):
        if tensor.shape[d] in by_size:
            tensor = _resized(tensor, d, by_size[tensor.shape[d]])
    return tensor


def _resized(tensor: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``tensor`` cut to ``size`` along ``dim``, or repeated along it first."""
    have = tensor.shape[dim]
    if size > have:
        reps = [1] * tensor.dim()
        reps[dim] = -(-size // have)
        tensor = tensor.repeat(*reps)
    return tensor.narrow(dim, 0, size).contiguous()


def checked_shapes(spec: Any, pipe: Any, text: str | None) -> list[tuple[str, Any]]:
    """(label, spec) for each shape ``run --check`` checks: the example's alone without
    ``--batch-shapes``, else it and each listed one, labelled ``batch shape 5x17:``."""
    if text is None:
        return [("", spec)]
    dynamic, count = pipe.manifest.dynamic, pipe.program.microbatches
    shapes = parse_batch_shapes(text, dynamic, count)
    order = symbol_order(dynamic)
    example = _example(dynamic, count)
    out = [(f"batch shape {'x'.join(str(example[s]) for s in order)} (the example):", spec)]
    for sizes in shapes:
        label = f"batch shape {'x'.join(str(sizes[s]) for s in order)}:"
        out.append((label, at_shape(spec, dynamic, sizes, count)))
    return out


def check_shapes(
    spec: ModelSpec,
    pipe: Any,
    batch_shapes: str | None,
    compare: Callable[[ModelSpec], Any],
    *,
    show: bool = True,
    what: str = "pipelined results differ from the eager model",
) -> None:
    """`run --check`: ``compare`` (one step against the eager model, giving a report with
    ``ok``) on the example and on each ``--batch-shapes`` shape, each report printed when
    ``show`` (rank 0 of a distributed run).

    Raises:
        CheckError: a shape's results differ (the reports above say where).
    """
    ok = True
    for label, shaped in checked_shapes(spec, pipe, batch_shapes):
        report = compare(shaped)
        if show:
            print(f"{label}\n{report}" if label else report)
        ok = ok and report.ok
    if show and not ok:
        raise CheckError(f"{what} (see above)")
