"""What a training run reports: a progress bar (on a terminal) or one line per step, and JSON
lines appended to ``OUT/metrics.jsonl`` (or ``run --metrics FILE``), which ``pipecompile
plot`` draws. docs/USAGE.md lists the keys."""

from __future__ import annotations

import contextlib
import json
import math
import resource
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import torch

from pipecompile.errors import EmitError, PipecompileError
from pipecompile.files.disk import disk_message
from pipecompile.files.owned import is_our_metrics
from pipecompile.files.writable import check_file
from pipecompile.ir.programs.simulate import Costs, simulate
from pipecompile.ir.programs.topology import topology_from_manifest
from pipecompile.ir.records.manifest import Manifest
from pipecompile.runtime.local_part import local_part
from pipecompile.runtime.training.model_keyed import local_optimizer
from pipecompile.runtime.training.records import EvalRecord, StepRecord

__all__ = [
    "Reporter",
    "append_record",
    "batch_counts",
    "check_metrics_file",
    "local_bubble",
    "peak_memory",
]


def check_metrics_file(path: Path) -> None:
    """Refuse, before a run starts, a metrics file that cannot be appended to, or that holds
    lines a run did not write (a user's file named by mistake).

    Raises:
        EmitError: naming ``path`` and the way out.
    """
    check_file(path, "metrics", append=True)
    if path.exists() and not is_our_metrics(path):
        raise EmitError(
            f"cannot append metrics to {path}: it holds lines pipecompile did not write; "
            "name a new file with --metrics FILE (or one an earlier run wrote)"
        )


def batch_counts(
    manifest: Manifest, inputs: dict[str, torch.Tensor] | None
) -> tuple[int, int | None]:
    """(samples, tokens) of one mini-batch: its size along the batch dimension, and the
    element count of the first integer input of two or more dimensions (token ids), if any.
    From ``inputs`` where this rank has them, else from the compiled shapes."""
    dim = manifest.batch_dim
    if inputs:
        shapes = [(tuple(t.shape), t.is_floating_point()) for t in inputs.values()]
    else:
        shapes = [(v.shape, "float" in v.dtype) for v in manifest.input_values or ()]
    samples = next((s[dim] for s, _ in shapes if len(s) > dim), 1)
    tokens = next((math.prod(s) for s, floating in shapes if not floating and len(s) >= 2), None)
    return samples, tokens


def local_bubble(pipe: Any) -> float | None:
    """The idle share of the devices' time when the program runs with the stage times the
    last step measured (the local backend runs every device in one thread, so its wall time
    says nothing about overlap)."""
    stats = pipe.last.stats if pipe.last is not None else None
    if stats is None or not stats.forward_ns:
        return None
    m, count = pipe.program.microbatches, len(pipe.modules)
    costs = Costs(
        forward=tuple(stats.forward_ns.get(j, 0) / m for j in range(count)),
        backward=tuple(stats.backward_ns.get(j, 0) / m for j in range(count)),
    )
    topology = topology_from_manifest(pipe.manifest)
    return simulate(pipe.program, topology, costs).bubble_fraction


def optimizer_state_bytes(pipe: Any) -> int:
    """Bytes of the optimizer state this process holds (a sharded optimizer's own part)."""
    total = 0
    for optimizer in pipe.optimizers or []:
        held = local_optimizer(optimizer).state.values() if optimizer is not None else ()
        for state in held:
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    value = local_part(value)  # an FSDP shard counts its own part
                    total += value.numel() * value.element_size()
    return total


def peak_memory(pipe: Any, *, one_process: bool) -> list[int]:
    """Peak bytes per device. On CUDA, what the allocator held; on a CPU rank of its own, the
    process's peak resident size; for devices sharing this process, the bytes of their
    parameters, gradients and optimizer state plus the peak activations measured."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return [int(torch.cuda.max_memory_allocated())]
    if not one_process:
        scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, else KiB
        return [int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale]
    stats = pipe.last.stats if pipe.last is not None else None
    peaks = [0] * (max(pipe.program.stage_device) + 1)
    for j, module in enumerate(pipe.modules):
        if module is None:
            continue
        optimizer = pipe.optimizers[j] if pipe.optimizers else None
        held = [*module.parameters(), *module.buffers()]
        held += [p.grad for p in module.parameters() if p.grad is not None]
        if optimizer is not None:
            held += [
                v
                for s in optimizer.state.values()
                for v in s.values()
                if isinstance(v, torch.Tensor)
            ]
        peaks[pipe.program.stage_device[j]] += sum(t.numel() * t.element_size() for t in held)
    if stats is not None:
        for d, dev in enumerate(stats.devices):
            peaks[d] += dev.peak_stored
    return peaks


class Reporter:
    """Prints a run's progress and appends its records to the metrics file (rank 0 only)."""

    def __init__(
        self,
        metrics: Path | None,
        total: int | None,
        *,
        quiet: bool = False,
        stream: TextIO | None = None,
    ) -> None:
        self.metrics, self.total, self.quiet = metrics, total, quiet
        self.stream = stream or sys.stdout
        self.bar = not quiet and self.stream.isatty() and total is not None
        self.began = time.monotonic()
        self._file: TextIO | None = None
        self._drawn = False

    def record(self, record: dict[str, Any]) -> None:
        """Append one JSON line to the metrics file, stamped with the wall clock's time."""
        if self.metrics is None:
            return
        if self._file is None:
            try:
                self.metrics.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.metrics.open("a")
            except OSError as err:
                raise PipecompileError(
                    f"cannot write metrics to {self.metrics}: {err.strerror or err}; pass "
                    "--metrics FILE somewhere writable"
                ) from None
        try:
            self._file.write(json.dumps({**record, "time": round(time.time(), 3)}) + "\n")
            self._file.flush()
        except OSError as err:  # a full disk: the metrics stop, the training goes on
            line = disk_message("write metrics to", self.metrics, err)
            print(f"pipecompile: warning: {line}; the run goes on without them", file=sys.stderr)
            with contextlib.suppress(OSError):
                self._file.close()
            self.metrics, self._file = None, None

    def say(self, text: str) -> None:
        """A line of its own (the bar, if drawn, is redrawn after it)."""
        if self.quiet:
            return
        if self._drawn:
            self.stream.write("\n")
            self._drawn = False
        print(text, file=self.stream, flush=True)

    def step(self, record: StepRecord, note: str = "") -> None:
        self.record(record.to_json())
        if self.quiet:
            return
        if self.bar:
            self._draw(record)
            return
        total = self.total if self.total is not None else "?"
        line = f"step {record.step}/{total}  loss {record.loss:.6f}  "
        line += f"({record.step_ms:.1f} ms)  {_throughput(record)}"
        if record.bubble is not None:
            line += f"  bubble {record.bubble:.0%}"
        print(line + note, file=self.stream, flush=True)

    def eval(self, record: EvalRecord) -> None:
        self.record(record.to_json())
        self.say(f"eval after step {record.step}: loss {record.loss:.6f}")

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
        if self._file is not None:
            self._file.close()

    def _draw(self, record: StepRecord) -> None:
        assert self.total is not None
        done, total = record.step, self.total
        width = 24
        filled = int(width * done / max(total, 1))
        elapsed = time.monotonic() - self.began
        per = elapsed / max(done - record.first, 1)
        eta = _clock(per * (total - done))
        self.stream.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}  loss "
            f"{record.loss:.4f}  {_throughput(record)}  ETA {eta}  "
        )
        self.stream.flush()
        self._drawn = True


def _throughput(record: StepRecord) -> str:
    text = f"{record.samples_per_s:.1f} samples/s"
    if record.tokens_per_s is not None:
        text += f"  {record.tokens_per_s:.0f} tokens/s"
    return text


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def append_record(metrics: Path | None, record: dict[str, Any]) -> None:
    """One record appended to the metrics file outside a run's own reporter (a restart's)."""
    reporter = Reporter(metrics, None, quiet=True)
    reporter.record(record)
    reporter.close()
