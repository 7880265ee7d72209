"""Time this machine for the plan search's cost model: each constant, and how far the repeats
of its timing spread (``calibration_quality`` judges that spread).

What is measured, each forward plus backward, the best of several repeats:

- contractions: ``F.linear`` at several sizes; a least-squares line through time against
  FLOPs, weighted so that each size's relative error counts alike, gives ``flops_rate``
  (its slope) and ``half_work`` (the part of its intercept that is not the per-op
  overhead): small micro-batches run matmuls less efficiently (unweighted, the largest
  sizes decide the line and the intercept came out anywhere from 0 to 5e6 FLOPs between
  runs);
- convolutions: ``F.conv2d`` (3 x 3 over 16 x 16 images) at several batch and channel
  sizes, the same line: ``conv_rate`` and ``conv_half_work`` (a small convolution's fixed
  cost on a CPU is several times a matmul's of the same FLOPs);
- ``op_overhead``: a chain of views, which do no work;
- ``elementwise_rate``: a chain of ``tanh`` over a million elements;
- ``instr_overhead``: a tiny model compiled into 4 stages, trained for a step with 32
  micro-batches on the local backend, less the same model's eager time: what the runtime
  adds per compute instruction (in a fresh process, ``pipecompile.surfaces.calibration_probe``);
- ``optimizer_rate``: parameter bytes per second an AdamW step takes;
- for N > 1 ranks, once per N: ``message_latency`` (neighbour pairs ping-ponging a small
  tensor at once) and ``bandwidth`` (a 4 MiB all-reduce over the N), under torchrun with
  gloo (``calibration_probe --ranks``).

A constant's spread is ``spread`` of its repeats, (median - best) / best; ``flops_rate``'s
is the median over its 8 sizes (the smallest take microseconds, where a scheduler's tick
shows), ``instr_overhead``'s the larger of the probe's pipelined and eager timings'.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pipecompile.errors import PlanError

__all__ = ["FIELDS", "best_of", "measure", "rank_figures", "repeats", "spread"]

# The constants ``measure`` returns, in the order of ``Calibration``'s fields.
FIELDS = (
    "flops_rate",
    "half_work",
    "op_overhead",
    "elementwise_rate",
    "instr_overhead",
    "optimizer_rate",
    "conv_rate",
    "conv_half_work",
)
_RANK_PROBE = (
    "pipecompile.surfaces.calibration_probe:rank_main"  # what the message probe's ranks run
)
_PROBE_S = 600.0  # the most a probe may take: a hang guard

Constants = dict[str, float]  # FIELDS -> value
Spreads = dict[str, float]  # a constant -> the spread of its repeats


def measure(threads: int) -> tuple[Constants, Spreads]:
    """Time the machine at ``threads`` intra-op threads (see the module docstring): the
    constants, and the spread of each one's repeats."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            op, op_spread = _per_op()
            rate, half, rate_spread = _contractions(op)
            elementwise, elementwise_spread = _elementwise(op)
            instr, instr_spread = _per_instruction(threads)
            optimizer, optimizer_spread = _optimizer()
            conv, conv_half, conv_spread = _convolutions(op)
    finally:
        torch.set_num_threads(before)
    figures = (rate, half, op, elementwise, instr, optimizer, conv, conv_half)
    constants = dict(zip(FIELDS, figures))
    spreads = {
        "flops_rate": rate_spread,
        "conv_rate": conv_spread,
        "op_overhead": op_spread,
        "elementwise_rate": elementwise_spread,
        "instr_overhead": instr_spread,
        "optimizer_rate": optimizer_spread,
    }
    return constants, {k: round(v, 4) for k, v in spreads.items()}


def repeats(run: Callable[[], object], count: int = 5) -> list[float]:
    """The seconds of ``count`` timed calls of ``run``, after one untimed call."""
    run()
    times = []
    for _ in range(count):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def best_of(run: Callable[[], object], count: int = 5) -> float:
    """The fastest of ``count`` timed calls of ``run``, after one untimed call."""
    return min(repeats(run, count))


def spread(times: Sequence[float]) -> float:
    """How far a typical repeat is from the best: (median - best) / best (0 for one)."""
    best = min(times)
    return (statistics.median(times) - best) / best if best > 0 else 0.0


def _per_op() -> tuple[float, float]:
    """Seconds per op beyond its work: a chain of views, forward and backward, per view and
    per pass (a third of the three passes' worth the cost model counts)."""
    x = torch.randn(4, 4, requires_grad=True)
    chain = 64

    def run() -> None:
        y = x
        for _ in range(chain):
            y = y.transpose(0, 1)
        y.backward(torch.ones(4, 4))

    times = repeats(run, 9)
    return min(times) / chain / 3, spread(times)


def _contractions(op: float) -> tuple[float, float, float]:
    """``flops_rate`` and ``half_work`` from F.linear at several sizes, and the median
    spread of the sizes' repeats."""
    flops, times = [], []
    for width in (128, 384):
        weight = torch.randn(width, width, requires_grad=True)
        for rows in (4, 32, 256, 1024):
            x = torch.randn(rows, width, requires_grad=True)
            grad = torch.ones(rows, width)
            times.append(repeats(lambda x=x, w=weight, g=grad: F.linear(x, w).backward(g)))
            flops.append(2.0 * rows * width * width)
    return _line(flops, times, op)


def _convolutions(op: float) -> tuple[float, float, float]:
    """``conv_rate`` and ``conv_half_work`` from F.conv2d (3 x 3, 16 x 16 images) at several
    batch and channel sizes, and the median spread of the sizes' repeats."""
    flops, times = [], []
    for channels in (16, 32):
        weight = torch.randn(channels, channels, 3, 3, requires_grad=True)
        for batch in (1, 4, 16):
            x = torch.randn(batch, channels, 16, 16, requires_grad=True)
            grad = torch.ones(batch, channels, 16, 16)
            run = lambda x=x, w=weight, g=grad: F.conv2d(x, w, padding=1).backward(g)  # noqa: E731
            times.append(repeats(run))
            flops.append(2.0 * batch * channels * channels * 9 * 16 * 16)
    return _line(flops, times, op)


def _line(
    flops: Sequence[float], times: Sequence[Sequence[float]], op: float
) -> tuple[float, float, float]:
    """A contraction's rate and half work from the best of each size's forward plus
    backward ``times`` against its forward ``flops`` (weighted so that each size's relative
    error counts alike; ``op``: the per-op overhead the intercept also holds), and the
    median spread of the sizes' repeats."""
    best = np.array([min(t) for t in times])
    slope, intercept = np.polyfit(np.array(flops), best, 1, w=1 / best)
    rate = 3 / max(slope, 1e-15)
    half = max(0.0, (intercept / 3 - op) * rate)
    return float(rate), float(half), statistics.median(spread(t) for t in times)


def _elementwise(op: float) -> tuple[float, float]:
    x = torch.randn(1 << 20, requires_grad=True)
    grad = torch.ones(1 << 20)

    def run() -> None:
        torch.tanh(torch.tanh(x)).backward(grad)

    times = repeats(run)
    per_op = min(times) / 2
    return float(3 * x.numel() / max(per_op - 3 * op, 1e-9)), spread(times)


def _optimizer() -> tuple[float, float]:
    """Parameter bytes per second AdamW steps (pipecompile run's default optimizer)."""
    params = [torch.zeros(256, 1024, requires_grad=True) for _ in range(4)]
    for p in params:
        p.grad = torch.ones_like(p)
    adamw = torch.optim.AdamW(params, lr=1e-3)
    nbytes = sum(p.numel() * p.element_size() for p in params)
    times = repeats(adamw.step)
    return nbytes / min(times), spread(times)


def _per_instruction(threads: int) -> tuple[float, float]:
    """The runtime's own seconds per compute instruction, and the spread of its timings,
    measured in a fresh process by ``pipecompile.surfaces.calibration_probe`` (it compiles and
    trains a tiny pipeline, which this layer may not do itself)."""
    argv = [sys.executable, "-m", "pipecompile.surfaces.calibration_probe", str(threads)]
    env = {**os.environ, "PIPECOMPILE_CALIBRATION": "off"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=_PROBE_S)
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
        return max(0.0, float(found["instr_overhead"])), float(found["spread"])
    except (IndexError, ValueError, KeyError, TypeError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PlanError(f"calibrating the runtime's overhead failed: {tail}") from None


def rank_figures(devices: int, threads: int) -> dict[str, float]:
    """Message latency and all-reduce bandwidth of ``devices`` ranks on this machine, by
    ``pipecompile.surfaces.calibration_probe.rank_main`` on ranks started as `run --nproc` starts
    them (forked by this process's rank starter)."""
    from pipecompile.runtime.distributed.local_ranks import LocalRanks, tied_to_us

    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with tempfile.TemporaryDirectory(prefix="pipecompile-calibration-") as tmp:
        out = Path(tmp) / "ranks.json"
        with LocalRanks(
            devices, [str(threads), str(out)], env, preexec=tied_to_us(), entry=_RANK_PROBE
        ) as ranks:
            deadline = time.monotonic() + _PROBE_S
            while ranks.running() and time.monotonic() < deadline:
                time.sleep(0.02)
            ranks.kill()
            said = ranks.stderr.read()  # to its end: every rank has ended
        try:
            found = json.loads(out.read_text())
            return {k: float(found[k]) for k in ("message_latency", "bandwidth")}
        except (OSError, ValueError, KeyError, TypeError):
            tail = (said.strip().splitlines() or ["no output"])[-1]
            why = f"calibrating messages between {devices} ranks failed: {tail}"
            raise PlanError(why) from None
