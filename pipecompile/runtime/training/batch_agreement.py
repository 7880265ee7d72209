"""Under ``--nproc``, the ranks that read data (the first stage's inputs, the last stage's
targets) each call the model file's hook: they must get the same batch at each step, or
inputs would be trained against another batch's targets. Each reading rank hashes its batch
(shapes, dtypes and a strided sample of every tensor's values) and the ranks compare the
hashes in one small all-gather per batch; a mismatch stops the run naming the batch. The same
all-gather tells every rank the sizes of the batch's varying dimensions (``--dynamic``), which
the ranks that read no data need to size the messages of the step."""

from __future__ import annotations

import hashlib
import math
from typing import Protocol

import torch

from pipecompile.errors import PipecompileError
from pipecompile.model.data_hooks import Batch, BatchSource

__all__ = ["agree_on_batch", "fingerprint"]

SAMPLES = 256  # values of each tensor hashed, evenly strided over it


class _Gather(Protocol):
    def gather(self, values: list[float]) -> list[list[float]]: ...


def fingerprint(batch: Batch) -> float:
    """A hash of ``batch``'s inputs and targets: their names, shapes, dtypes and a strided
    sample of their values; an integer below 2**48, exact as a float64."""
    digest = hashlib.sha256()
    named = [
        *sorted(batch.inputs.items()),
        *((f"target {k}", t) for k, t in enumerate(batch.targets)),
    ]
    for name, tensor in named:
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        flat = tensor.detach().reshape(-1)
        if flat.numel():
            sample = flat[:: max(1, flat.numel() // SAMPLES)][:SAMPLES].contiguous().cpu()
            digest.update(sample.view(torch.uint8).numpy().tobytes())
    return float(int.from_bytes(digest.digest()[:6], "little"))


def agree_on_batch(
    batch: Batch | None,
    source: BatchSource | None,
    index: int,
    epoch: int,
    group: _Gather,
    sizes: list[int] = (),  # type: ignore[assignment]
) -> list[int] | None:
    """Compare batch ``index`` (from 0, in ``epoch``) of every rank that read one (``source``
    not None) in this rank's data-parallel copy (the group's ``copy_width`` ranks, if it has
    one); every rank calls this once per batch, in the same order, with the same number of
    ``sizes`` (a reader's: its batch's; any other rank's are not read). Returns the first
    reader's ``sizes`` (None if no rank of the copy read a batch).

    Raises:
        PipecompileError: two reading ranks got different batches (on those ranks; the
            others learn it as a failed peer).
    """
    reads = source is not None and batch is not None
    mine = fingerprint(batch) if reads else math.nan
    gathered = group.gather([mine, *(float(n) for n in sizes)])
    every = [values[0] for values in gathered]
    width = getattr(group, "copy_width", None)  # --dp: each copy reads its own batches
    first = 0 if width is None else group.rank // width * width  # type: ignore[attr-defined]
    ours = range(first, len(every) if width is None else first + width)
    readers = [(r, every[r]) for r in ours if not math.isnan(every[r])]
    other = next(((r, f) for r, f in readers if f != readers[0][1]), None)
    found = [int(v) for v in gathered[readers[0][0]][1:]] if readers else None
    if other is None or source is None:
        return found
    where = f"batch {index}" + (f" of epoch {epoch}" if epoch > 1 else "")
    raise PipecompileError(
        f"{source.label} gave rank {readers[0][0]} and rank {other[0]} different batches at "
        f"{where} (their shapes or values differ): every rank that reads data calls it, so it "
        "must give the same batches in the same order; seed its shuffling and random data "
        "(e.g. torch.Generator().manual_seed(0), random.Random(0))"
    )
