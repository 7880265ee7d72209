"""Which input dimensions may change from batch to batch (symbols), and how the shape of each
value crossing a stage boundary follows them: the manifest's ``dynamic`` entry, written by the
``dynamic_dims`` pass and read by the runtime to size the messages of any batch."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import torch

from pipecompile.errors import ShapeError
from pipecompile.ir.graph.microbatch import even_sizes

__all__ = [
    "DynamicDims",
    "DynamicJson",
    "Exponents",
    "StatedDims",
    "SHORTHANDS",
    "asked_dims",
    "asked_maxima",
    "fixed_batch_note",
    "merged_dynamic",
    "with_batch",
]

Exponents = dict[str, int]  # symbol -> its power in one dimension's size
# the model file's dynamic_shapes(): input -> dim -> its symbol, or (symbol, largest size)
StatedDims = Mapping[str, Mapping[int, str | tuple[str, int]]]


class DynamicJson(TypedDict):
    """The manifest's ``dynamic`` entry (``DynamicDims``, dimensions as strings); the last
    three keys are not in an earlier manifest's."""

    inputs: dict[str, dict[str, str]]
    sizes: dict[str, int]
    edges: dict[str, dict[str, Exponents]]
    split: NotRequired[list[str]]
    maxima: NotRequired[dict[str, int]]
    fixed: NotRequired[str]


@dataclass(frozen=True)
class DynamicDims:
    """``inputs``: input name -> dimension -> symbol; ``sizes``: each symbol's size in the
    traced micro-batch; ``edges``: value name -> dimension -> the symbols' exponents in its
    size (dimensions that follow no symbol are left out); ``split``: the symbols of the batch
    dimension, which the micro-batches divide; ``maxima``: the largest size of a symbol the
    model file states (``dynamic_shapes()``: ``{1: ("seq", 128)}``), a whole batch's;
    ``fixed``: why the batch dimension, which every compile tries to let vary, could not
    (the op that fixes it), or empty."""

    inputs: dict[str, dict[int, str]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    edges: dict[str, dict[int, Exponents]] = field(default_factory=dict)
    split: tuple[str, ...] = ()
    maxima: dict[str, int] = field(default_factory=dict)
    fixed: str = ""

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(sorted(self.sizes))

    def shape_of(
        self, value: str, traced: tuple[int, ...], sizes: dict[str, int]
    ) -> tuple[int, ...]:
        """``value``'s shape when the symbols have ``sizes`` (its traced shape ``traced``)."""
        dims = self.edges.get(value)
        if not dims:
            return traced
        shape = list(traced)
        for d, exponents in dims.items():
            num = shape[d] * math.prod(sizes[s] ** e for s, e in exponents.items())
            den = math.prod(self.sizes[s] ** e for s, e in exponents.items())
            shape[d] = num // den
        return tuple(shape)

    def sizes_of(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """Each symbol's size in a batch of ``inputs`` (a split symbol's: the whole batch's)."""
        found: dict[str, int] = {}
        for name, dims in self.inputs.items():
            tensor = inputs.get(name)
            if tensor is not None:
                for d, symbol in dims.items():
                    found.setdefault(symbol, int(tensor.shape[d]))
        return found

    def above_maximum(self, inputs: Mapping[str, torch.Tensor]) -> str | None:
        """Why ``inputs`` exceed a stated maximum (naming the input and the value), or None."""
        for name, dims in self.inputs.items():
            tensor = inputs.get(name)
            for d, symbol in dims.items():
                top = self.maxima.get(symbol)
                if tensor is not None and top is not None and tensor.shape[d] > top:
                    return (
                        f"input {name!r} has shape {tuple(tensor.shape)}: its {symbol} (dim {d}) "
                        f"is {tensor.shape[d]}, above the maximum of {top} that the model "
                        f"file's dynamic_shapes() states; cut such batches, or raise the maximum "
                        "and recompile"
                    )
        return None

    def per_microbatch(self, sizes: dict[str, int], count: int) -> list[dict[str, int]]:
        """``sizes`` of a batch, for each of its ``count`` micro-batches: a split symbol's
        divided as evenly as it can be (the larger first), the others as they are."""
        out: list[dict[str, int]] = [dict(sizes) for _ in range(count)]
        for symbol in self.split:
            for part, n in zip(out, even_sizes(sizes[symbol], count)):
                part[symbol] = n
        return out

    def to_json(self) -> DynamicJson:
        return {
            "inputs": {n: {str(d): s for d, s in dims.items()} for n, dims in self.inputs.items()},
            "sizes": dict(self.sizes),
            "edges": {
                v: {str(d): dict(e) for d, e in dims.items()} for v, dims in self.edges.items()
            },
            "split": list(self.split),
            "maxima": dict(self.maxima),
            "fixed": self.fixed,
        }

    @classmethod
    def from_json(cls, raw: DynamicJson | None) -> DynamicDims:
        if not raw:
            return cls()
        return cls(
            {n: {int(d): s for d, s in dims.items()} for n, dims in raw["inputs"].items()},
            {s: int(n) for s, n in raw["sizes"].items()},
            {v: {int(d): dict(e) for d, e in dims.items()} for v, dims in raw["edges"].items()},
            tuple(raw.get("split", ())),
            {s: int(n) for s, n in raw.get("maxima", {}).items()},
            str(raw.get("fixed", "")),
        )


SHORTHANDS = {"batch": "dim 0 of every input", "seq": "dim 1 of every input of two dims"}


def asked_dims(
    dynamic: Any, inputs: Mapping[str, torch.Tensor]
) -> dict[str, dict[int, str]] | None:
    """``dynamic`` as input -> dim -> symbol: a mapping as given (``dynamic_shapes()``), or
    symbol names (``--dynamic batch,seq``) laid on ``inputs`` (None: none asked).

    Raises:
        ShapeError: an unknown symbol name.
    """
    if dynamic is None:
        return None
    if isinstance(dynamic, str):
        dynamic = [s.strip() for s in dynamic.split(",") if s.strip()]
    if "none" in dynamic:
        if len(dynamic) > 1:
            raise ShapeError(
                f"--dynamic {','.join(dynamic)}: none keeps every size as traced; give it alone"
            )
        return {}
    if isinstance(dynamic, dict):
        return {
            str(n): {int(d): str(s if isinstance(s, str) else s[0]) for d, s in dims.items()}
            for n, dims in dynamic.items()
        }
    unknown = [s for s in dynamic if s not in SHORTHANDS]
    if unknown:
        raise ShapeError(
            f"--dynamic {unknown[0]}: no such dimension to vary; give batch "
            f"({SHORTHANDS['batch']}) and/or seq ({SHORTHANDS['seq']}), none (every size as "
            "traced), or define dynamic_shapes() in the model file"
        )
    asked: dict[str, dict[int, str]] = {}
    for name, tensor in inputs.items():
        dims = {}
        if "batch" in dynamic and tensor.dim() >= 1:
            dims[0] = "batch"
        if "seq" in dynamic and tensor.dim() == 2:
            dims[1] = "seq"
        if dims:
            asked[name] = dims
    return asked


def asked_maxima(dynamic: Any) -> dict[str, int]:
    """The maxima ``dynamic_shapes()`` states: ``{dim: (symbol, largest)}`` entries."""
    if not isinstance(dynamic, dict):
        return {}
    return {
        str(s[0]): int(s[1])
        for dims in dynamic.values()
        for s in dims.values()
        if not isinstance(s, str)
    }


def merged_dynamic(flag: str | None, stated: Any, inputs: Mapping[str, torch.Tensor]) -> Any:
    """``--dynamic``'s dimensions together with those the model file's ``dynamic_shapes()``
    states (its maxima kept), as one mapping; either alone as it is.

    Raises:
        ShapeError: the two give one dimension different symbols, or ``--dynamic none``
            would drop what the file states.
    """
    if flag is None or stated is None:
        return stated if flag is None else flag
    laid = asked_dims(flag, inputs)
    if laid == {}:
        raise ShapeError(
            f"--dynamic none keeps every size as traced, but the model file's dynamic_shapes() "
            f"lets {_listed(stated)} vary; drop --dynamic none, or the hook"
        )
    out = {name: dict(dims) for name, dims in stated.items()}
    for name, dims in (laid or {}).items():
        for d, symbol in dims.items():
            have = out.setdefault(name, {}).setdefault(d, symbol)
            if _symbol_name(have) != symbol:
                raise ShapeError(
                    f"--dynamic {flag} makes dim {d} of input {name!r} {symbol!r}, and the "
                    f"model file's dynamic_shapes() makes it {_symbol_name(have)!r}: drop the "
                    "flag (the hook already lets it vary), or give the hook the same name"
                )
    return out


def with_batch(
    asked: dict[str, dict[int, str]], inputs: Mapping[str, torch.Tensor], batch_dim: int = 0
) -> dict[str, dict[int, str]]:
    """``asked`` with ``batch`` added on every input's batch dimension that names nothing:
    what every compile tries to let vary."""
    out = {name: dict(dims) for name, dims in asked.items()}
    for name, tensor in inputs.items():
        if tensor.dim() > batch_dim and batch_dim not in out.get(name, {}):
            out.setdefault(name, {})[batch_dim] = "batch"
    return out


def _symbol_name(entry: Any) -> str:
    return str(entry if isinstance(entry, str) else entry[0])


def _listed(stated: StatedDims) -> str:
    return ", ".join(
        f"{name!r} dim {d} ({_symbol_name(s)})"
        for name, dims in stated.items()
        for d, s in dims.items()
    )


def fixed_batch_note(dynamic: DynamicDims, rows: int, microbatches: int) -> str:
    """What a compile says when the model fixes its batch size (``dynamic.fixed``)."""
    return (
        f"the batch size is fixed at {rows * microbatches} rows ({microbatches} "
        f"micro-batch{'es' if microbatches > 1 else ''} of {rows}): {dynamic.fixed}. Every "
        "batch must have that many rows (a last partial batch, evaluation and inference "
        "included); write the size from the tensor (x.shape[0], or -1 in a view) to let it vary"
    )
