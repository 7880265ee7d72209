"""Time the model itself before the search prices it: its eager forward and backward at the
smallest micro-batch the model allows and at the whole batch, on the threads a rank
gets, against the cost model's figure for the same work.

The sizes are the smallest micro-batch the model allows and the whole batch, whatever
micro-batch counts a compile asks for: compiles of one model with different counts price it
alike, and the two sizes are as far apart as they can be, which the fixed part's estimate
(extrapolated to no samples) needs. A pass is only run where its saved activations and
gradients take under half the machine's free memory (a smaller micro-batch size then
stands for the whole batch; none fits: no probe).

The cost model prices an op from its FLOPs and its kind with constants timed on a few
probe ops (``calibration_timing``); a model whose ops cost more per call than those (a
ResNet's batch norms and small convolutions at a few images) or run at another rate is
priced off, and by a different factor at few samples than at many. That difference is
what reorders plans: a fixed cost per micro-batch underpriced makes many micro-batches look
cheap. Both are affine in the micro-batch size s, the model's eager seconds a + b s and the
cost model's A + B s, so two sizes give the two factors the cost model then applies to every
op (``CostModel.fixed_scale``, ``work_scale``): a / A to the ops' fixed seconds, b / B to
their work's.

The probe leaves the model and the example as they were (buffers such as batch-norm
statistics restored, gradients as they were, the random state untouched, the inputs
copied) and gives up, pricing by the calibration alone, where it cannot time the model: on
the meta device or an accelerator, an output with no floating tensor, a forward that fails
at a smaller batch, or one pass slower than ``_MOST_S``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from pipecompile.ir.programs.cost_model import CostModel
from pipecompile.planner.model_facts import ModelFacts

__all__ = ["Probe", "corrected", "probe_model", "probe_sizes"]

_REPEATS = 5  # timed passes a size (the first size after one untimed, which warms up)
_ENOUGH_S = 1.0  # timed passes of a size that took this long together end at 2
_MOST_S = 2.0  # one pass slower than this: the probe would cost more than it tells
_BOUND = 8.0  # factors beyond [1/_BOUND, _BOUND] are clamped: a probe that far off is noise


@dataclass(frozen=True)
class Probe:
    """The model's eager forward plus backward: the best of its repeats at each size."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    took: float = 0.0  # the seconds the timing took in all (the progress line says them)
    kept_from: float = 0.0  # when a kept timing was taken (Unix time; 0: timed now)


def probe_model(
    model: nn.Module, inputs: dict[str, torch.Tensor], sizes: tuple[int, ...], threads: int
) -> Probe | None:
    """``model``'s eager forward plus backward at each of ``sizes`` samples (the first
    ``sizes[i]`` of every input batched like the first) on ``threads`` threads; None where
    it cannot be timed (see the module docstring)."""
    given = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    tensors = [*model.parameters(), *model.buffers(), *given]
    if not given or any(t.device.type != "cpu" for t in tensors):
        return None
    batch = given[0].shape[0]
    seconds = []
    with _untouched(model, threads):
        for i, size in enumerate(sizes):
            part = {k: _rows(v, size, batch) for k, v in inputs.items()}
            best = _best(lambda part=part: _pass(model, part), warm=i > 0)
            if best is None:
                return None
            seconds.append(best)
    return Probe(tuple(sizes), tuple(seconds))


def probe_sizes(facts: ModelFacts, allowed: Sequence[int]) -> tuple[int, ...]:
    """The sizes to time among the micro-batch sizes ``allowed``: the smallest and the
    largest whose pass fits in half this machine's free memory (its saved activations and
    the parameters' gradients, from ``facts``); () where even the smallest does not (a model
    meant to be split because it fits nowhere whole is not run whole)."""
    free = free_memory()
    fitting = sorted(s for s in set(allowed) if free is None or 2 * _pass_bytes(facts, s) < free)
    return tuple(sorted({fitting[0], fitting[-1]})) if fitting else ()


def _pass_bytes(facts: ModelFacts, size: int) -> int:
    """What a forward and backward at ``size`` samples holds beyond the model: the
    activations saved for the backward and a gradient for every parameter."""
    return sum(facts.saved) * size // facts.size + sum(facts.params)


def free_memory() -> int | None:
    """Bytes this machine can still give without swapping (Linux's ``MemAvailable``), or
    None where that cannot be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def corrected(machine: CostModel, facts: ModelFacts, probe: Probe) -> CostModel:
    """``machine`` with the factors that make its seconds for the model's work at the
    probe's sizes the probe's (one size: one factor for both)."""
    priced = [sum(facts.at(s, machine).cost) / 1e12 for s in probe.sizes]  # ps -> s
    if len(probe.sizes) < 2 or probe.sizes[0] == probe.sizes[-1]:
        factor = _clamped(probe.seconds[0] / priced[0])
        return replace(machine, fixed_scale=factor, work_scale=factor)
    (s1, s2), (t1, t2), (p1, p2) = probe.sizes[:2], probe.seconds[:2], priced[:2]
    work, priced_work = (t2 - t1) / (s2 - s1), (p2 - p1) / (s2 - s1)
    fixed, priced_fixed = t1 - work * s1, p1 - priced_work * s1
    scale = _clamped(work / priced_work) if priced_work > 0 else 1.0
    if priced_fixed <= 0:
        return replace(machine, work_scale=scale)
    return replace(machine, fixed_scale=_clamped(fixed / priced_fixed), work_scale=scale)


def _rows(value: object, size: int, batch: int) -> object:
    """The first ``size`` rows of an input tensor batched like the first, else the tensor, a
    copy either way (a model may write its input in place: the compile still needs the
    example); anything else as it is."""
    if not isinstance(value, torch.Tensor):
        return value
    return (value[:size] if value.dim() and len(value) == batch else value).clone()


def _clamped(factor: float) -> float:
    return min(max(factor, 1 / _BOUND), _BOUND)


def _pass(model: nn.Module, inputs: dict[str, torch.Tensor]) -> bool:
    """One forward and backward (of every floating output's sum); False if nothing to
    differentiate."""
    leaves = [
        t
        for t in tree_leaves(model(**inputs))
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad
    ]
    if not leaves:
        return False
    torch.autograd.backward([t.float().sum() for t in leaves])
    return True


def _best(run: Callable[[], bool], warm: bool) -> float | None:
    """The fastest of up to ``_REPEATS`` timed calls of ``run`` (after one untimed unless
    ``warm``), ending at 2 once they took ``_ENOUGH_S``; None if it fails, has nothing to
    time, or one call takes longer than ``_MOST_S``."""
    times: list[float] = []
    while len(times) < _REPEATS and not (len(times) >= 2 and sum(times) > _ENOUGH_S):
        start = time.perf_counter()
        try:
            if not run():
                return None
        except Exception:  # a model the probe cannot run at this size: price it unprobed
            return None
        seconds = time.perf_counter() - start
        if seconds > _MOST_S:
            return None
        if warm:
            times.append(seconds)
        warm = True
    return min(times)


@contextmanager
def _untouched(model: nn.Module, threads: int) -> Iterator[None]:
    """Run on ``threads`` threads and leave ``model``'s buffers, gradients, mode and the
    random state as they were."""
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    grads = [(p, p.grad) for p in model.parameters()]
    for param, _ in grads:  # the backward would add to them in place
        param.grad = None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng():
            yield
    finally:
        torch.set_num_threads(before)
        with torch.no_grad():
            for buffer, kept in buffers:
                buffer.copy_(kept)
        for param, grad in grads:
            param.grad = grad
