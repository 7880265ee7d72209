"""Calibrate the plan search's cost model on this machine: a few seconds of timing, once,
remembered per machine (host, torch version, device kind, threads per process).

What is measured is ``calibration_timing``'s; where it is kept, ``calibration_store``'s.
Each calibration records the load other programs put on the cores while it was measured
and the spread of its repeated timings; one beyond a bound (``calibration_quality``) is
measured once more, and if still beyond, used with a note that the predictions may be off
and why, and kept with its figures, so that a later search on a quiet machine measures it
again. `pipecompile calibration` shows what is kept; `--clear` forgets it.

Ranks share the machine's cores: for N ranks each measures with its fair share of threads,
and when N ranks need more cores than there are, the model's ``concurrency`` says how many
compute at full speed at once (a step then lasts at least the ranks' summed work over it:
a pipeline's idle ranks leave their cores to the busy ones). A ``--flops-rate`` or
``--bandwidth`` you give is kept.

A plan is priced by the calibration of the ranks it runs on, whatever ``--devices`` offered
(``calibrated_ranks``: one cost model per rank count; the messages between that many ranks
are ``calibration_messages``').
``--tune`` adds ``step_scale``: the median of measured over predicted steps of the plans it
ran, by which later predictions of the same model (its traced graph's fingerprint) for that
many devices are multiplied.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pipecompile.ir.programs.cost_model import DEFAULT_BANDWIDTH, DEFAULT_FLOPS_RATE, CostModel
from pipecompile.planner.calibration_messages import Figures, message_figures, note_doubt, why_again
from pipecompile.planner.calibration_quality import (
    Quality,
    until_trusted,
    watched,
)
from pipecompile.planner.calibration_store import (
    METHOD,
    machine_key,
    read_records,
    record_path,
    write_records,
)
from pipecompile.planner.calibration_timing import FIELDS, measure
from pipecompile.runtime.process.threads import cores, fair_share

__all__ = [
    "Calibration",
    "calibrated",
    "calibrated_ranks",
    "kept_scales",
    "scaled_by",
    "record_path",
    "remember_scale",
]

Say = Callable[[str], None]


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
    conv_rate: float
    conv_half_work: float
    step_scale: dict[str, float] | None = None  # "devices/model" -> measured / predicted

    def applied(self, machine: CostModel, devices: int, messages: Figures) -> CostModel:
        """``machine`` with these constants and ``messages`` (the figures of ``devices``
        ranks; where they oversubscribe the cores, how many compute at once); a
        ``--flops-rate`` or ``--bandwidth`` the user gave is kept."""
        shared = devices * self.threads > cores()
        rate = machine.flops_rate if machine.flops_rate != DEFAULT_FLOPS_RATE else self.flops_rate
        if messages and machine.bandwidth == DEFAULT_BANDWIDTH:
            machine = replace(machine, bandwidth=messages["bandwidth"])
        return replace(
            machine,
            message_latency=messages.get("message_latency", 0.0),
            optimizer_rate=self.optimizer_rate,
            flops_rate=rate,
            half_work=self.half_work,
            # a --flops-rate you give prices convolutions too (0: the contractions' figures)
            conv_rate=self.conv_rate if rate == self.flops_rate else 0.0,
            conv_half_work=self.conv_half_work,
            op_overhead=self.op_overhead,
            elementwise_rate=self.elementwise_rate,
            instr_overhead=self.instr_overhead,
            concurrency=cores() / self.threads if shared else 0.0,
        )

    def scale(self, devices: int, model_key: str = "") -> float:
        """``--tune``'s measured / predicted ratio for the model on ``devices`` ranks (1:
        none learned)."""
        return _scale_in(self.step_scale, devices, model_key)


def scaled_by(machine: CostModel, scale: float, *, bandwidth: bool = True) -> CostModel:
    """``machine`` with every time it prices ``scale`` times as long: an op's (its work and
    fixed seconds), an instruction's, a message's latency and, unless ``bandwidth`` is
    False (a ``--bandwidth`` the user gave), its bytes', and the optimizer's step."""
    if scale == 1.0:
        return machine
    return replace(
        machine,
        fixed_scale=machine.fixed_scale * scale,
        work_scale=machine.work_scale * scale,
        instr_overhead=machine.instr_overhead * scale,
        message_latency=machine.message_latency * scale,
        optimizer_rate=machine.optimizer_rate / scale,
        bandwidth=machine.bandwidth / scale if bandwidth else machine.bandwidth,
    )


def calibrated(
    machine: CostModel,
    devices: int,
    say: Say | None = None,
    model_key: str = "",
) -> tuple[CostModel, str]:
    """``machine`` calibrated for ``devices`` ranks on this machine (measured now, and kept,
    when no trusted calibration is kept; with ``--tune``'s ratio for the model
    ``model_key`` when one was learned) and the key of the calibration used.

    ``say`` gets the progress lines; a calibration beyond a bound is noted on stderr where
    ``say`` is given (not under ``-q``, which prints nothing but errors, nor in one command's
    later searches)."""
    return calibrated_ranks(machine, devices, say, model_key, (devices,))[devices - 1]


def calibrated_ranks(
    machine: CostModel,
    devices: int,
    say: Say | None = None,
    model_key: str = "",
    counts: Sequence[int] = (),
    *,
    scaled: bool = True,
) -> list[tuple[CostModel, str]]:
    """``machine`` calibrated for each rank count from 1 to ``devices`` (item k - 1: k
    ranks) as ``calibrated`` calibrates one, each count's constants at its own share of
    the cores and its own message figures; ``counts``: those alone (the others are
    ``machine`` as given, uncalibrated, with no key). ``scaled=False``: without ``--tune``'s
    ratios (``kept_scales`` gives them, for a caller that corrects the model first)."""
    counts = list(counts) or list(range(1, devices + 1))
    entries = {}
    for threads in sorted({fair_share(k) for k in counts}, reverse=True):
        entries[threads] = _constants(machine_key(threads), threads, say)
    figures = message_figures([k for k in counts if k > 1], say)
    out = [(machine, "")] * devices
    for k in counts:
        entry = entries[fair_share(k)]
        calibration = _calibration(entry, k)
        applied = calibration.applied(machine, k, figures.get(k, {}))
        if scaled:
            given = machine.bandwidth != DEFAULT_BANDWIDTH
            applied = scaled_by(applied, calibration.scale(k, model_key), bandwidth=not given)
        out[k - 1] = (applied, machine_key(fair_share(k)))
    return out


def kept_scales(counts: Sequence[int], model_key: str = "") -> dict[int, float]:
    """``--tune``'s kept ratio for the model on each of ``counts`` ranks (1: none)."""
    records = read_records()
    out = {}
    for k in counts:
        entry = records.get(machine_key(fair_share(k))) or {}
        out[k] = _scale_in(entry.get("step_scale"), k, model_key)
    return out


def _scale_in(kept: dict[str, float] | None, ranks: int, model_key: str) -> float:
    """The ratio ``kept`` holds for the model on ``ranks`` ranks (1: none learned)."""
    return float((kept or {}).get(_scale_key(ranks, model_key), 1.0))


def _calibration(entry: dict[str, Any], ranks: int) -> Calibration:
    return Calibration(
        threads=fair_share(ranks),
        **{f: float(entry[f]) for f in FIELDS},
        step_scale=entry.get("step_scale"),
    )


def remember_scale(devices: int, scale: float, model_key: str = "") -> None:
    """Fold ``--tune``'s measured / predicted ratio for the model ``model_key`` on
    ``devices`` ranks of this machine into the one kept (a model's own: a ratio learned on
    one model says little about another's)."""
    records = read_records()
    key = machine_key(fair_share(devices))
    if key in records:  # the tuned predictions were already scaled by the kept ratio
        kept = records[key].setdefault("step_scale", {})
        name = _scale_key(devices, model_key)
        kept[name] = round(kept.get(name, 1.0) * scale, 4)
        write_records(records)


def _scale_key(devices: int, model_key: str) -> str:
    return f"{devices}/{model_key[:16]}" if model_key else str(devices)


def _constants(key: str, threads: int, say: Say | None) -> dict[str, Any]:
    """The record of ``key``, its constants measured now when none is kept or the kept one
    should be measured again (``_why_measure``)."""
    entry = read_records().get(key)
    why = _why_measure(entry)
    what = f"the cost model's calibration at {threads} threads"
    if why is None:
        assert entry is not None
        note_doubt(Quality.from_json(entry), what, measured_now=False, say=say)
        return entry
    if say is not None:
        say(f"calibrating the cost model at {threads} threads ({why}; kept in {record_path()})")
    constants, quality = until_trusted(
        lambda: _measured_constants(threads),
        f"calibrating the cost model at {threads} threads",
        say,
    )
    records = read_records()  # another process may have written meanwhile
    old = records.get(key) or {}
    ranks = old.get("ranks") if old.get("method") in (METHOD, None) else None  # still good
    records[key] = {**constants, "threads": threads, "method": METHOD, **quality.as_json()}
    if ranks:
        records[key]["ranks"] = ranks
    write_records(records)
    note_doubt(quality, what, measured_now=True, say=say)
    return records[key]


def _why_measure(entry: dict[str, Any] | None) -> str | None:
    """Why the constants of a kept record should be measured now (None: use them)."""
    if entry is None or not any(f in entry for f in FIELDS):  # none, or message figures alone
        return "once"
    if entry.get("method") != METHOD or any(f not in entry for f in FIELDS):
        return "the one kept was measured by an older pipecompile"
    return why_again(Quality.from_json(entry))


def _measured_constants(threads: int) -> tuple[dict[str, float], Quality]:
    return watched(lambda: measure(threads))
