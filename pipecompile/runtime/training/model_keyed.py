"""Train state keyed by the original model's names, as a ``torch.distributed.checkpoint``.

What `run --save` writes in each ``step_<n>`` (meta.json says ``"layout": "dcp"``): every
weight and buffer under its name in the model (``model.<name>``) and every optimizer state
tensor under its parameter's name (``optim.<name>.<field>``, e.g. ``optim.head.weight.exp_avg``).
A tied parameter is one entry, under the first of its names in sorted order. Nothing in it
says how the model was split, so any compile of the same model loads it: another stage count,
schedule, ``--dp`` or ``--shard``. Each rank contributes its stages; copies of a value that
several ranks hold (data-parallel copies, tied weights) are written once, and optimizer state
sharded over ``dp`` is written by the rank that owns each part. Loading is collective too:
each rank asks for exactly the entries its stages need.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from pipecompile.errors import EmitError
from pipecompile.runtime.local_part import is_dtensor

if TYPE_CHECKING:  # torch.distributed.checkpoint is imported where used: a second of start-up
    from torch.distributed.checkpoint.metadata import STORAGE_TYPES

__all__ = [
    "Entry",
    "LAYOUT",
    "save_model_keyed",
    "save_model_keyed_async",
    "load_model_keyed",
    "saved_entries",
    "read_model_keyed",
    "local_optimizer",
]

LAYOUT = "dcp"
# an entry's value: a weight, a buffer or an optimizer's state tensor; or a number an optimizer
# keeps as one (a step count), saved as bytes and read back as saved
Entry = torch.Tensor | float | None


def _key(names: tuple[str, ...] | list[str], local: str) -> str:
    return sorted(names)[0] if names else local


def _distributed() -> bool:
    """Whether ranks of a run take part (else this process is the whole run)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


@contextmanager
def _one_process_quietly() -> Iterator[None]:
    """Without torch's warning that a checkpoint of one process is one of one process."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _held(pipe: Any) -> Iterator[tuple[int, nn.Module]]:
    for j, module in enumerate(pipe.modules):
        if module is not None:
            yield j, module


def _weights(pipe: Any) -> dict[str, list[torch.Tensor]]:
    """``model.<name>`` -> its tensors, for every weight and buffer of this rank's stages (a
    tied weight two stages here hold has two, always equal)."""
    found: dict[str, list[torch.Tensor]] = {}
    for j, module in _held(pipe):
        names = pipe.layout.params[j]
        for local, tensor in module.state_dict(keep_vars=True).items():
            key = f"model.{_key(names.get(local, ()), local)}"
            found.setdefault(key, []).append(tensor.detach())
    return found


def local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer that holds this rank's state (ZeroRedundancyOptimizer's local one)."""
    return getattr(optimizer, "optim", optimizer)


def _optimizer_params(pipe: Any) -> Iterator[tuple[str, torch.optim.Optimizer, nn.Parameter]]:
    """(model name, optimizer, parameter) for each parameter whose state this rank holds."""
    for j, module in _held(pipe):
        optimizer = pipe.optimizers[j] if pipe.optimizers else None
        if optimizer is None:
            continue
        names = pipe.layout.params[j]
        by_id = {id(p): local for local, p in module.named_parameters()}
        inner = local_optimizer(optimizer)
        for group in inner.param_groups:
            for p in group["params"]:
                local = by_id[id(p)]
                yield _key(names.get(local, ()), local), inner, p


def _optimizer_state(pipe: Any) -> dict[str, Entry]:
    found: dict[str, Entry] = {}
    for name, optimizer, p in _optimizer_params(pipe):
        for field, value in optimizer.state.get(p, {}).items():
            found[f"optim.{name}.{field}"] = value
    return found


def save_model_keyed(pipe: Any, directory: Path) -> None:
    """Write this rank's share of the train state under ``directory`` (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    state = _train_state(pipe)
    writer = _writer_class()(str(directory))
    failed = None
    try:
        with _one_process_quietly():
            dcp.save(state, storage_writer=writer, no_dist=not _distributed())
    except CheckpointException as err:
        failed = writer.failure or _cause(err)  # this rank's own, with what it was raised in
    if failed is not None:  # what failed (a full disk, a stop), as it was raised and chained
        raise failed


def save_model_keyed_async(pipe: Any, directory: Path, group: Any) -> Future:
    """Copy this rank's share of the train state off the training tensors now, and write it
    under ``directory`` in the background (torch.distributed.checkpoint's ``async_save``, its
    collectives on ``group``, not the training's); the future ends when it is written (on rank
    0: every rank's share and the index), or raises what failed."""
    import torch.distributed.checkpoint as dcp

    writer = _writer_class()(str(directory))
    with _one_process_quietly():
        future = dcp.async_save(
            _train_state(pipe), storage_writer=writer, process_group=group, no_dist=group is None
        )
    return future  # type: ignore[return-value]


def _train_state(pipe: Any) -> dict[str, Entry]:
    """This rank's weights and optimizer state, keyed by the model's names."""
    weights = {key: tensors[0] for key, tensors in _weights(pipe).items()}
    return {**weights, **_optimizer_state(pipe)}


def _writer_class() -> type:
    """torch's writer, keeping the error this rank's write raised: torch gathers every rank's
    into one exception, pickled, without the OSError or stop each was raised in. (Made on
    first use: torch.distributed.checkpoint is a second of start-up for every run.)"""
    from torch.distributed.checkpoint import FileSystemWriter

    class Writer(FileSystemWriter):
        failure: BaseException | None = None

        def write_data(self, plan: Any, planner: Any) -> Any:
            try:
                return super().write_data(plan, planner)
            except BaseException as err:
                self.failure = err
                raise

    return Writer


def saved_entries(directory: Path) -> dict[str, STORAGE_TYPES]:
    """The entries of the checkpoint in ``directory``: key -> its storage metadata."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        return dict(FileSystemReader(str(directory)).read_metadata().state_dict_metadata)
    except Exception as err:
        raise EmitError(
            f"train state {directory} cannot be read ({type(err).__name__}: "
            f"{str(err)[:200]}); it is damaged: resume from another saved step"
        ) from None


def read_model_keyed(directory: Path, keys: set[str] | None = None) -> dict[str, Entry]:
    """Every entry of the checkpoint in ``directory`` (or those of ``keys`` it holds), read
    whole into this process."""
    import torch.distributed.checkpoint as dcp

    saved = saved_entries(directory)
    wanted: dict[str, Entry] = {
        k: _empty_for(m) for k, m in saved.items() if keys is None or k in keys
    }
    with _one_process_quietly():
        dcp.load(wanted, checkpoint_id=str(directory), no_dist=True)
    return wanted


def _empty_for(meta: STORAGE_TYPES) -> torch.Tensor | None:
    """Room for an entry of ``meta``'s size and dtype (None: a number, read as saved)."""
    return (
        torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        if hasattr(meta, "size")
        else None
    )


def _room(meta: STORAGE_TYPES, param: torch.Tensor) -> torch.Tensor | None:
    """Room for an optimizer state entry of ``param``: laid out as the parameter where it
    has its shape (a DTensor shard under FSDP reads only its part), else as saved."""
    if is_dtensor(param) and tuple(getattr(meta, "size", ())) == tuple(param.shape):
        return torch.empty_like(param, dtype=meta.properties.dtype)
    return _empty_for(meta)


def load_model_keyed(pipe: Any, directory: Path) -> None:
    """Load this rank's weights and optimizer state from ``directory`` (collective).

    Raises:
        EmitError: the checkpoint lacks a weight of this model or holds it in another shape
            (it was saved from another model), or a file of it is missing or damaged.
    """
    import torch.distributed.checkpoint as dcp

    entries = saved_entries(directory)
    weights = _weights(pipe)
    _check_weights(directory, entries, weights)
    wanted: dict[str, Entry] = {k: torch.empty_like(t[0]) for k, t in weights.items()}
    by_param: dict[str, list[str]] = {}  # parameter name -> its state's fields
    for key in entries:
        if key.startswith("optim."):
            name, field = key[len("optim.") :].rsplit(".", 1)
            by_param.setdefault(name, []).append(field)
    fields = []  # (optimizer, parameter, field, key): a tied weight's state goes to each copy
    for name, optimizer, p in _optimizer_params(pipe):
        for field in by_param.get(name, []):
            key = f"optim.{name}.{field}"
            wanted[key] = _room(entries[key], p)
            fields.append((optimizer, p, field, key))
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with _one_process_quietly():
            dcp.load(wanted, checkpoint_id=str(directory), no_dist=not _distributed())
    except (Exception, CheckpointException) as err:  # the latter gathers the ranks' errors
        raise EmitError(
            f"train state {directory} cannot be loaded ({_first_cause(err)}); a file of it is "
            "missing or damaged: resume from another saved step"
        ) from None
    with torch.no_grad():
        for key, tensors in weights.items():
            for tensor in tensors:
                tensor.copy_(wanted[key])
    for optimizer, p, field, key in fields:
        value = wanted[key]
        if isinstance(value, torch.Tensor):  # its own: optimizers update their state in place
            value = value.to(p.device) if value.dim() > 0 else value
            value = value.clone()
        optimizer.state[p][field] = value


def _cause(err: Any) -> BaseException:
    """The first rank's own error of those torch gathered into ``err``."""
    failures = err.failures
    return next(iter(failures.values()))[0] if failures else err


def _first_cause(err: BaseException) -> str:
    """One line of what went wrong: a rank's own error where torch gathered them."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(err, CheckpointException):
        err = _cause(err)
    text = (str(err).splitlines() or [""])[0][:300]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _check_weights(
    directory: Path, entries: dict[str, STORAGE_TYPES], weights: dict[str, list[torch.Tensor]]
) -> None:
    missing = [k for k in weights if k not in entries]
    if missing:
        names = [k[len("model.") :] for k in missing]
        held = sorted(k[len("model.") :] for k in entries if k.startswith("model."))
        raise EmitError(
            f"train state {directory} has no weight {names[0]!r}"
            f"{f' (and {len(names) - 1} more)' if len(names) > 1 else ''} of this model: it was "
            f"saved from another model (it holds {', '.join(held[:3])}{' ...' if held else ''}); "
            "resume it into a compile of the model it was trained on"
        )
    for key, tensors in weights.items():
        size, tensor = tuple(getattr(entries[key], "size", ())), tensors[0]
        if size != tuple(tensor.shape):
            raise EmitError(
                f"train state {directory} holds {key[len('model.') :]!r} in shape {list(size)}, "
                f"this model in {list(tensor.shape)}: it was saved from another model; resume "
                "it into a compile of the model it was trained on"
            )
