"""Calibrate the plan search's cost model on this machine: a few seconds of timing, once,
remembered per machine (host, torch version, device kind, threads per process).

What is measured, each forward plus backward, the best of several repeats:

- contractions: ``F.linear`` at several sizes; a least-squares line through time against
  FLOPs, weighted so that each size's relative error counts alike, gives ``flops_rate``
  (its slope) and ``half_work`` (the part of its intercept that is not the per-op
  overhead): small micro-batches run matmuls less efficiently (unweighted, the largest
  sizes decide the line and the intercept came out anywhere from 0 to 5e6 FLOPs between
  runs);
- ``op_overhead``: a chain of views, which do no work;
- ``elementwise_rate``: a chain of ``tanh`` over a million elements;
- ``instr_overhead``: a tiny model compiled into 4 stages, trained for a step with 32
  micro-batches on the local backend, less the same model's eager time: what the runtime
  adds per compute instruction (in a fresh process, ``pipecompile.calibration_probe``);
- ``optimizer_rate``: parameter bytes per second an AdamW step takes;
- for N > 1 ranks, once per N: ``message_latency`` (neighbour pairs ping-ponging a small
  tensor at once) and ``bandwidth`` (a 4 MiB all-reduce over the N), under torchrun with
  gloo (``calibration_probe --ranks``). A ``--bandwidth`` you give is kept.

Ranks share the machine's cores: for N ranks each measures with its fair share of threads,
and when N ranks need more cores than there are, the model's ``concurrency`` says how many
compute at full speed at once (a step then lasts at least the ranks' summed work over it:
a pipeline's idle ranks leave their cores to the busy ones).
``--tune`` adds ``step_scale``: the median of measured over predicted steps of the plans it
ran, by which later predictions of the same model (its traced graph's fingerprint) for that
many devices are multiplied.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pipecompile.errors import PlanError
from pipecompile.ir.cost_model import DEFAULT_BANDWIDTH, DEFAULT_FLOPS_RATE, CostModel
from pipecompile.runtime.threads import cores, fair_share

__all__ = ["Calibration", "best_of", "calibrated", "measure", "record_path", "remember_scale"]

METHOD = 2  # a record measured another way is measured again
_RANK_PROBE = "pipecompile.calibration_probe:rank_main"  # what the message probe's ranks run
_PROBE_S = 600.0  # the most a probe may take: a hang guard
_FIELDS = (
    "flops_rate", "half_work", "op_overhead", "elementwise_rate", "instr_overhead",
    "optimizer_rate",
)  # fmt: skip


@dataclass(frozen=True)
class Calibration:
    """The cost model's measured constants for one machine at ``threads`` threads a rank."""

    threads: int
    flops_rate: float
    half_work: float
    op_overhead: float
    elementwise_rate: float
    instr_overhead: float
    optimizer_rate: float
    step_scale: dict[str, float] | None = None  # "devices/model" -> measured / predicted
    ranks: dict[str, dict[str, float]] | None = None  # devices -> message figures

    def applied(self, model: CostModel, devices: int, model_key: str = "") -> CostModel:
        """``model`` with these constants (and, where ``devices`` ranks oversubscribe the
        cores, how many compute at once); a ``--flops-rate`` the user gave is kept."""
        shared = devices * self.threads > cores()
        rate = model.flops_rate if model.flops_rate != DEFAULT_FLOPS_RATE else self.flops_rate
        scale = (self.step_scale or {}).get(_scale_key(devices, model_key), 1.0)
        messages = (self.ranks or {}).get(str(devices), {})
        if messages and model.bandwidth == DEFAULT_BANDWIDTH:
            model = replace(model, bandwidth=messages["bandwidth"] / scale)
        return replace(
            model,
            message_latency=messages.get("message_latency", 0.0) * scale,
            optimizer_rate=self.optimizer_rate / scale,
            flops_rate=rate / scale,
            half_work=self.half_work,
            op_overhead=self.op_overhead * scale,
            elementwise_rate=self.elementwise_rate / scale,
            instr_overhead=self.instr_overhead * scale,
            concurrency=cores() / self.threads if shared else 0.0,
        )


def record_path() -> Path:
    """Where calibrations are kept: ``$PIPECOMPILE_CACHE/calibration.json`` (default
    ``~/.cache/pipecompile``)."""
    root = os.environ.get("PIPECOMPILE_CACHE") or Path.home() / ".cache" / "pipecompile"
    return Path(root) / "calibration.json"


def _key(threads: int) -> str:
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    return f"{platform.node()}/torch-{torch.__version__}/{kind}/{cores()}cores/{threads}threads"


def _records() -> dict[str, Any]:
    try:
        raw = json.loads(record_path().read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _write(records: dict[str, Any]) -> None:
    path = record_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)
    except OSError as err:  # a read-only home: the calibration is used, not kept
        print(f"pipecompile: note: calibration not saved to {path}: {err}", file=sys.stderr)


def calibrated(
    model: CostModel,
    devices: int,
    say: Callable[[str], None] | None = None,
    model_key: str = "",
) -> tuple[CostModel, str]:
    """``model`` calibrated for ``devices`` ranks on this machine (measured now, and kept,
    when no calibration is recorded; with ``--tune``'s ratio for the model ``model_key``
    when one was learned) and a line saying which calibration it is."""
    threads = fair_share(devices)
    records = _records()
    key = _key(threads)
    if (
        key not in records
        or records[key].get("method") != METHOD
        or any(f not in records[key] for f in _FIELDS)
    ):
        if say is not None:
            say(f"calibrating the cost model at {threads} threads (once; kept in {record_path()})")
        found = measure(threads)
        records = _records()  # another process may have written meanwhile
        records[key] = {f: getattr(found, f) for f in _FIELDS} | {
            "threads": threads,
            "method": METHOD,
        }
        _write(records)
    if devices > 1 and str(devices) not in records[key].get("ranks", {}):
        if say is not None:
            say(f"calibrating messages between {devices} ranks (once)")
        found_ranks = _rank_figures(devices, threads)
        records = _records()
        records[key].setdefault("ranks", {})[str(devices)] = found_ranks
        _write(records)
    entry = records[key]
    calibration = Calibration(
        threads=threads,
        **{f: float(entry[f]) for f in _FIELDS},
        step_scale=entry.get("step_scale"),
        ranks=entry.get("ranks"),
    )
    return calibration.applied(model, devices, model_key), key


def remember_scale(devices: int, scale: float, model_key: str = "") -> None:
    """Fold ``--tune``'s measured / predicted ratio for the model ``model_key`` on
    ``devices`` ranks of this machine into the one kept (a model's own: a ratio learned on
    one model says little about another's)."""
    records = _records()
    key = _key(fair_share(devices))
    if key in records:  # the tuned predictions were already scaled by the kept ratio
        kept = records[key].setdefault("step_scale", {})
        name = _scale_key(devices, model_key)
        kept[name] = round(kept.get(name, 1.0) * scale, 4)
        _write(records)


def _scale_key(devices: int, model_key: str) -> str:
    return f"{devices}/{model_key[:16]}" if model_key else str(devices)


def measure(threads: int) -> Calibration:
    """Time the machine at ``threads`` intra-op threads (see the module docstring)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            op = _per_op()
            rate, half = _contractions(op)
            elementwise = _elementwise(op)
            instr = _per_instruction(threads)
            optimizer = _optimizer()
    finally:
        torch.set_num_threads(before)
    return Calibration(threads, rate, half, op, elementwise, instr, optimizer)


def best_of(run: Callable[[], object], repeats: int = 5) -> float:
    """The fastest of ``repeats`` timed calls of ``run``, after one untimed call."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def _per_op() -> float:
    """Seconds per op beyond its work: a chain of views, forward and backward, per view and
    per pass (a third of the three passes' worth the cost model counts)."""
    x = torch.randn(4, 4, requires_grad=True)
    chain = 64

    def run() -> None:
        y = x
        for _ in range(chain):
            y = y.transpose(0, 1)
        y.backward(torch.ones(4, 4))

    return best_of(run, 9) / chain / 3


def _contractions(op: float) -> tuple[float, float]:
    """``flops_rate`` and ``half_work`` from F.linear at several sizes."""
    flops, seconds = [], []
    for width in (128, 384):
        weight = torch.randn(width, width, requires_grad=True)
        for rows in (4, 32, 256, 1024):
            x = torch.randn(rows, width, requires_grad=True)
            grad = torch.ones(rows, width)
            flops.append(2.0 * rows * width * width)
            seconds.append(best_of(lambda x=x, w=weight, g=grad: F.linear(x, w).backward(g)))
    times = np.array(seconds)
    slope, intercept = np.polyfit(np.array(flops), times, 1, w=1 / times)
    rate = 3 / max(slope, 1e-15)
    half = max(0.0, (intercept / 3 - op) * rate)
    return float(rate), float(half)


def _elementwise(op: float) -> float:
    x = torch.randn(1 << 20, requires_grad=True)
    grad = torch.ones(1 << 20)

    def run() -> None:
        torch.tanh(torch.tanh(x)).backward(grad)

    per_op = best_of(run) / 2
    return float(3 * x.numel() / max(per_op - 3 * op, 1e-9))


def _optimizer() -> float:
    """Parameter bytes per second AdamW steps (pipecompile run's default optimizer)."""
    params = [torch.zeros(256, 1024, requires_grad=True) for _ in range(4)]
    for p in params:
        p.grad = torch.ones_like(p)
    adamw = torch.optim.AdamW(params, lr=1e-3)
    nbytes = sum(p.numel() * p.element_size() for p in params)
    return nbytes / best_of(adamw.step)


def _rank_figures(devices: int, threads: int) -> dict[str, float]:
    """Message latency and all-reduce bandwidth of ``devices`` ranks on this machine, by
    ``pipecompile.calibration_probe.rank_main`` on ranks started as `run --nproc` starts
    them (forked by this process's rank starter)."""
    from pipecompile.runtime.distributed.local_ranks import LocalRanks, tied_to_us

    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with tempfile.TemporaryDirectory(prefix="pipecompile-calibration-") as tmp:
        out = Path(tmp) / "ranks.json"
        with LocalRanks(devices, [str(threads), str(out)], env, preexec=tied_to_us(),
                        entry=_RANK_PROBE) as ranks:  # fmt: skip
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


def _per_instruction(threads: int) -> float:
    """The runtime's own seconds per compute instruction, measured in a fresh process by
    ``pipecompile.calibration_probe`` (it compiles and trains a tiny pipeline, which this
    layer may not do itself)."""
    argv = [sys.executable, "-m", "pipecompile.calibration_probe", str(threads)]
    env = {**os.environ, "PIPECOMPILE_CALIBRATION": "off"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    try:
        return max(0.0, float(done.stdout.strip().splitlines()[-1]))
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PlanError(f"calibrating the runtime's overhead failed: {tail}") from None
