"""Split a mini-batch into micro-batches along one dimension, and join results back.

A batch of N rows splits into m micro-batches as evenly as possible (the first N mod m get one
row more, ``even_sizes``); a synchronous step then weighs each micro-batch's mean loss by its
share of the rows (``row_shares``), so the gradient is the whole mini-batch's mean whatever N.

Also the checks that say, in the user's terms, why a mini-batch does not fit: an input of
another shape or dtype than compiled, targets of another batch size, an output that has no
batch dimension to join along.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from pipecompile.errors import InputError, MicrobatchError
from pipecompile.ir.records.sizes import counted

__all__ = [
    "check_divides",
    "even_sizes",
    "row_shares",
    "split_microbatches",
    "split_targets",
    "join_microbatches",
    "input_mismatch",
    "check_target_rows",
    "Compiled",
]

Compiled = Mapping[str, tuple[tuple[int, ...], str]]  # input name -> (micro-batch shape, dtype)


def even_sizes(rows: int, count: int) -> list[int]:
    """``rows`` split into ``count`` sizes as evenly as possible, the larger ones first."""
    base, extra = divmod(rows, count)
    return [base + (k < extra) for k in range(count)]


def row_shares(rows: int, count: int) -> list[float]:
    """Each micro-batch's rows over the average micro-batch's (1.0 each when ``count``
    divides ``rows``): the weight of its mean loss in the mini-batch's mean."""
    return [n * count / rows for n in even_sizes(rows, count)]


def batch_rows(tensors: Mapping[str, torch.Tensor], dim: int = 0) -> int | None:
    """The size along ``dim`` of the first tensor that has one (the batch's rows)."""
    return next((t.shape[dim] for t in tensors.values() if t.dim() > dim), None)


def check_divides(tensors: Mapping[str, torch.Tensor], count: int, dim: int = 0) -> None:
    """The example batch a compile traces one micro-batch of must divide evenly: the stages
    are traced on (and torch.export fixes) the micro-batch's size.

    Raises:
        MicrobatchError: a tensor's size along ``dim`` is not divisible by ``count``.
    """
    for name, tensor in tensors.items():
        size = tensor.shape[dim] if tensor.dim() > dim else None
        if size is None or size % count:
            raise MicrobatchError(
                f"input {name!r} has shape {tuple(tensor.shape)}: its size along dim {dim} "
                f"({size}) is not divisible into {counted(count, 'micro-batch')}; choose "
                f"--microbatches that divides {size} (batches of other sizes then split as "
                "evenly as they can)"
            )


def split_microbatches(
    tensors: Mapping[str, torch.Tensor], count: int, dim: int = 0, rows: int | None = None
) -> list[dict[str, torch.Tensor]]:
    """``count`` dicts of slices of every tensor along ``dim`` (``even_sizes`` of ``rows``,
    default the first tensor's size there; a tensor of a multiple of ``rows`` in proportion),
    each its own copy: a model that writes its input in place then changes neither the
    caller's tensor nor another micro-batch's (views of one tensor share a version counter).

    Raises:
        MicrobatchError: a tensor has fewer rows than ``count``, or a size along ``dim`` that
            does not split in step with ``rows``.
    """
    if count < 1:
        raise MicrobatchError(f"--microbatches must be at least 1, got {count}")
    rows = batch_rows(tensors, dim) if rows is None else rows
    sizes = {}
    for name, tensor in tensors.items():
        size = tensor.shape[dim] if tensor.dim() > dim else None
        if size is None or rows is None or size < count:
            raise MicrobatchError(
                f"{_label(name)} has shape {tuple(tensor.shape)}: "
                + (
                    f"{counted(size, 'row')} along dim {dim} cannot fill"
                    if size is not None
                    else f"it has no dim {dim} to split into"
                )
                + f" {counted(count, 'micro-batch')}; pass batches of at least {count} rows "
                "(drop a last, smaller batch), or compile with fewer --microbatches"
            )
        sizes[name] = _in_step(size, rows, count)
        if sizes[name] is None:
            raise MicrobatchError(
                f"{_label(name)} has shape {tuple(tensor.shape)}: its {size} rows along dim "
                f"{dim} do not split in step with the batch's {rows} into "
                f"{counted(count, 'micro-batch')}; give it {rows} rows or a multiple"
            )
    chunks = {name: t.split(sizes[name], dim) for name, t in tensors.items()}
    return [{name: parts[i].clone() for name, parts in chunks.items()} for i in range(count)]


def _label(name: str) -> str:
    return name if name.startswith("target ") else f"input {name!r}"


def _in_step(size: int, rows: int, count: int) -> list[int] | None:
    """The split of ``size`` rows that follows ``rows`` rows split evenly into ``count``."""
    if size % rows == 0:
        return [n * (size // rows) for n in even_sizes(rows, count)]
    if rows % count == 0 and size % count == 0:  # even parts of each: they line up
        return [size // count] * count
    return None


def split_targets(
    targets: Sequence[torch.Tensor], count: int, dim: int = 0, rows: int | None = None
) -> list[tuple[torch.Tensor, ...]]:
    """``count`` tuples of slices of every target tensor, in step with a batch of ``rows``
    rows (default: each target's own even split; errors name ``target k``)."""
    named = {f"target {k}": t for k, t in enumerate(targets)}
    parts = []
    for name, tensor in named.items():  # each in step with the batch, not the first target
        own = rows if rows is not None else batch_rows({name: tensor}, dim)
        parts.append(split_microbatches({name: tensor}, count, dim, own))
    return [tuple(p[i][f"target {k}"] for k, p in enumerate(parts)) for i in range(count)]


def join_microbatches(
    parts: Sequence[Sequence[torch.Tensor]], dim: int = 0, names: Sequence[str] = ()
) -> list[torch.Tensor]:
    """Concatenate per-micro-batch output lists position by position.

    Raises:
        MicrobatchError: an output is a scalar (no dimension ``dim`` to join along); the
            message names it by position and by ``names[k]`` when given.
    """
    for k in range(len(parts[0])):
        if any(not isinstance(p[k], torch.Tensor) or p[k].dim() <= dim for p in parts):
            raise MicrobatchError(
                f"{_output(k, names)} is a scalar, not a value per sample: the outputs of "
                f"the micro-batches are joined along dimension {dim}, the batch; return it "
                "per sample, or reduce it in loss_fn instead"
            )
    return [torch.cat([p[k] for p in parts], dim) for k in range(len(parts[0]))]


def input_mismatch(
    inputs: Mapping[str, torch.Tensor],
    compiled: Compiled,
    count: int,
    *,
    dim: int = 0,
    exact: bool = False,
    where: str = "the pipeline",
    free: Mapping[str, Mapping[int, str]] | None = None,
    fixed: str = "",
) -> str | None:
    """Why ``inputs`` do not fit the micro-batch shapes and dtypes ``compiled`` for, or None.

    The size along the batch dimension ``dim`` may differ unless ``exact`` (a distributed
    run's messages, and torch.export stages, have the compiled sizes); so may the dimensions
    ``free`` names per input (``--dynamic``: dim -> its symbol). ``fixed``: why the compile
    fixed the batch (the model does), for the message."""
    for name, tensor in inputs.items():
        if name not in compiled:
            continue
        shape, dtype = compiled[name]
        want = tuple(s * count if k == dim else s for k, s in enumerate(shape))
        have = tuple(tensor.shape)
        varies = (free or {}).get(name, {})
        same = len(have) == len(want) and all(
            h == w
            for k, (h, w) in enumerate(zip(have, want))
            if (exact or k != dim) and k not in varies
        )
        if not same:
            return (
                f"input {name!r} has shape {have} but {where} was compiled for {want} "
                f"({counted(count, 'micro-batch')} of {tuple(shape)}, batch first)"
                f"{_shape_hint(have, want, dim, exact, fixed)}; pass inputs of that shape, or "
                "recompile with these"
            )
        have_dtype = str(tensor.dtype).removeprefix("torch.")
        if have_dtype != dtype:
            return (
                f"input {name!r} has dtype {have_dtype} but {where} was compiled for {dtype}; "
                f"pass {dtype} inputs, or recompile with these"
            )
    return None


def check_target_rows(
    output: Any,
    targets: Sequence[Any],
    inputs: Mapping[str, torch.Tensor],
    *,
    split: bool,
    scale: int = 1,
    dim: int = 0,
    source: str = "the batch's targets",
) -> None:
    """When targets are split into micro-batches (``split``), each one's size along ``dim``
    must be the inputs' batch size or an output's (flattened (batch * seq) targets, output
    gradients), or its slices do not line up with theirs. ``output``, ``targets`` and
    ``inputs`` are one slice of the mini-batch; ``scale`` slices make it (for the message);
    ``source``: what to fix (the caller names the batch where it knows more).

    Raises:
        InputError: naming ``target k`` and the sizes it should have had.
    """
    if not split:
        return
    rows = {t.shape[dim] for t in inputs.values() if isinstance(t, torch.Tensor) and t.dim() > dim}
    leaves = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]
    outs = {t.shape[dim] for t in leaves if t.dim() > dim}
    for k, target in enumerate(targets):
        if not isinstance(target, torch.Tensor) or target.dim() <= dim:
            continue  # split_targets has refused what cannot be split
        if rows and target.shape[dim] not in rows | outs:
            shape = tuple(n * scale if d == dim else n for d, n in enumerate(target.shape))
            raise InputError(
                f"target {k} has shape {shape} but the inputs' batch is "
                f"{_sizes(rows, scale)} (outputs: {_sizes(outs, scale)}): targets are split "
                f"into micro-batches along dimension {dim} with the inputs, so they need that "
                f"size there; fix {source}"
            )


def _sizes(sizes: set[int], scale: int) -> str:
    return " or ".join(str(n * scale) for n in sorted(sizes)) or "none"


def _shape_hint(
    have: tuple[int, ...], want: tuple[int, ...], dim: int, exact: bool, fixed: str
) -> str:
    if len(have) == len(want) - 1 and have == want[:dim] + want[dim + 1 :]:
        return ": it lacks the batch dimension"
    if exact and len(have) == len(want) and have[dim] != want[dim]:
        why = (
            f"the compile found that the model fixes it: {fixed}"
            if fixed
            else "it was compiled with --dynamic none; recompile without it"
        )
        return f": its batch size differs ({have[dim]}, not {want[dim]}), and {why}"
    return ""


def _output(k: int, names: Sequence[str]) -> str:
    return f"output {k} ({names[k]})" if k < len(names) else f"output {k}"
