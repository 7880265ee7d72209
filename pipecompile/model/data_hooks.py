"""A model file's data: ``train_batches()`` and ``eval_batches()``.

Each hook returns an iterable of ``(inputs, targets)`` mini-batches: ``inputs`` in any form
``example_inputs()`` may take (a tensor, a tuple of positional tensors or a dict of keyword
tensors), ``targets`` a tensor or a tuple of tensors, as ``loss_fn(output, *targets)`` takes
them. The hook is called once per epoch, so returning a list, a generator or an object with
``__iter__`` (and ``__len__``, which lets a run show its epoch length) all work. Every failure
names the hook, the file and the batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pipecompile.errors import ModelFileError
from pipecompile.model.model_file import ModelSpec, named_inputs

__all__ = ["Batch", "BatchSource", "batch_source", "example_source", "iterable_source"]

TRAIN, EVAL = "train_batches", "eval_batches"


@dataclass(frozen=True)
class Batch:
    """One mini-batch: inputs by forward() parameter name, and the targets."""

    inputs: dict[str, torch.Tensor]
    targets: tuple[torch.Tensor, ...]


@dataclass
class BatchSource:
    """Where a run's mini-batches come from: ``epoch()`` iterates one pass, ``length`` is its
    number of batches when known, ``label`` says what it is (for the run's first line and
    its errors). ``peek()`` reads the next pass's first batch ahead (that pass still yields
    it), so a run can check the data before it trains."""

    start: Callable[[], Iterator[Batch]]
    length: int | None
    label: str
    again: str = "return a fresh iterable for each epoch"  # the fix for a used-up iterable
    single: str | None = None  # what errors call the batch of a one-batch source
    _started: Iterator[Batch] | None = field(default=None, repr=False)

    def batch_name(self, k: int) -> str:
        """Batch ``k`` (from 0, in its epoch) as errors name it."""
        return self.single or f"{self.label}, batch {k}"

    def epoch(self) -> Iterator[Batch]:
        """One pass over the batches."""
        started, self._started = self._started, None
        return started if started is not None else self.start()

    def peek(self) -> Batch | None:
        """The first batch the next ``epoch()`` yields, or None if it yields none."""
        batches = self.epoch()
        first = next(batches, None)
        self._started = batches if first is None else itertools.chain([first], batches)
        return first


def example_source(spec: ModelSpec) -> BatchSource:
    """The example batch as a one-batch epoch: what a run trains on without a data hook."""
    if spec.targets is None:
        raise ModelFileError(
            f"{spec.path} needs example_targets() (or train_batches()) and loss_fn(output, "
            "*targets) for `run`"
        )
    batch = Batch(spec.inputs, spec.targets)
    return BatchSource(
        lambda: iter([batch]),
        1,
        "the example batch (no train_batches() hook)",
        single=f"example_inputs() and example_targets() of {spec.path.name}",
    )


def batch_source(spec: ModelSpec, hook: str = TRAIN) -> BatchSource | None:
    """The model file's ``hook`` (``train_batches`` or ``eval_batches``) as a BatchSource, or
    None if the file does not define it."""
    fn = getattr(spec.module, hook, None)
    if fn is None:
        return None
    if not callable(fn):
        raise ModelFileError(f"{spec.path}: {hook} is a {type(fn).__name__}, expected a function")
    probe = _call(fn, spec.path, hook)
    length = _length(probe)

    def epoch() -> Iterator[Batch]:
        nonlocal probe
        batches, probe = (probe if probe is not None else _call(fn, spec.path, hook)), None
        yield from _checked(batches, spec.input_names, spec.path, f"{hook}()")

    fresh = f"make {hook}() return a fresh iterable on each call (a list, or a new generator)"
    return BatchSource(epoch, length, f"{hook}() of {spec.path.name}", fresh)


def iterable_source(batches: Any, input_names: list[str], label: str) -> BatchSource:
    """``batches`` (an iterable of (inputs, targets), iterated once per epoch, or a function
    returning one) as a BatchSource; errors call it ``label``."""
    make = batches if callable(batches) else (lambda: batches)
    first = make()
    if isinstance(first, Iterator) and not callable(batches):
        raise ModelFileError(
            f"{label} is an iterator, which a second epoch would find empty; pass a list, or a "
            "function returning a fresh iterable per epoch"
        )
    fresh = "pass a list, or a function returning a fresh iterable per epoch"
    return BatchSource(
        lambda: _checked(make(), input_names, Path(label), ""), _length(first), label, fresh
    )


def _call(fn: Callable[[], Any], path: Path, hook: str) -> Any:
    try:
        batches = fn()
    except Exception as err:
        raise ModelFileError(f"{path}: {hook}() failed: {type(err).__name__}: {err}") from err
    if isinstance(batches, torch.Tensor) or not hasattr(batches, "__iter__"):
        raise ModelFileError(
            f"{path}: {hook}() returned a {type(batches).__name__}; return an iterable of "
            "(inputs, targets) mini-batches (a list, a generator, or an object with __iter__)"
        )
    return batches


def _length(batches: Any) -> int | None:
    try:
        return len(batches)
    except TypeError:
        return None


def _checked(batches: Any, names: list[str], path: Path, hook: str) -> Iterator[Batch]:
    iterator: Iterator[Any] | None = None
    k = 0
    while True:
        try:
            iterator = iterator or iter(batches)
            raw = next(iterator)
        except StopIteration:
            return
        except Exception as err:
            raise ModelFileError(
                f"{path}: {hook or 'the batches'} raised at batch {k}: {type(err).__name__}: {err}"
            ) from err
        yield _batch(raw, names, path, f"{hook} batch {k}".strip())
        k += 1


def _batch(raw: Any, names: list[str], path: Path, where: str) -> Batch:
    if not (isinstance(raw, tuple | list) and len(raw) == 2):
        got = f"a {type(raw).__name__}" + (
            f" of {len(raw)}" if isinstance(raw, tuple | list) else ""
        )
        raise ModelFileError(
            f"{path}: {where} is {got}; each batch must be a pair (inputs, targets)"
        )
    raw_inputs, raw_targets = raw
    inputs = named_inputs(names, raw_inputs, path, hook=where)
    targets = (raw_targets,) if isinstance(raw_targets, torch.Tensor) else raw_targets
    if not isinstance(targets, tuple | list) or not all(  # (): a loss without targets
        isinstance(t, torch.Tensor) for t in targets
    ):
        raise ModelFileError(
            f"{path}: {where} has targets of type {type(raw_targets).__name__}; give a "
            "tensor or a tuple of tensors, as loss_fn(output, *targets) takes them"
        )
    return Batch(inputs, tuple(targets))
