"""The model's own timings (``model_probe``), kept with the calibration of the share of the
cores they were taken on, by the model (its traced graph's fingerprint), the shapes of its
example and the sizes timed: compiles of one model price it alike, whatever ``--devices``
or micro-batch counts they ask for (timed anew, a model's seconds vary by a few percent from
one compile to the next, and so did the price of one plan). A calibration measured again
starts with none kept (``calibrate``: its record is replaced); `pipecompile calibration
--clear` removes them with it.
"""

from __future__ import annotations

import hashlib
import time

import torch

from pipecompile.planner.calibration_store import machine_key, read_records, write_records
from pipecompile.planner.model_probe import Probe

__all__ = ["example_key", "keep_timing", "kept_timing"]

_KEPT = 32  # timings kept per calibration record, the newest


def example_key(model_key: str, inputs: dict[str, torch.Tensor]) -> str:
    """The key of a model's timings: its graph's fingerprint and its example's input names,
    shapes and dtypes (a longer sequence takes longer)."""
    shapes = ";".join(f"{k}:{tuple(v.shape)}:{v.dtype}" for k, v in sorted(inputs.items()))
    return f"{model_key[:16]}/{hashlib.sha256(shapes.encode()).hexdigest()[:12]}"


def kept_timing(key: str, sizes: tuple[int, ...], threads: int) -> Probe | None:
    """The timing kept for ``key`` at ``sizes`` on ``threads`` threads a rank, or None."""
    entry = read_records().get(machine_key(threads)) or {}
    found = (entry.get("timings") or {}).get(_name(key, sizes))
    try:
        seconds = tuple(float(s) for s in found["seconds"])
        taken = float(found.get("taken", 0.0))
    except (KeyError, TypeError, ValueError):
        return None
    return Probe(sizes, seconds, kept_from=taken) if len(seconds) == len(sizes) else None


def keep_timing(key: str, threads: int, probe: Probe) -> None:
    """Keep ``probe`` for ``key`` with the calibration record of ``threads`` threads (none
    kept where that record is not: the calibration is not kept either)."""
    records = read_records()
    entry = records.get(machine_key(threads))
    if not isinstance(entry, dict):
        return
    timings = entry.setdefault("timings", {})
    timings.pop(_name(key, probe.sizes), None)
    timings[_name(key, probe.sizes)] = {
        "seconds": list(probe.seconds),  # JSON keeps a float exactly
        "taken": int(time.time()),
    }
    for old in sorted(timings, key=lambda k: timings[k].get("taken", 0))[:-_KEPT]:
        del timings[old]
    write_records(records)


def _name(key: str, sizes: tuple[int, ...]) -> str:
    return f"{key}/{','.join(map(str, sizes))}"
