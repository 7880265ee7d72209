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
(``calibrated_ranks``: one cost model per rank count). Messages are measured for every count
up to ``EXACT_RANKS`` and at the powers of two beyond it; a count between two powers takes
their figures interpolated in log2 of the count (latency and seconds per byte alike), so
that a count's figures never depend on how many devices a search was offered.
``--tune`` adds ``step_scale``: the median of measured over predicted steps of the plans it
ran, by which later predictions of the same model (its traced graph's fingerprint) for that
many devices are multiplied.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pipecompile.ir.cost_model import DEFAULT_BANDWIDTH, DEFAULT_FLOPS_RATE, CostModel
from pipecompile.planner.calibration_quality import (
    AGAIN_AFTER_S,
    Quality,
    load_now,
    until_trusted,
    watched,
    why_measure,
)
from pipecompile.planner.calibration_store import (
    METHOD,
    machine_key,
    read_records,
    record_path,
    write_records,
)
from pipecompile.planner.calibration_timing import FIELDS, measure, rank_figures
from pipecompile.planner.rank_models import EXACT_RANKS
from pipecompile.runtime.notes import note
from pipecompile.runtime.threads import cores, fair_share

__all__ = [
    "Calibration",
    "calibrated",
    "calibrated_ranks",
    "message_counts",
    "record_path",
    "remember_scale",
]

Say = Callable[[str], None]
Figures = dict[str, Any]  # message_latency, bandwidth (and their quality, where measured)


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

    def applied(
        self, machine: CostModel, devices: int, messages: Figures, model_key: str = ""
    ) -> CostModel:
        """``machine`` with these constants and ``messages`` (the figures of ``devices``
        ranks; where they oversubscribe the cores, how many compute at once); a
        ``--flops-rate`` or ``--bandwidth`` the user gave is kept."""
        shared = devices * self.threads > cores()
        rate = machine.flops_rate if machine.flops_rate != DEFAULT_FLOPS_RATE else self.flops_rate
        scale = (self.step_scale or {}).get(_scale_key(devices, model_key), 1.0)
        if messages and machine.bandwidth == DEFAULT_BANDWIDTH:
            machine = replace(machine, bandwidth=messages["bandwidth"] / scale)
        return replace(
            machine,
            message_latency=messages.get("message_latency", 0.0) * scale,
            optimizer_rate=self.optimizer_rate / scale,
            flops_rate=rate / scale,
            half_work=self.half_work,
            # a --flops-rate you give prices convolutions too (0: the contractions' figures)
            conv_rate=self.conv_rate / scale if rate == self.flops_rate else 0.0,
            conv_half_work=self.conv_half_work,
            op_overhead=self.op_overhead * scale,
            elementwise_rate=self.elementwise_rate / scale,
            instr_overhead=self.instr_overhead * scale,
            concurrency=cores() / self.threads if shared else 0.0,
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
) -> list[tuple[CostModel, str]]:
    """``machine`` calibrated for each rank count from 1 to ``devices`` (item k - 1: k
    ranks) as ``calibrated`` calibrates one, each count's constants at its own share of
    the cores and its own message figures; ``counts``: those alone (the others are
    ``machine`` as given, uncalibrated, with no key)."""
    counts = list(counts) or list(range(1, devices + 1))
    entries = {}
    for threads in sorted({fair_share(k) for k in counts}, reverse=True):
        entries[threads] = _constants(machine_key(threads), threads, say)
    figures = _message_figures([k for k in counts if k > 1], say)
    out = [(machine, "")] * devices
    for k in counts:
        entry = entries[fair_share(k)]
        calibration = Calibration(
            threads=fair_share(k),
            **{f: float(entry[f]) for f in FIELDS},
            step_scale=entry.get("step_scale"),
        )
        applied = calibration.applied(machine, k, figures.get(k, {}), model_key)
        out[k - 1] = (applied, machine_key(fair_share(k)))
    return out


def message_counts(ranks: int) -> list[int]:
    """The rank counts whose messages are measured to price ``ranks`` ranks: itself up to
    ``EXACT_RANKS`` or at a power of two, else the powers of two either side of it."""
    if ranks <= EXACT_RANKS or ranks & (ranks - 1) == 0:
        return [ranks]
    low = 1 << (ranks.bit_length() - 1)
    return [low, 2 * low]


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
        _doubt(Quality.from_json(entry), what, measured_now=False, say=say)
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
    _doubt(quality, what, measured_now=True, say=say)
    return records[key]


def _message_figures(counts: list[int], say: Say | None) -> dict[int, Figures]:
    """The message figures of each of ``counts`` (more than one rank each): those measured
    (now, for the counts none is kept of, or whose kept ones should be measured again) or
    interpolated between the powers of two either side (``message_counts``)."""
    needed = sorted({c for k in counts for c in message_counts(k)})
    kept = {c: _kept_messages(c) for c in needed}
    why = {c: _why_messages(f) for c, f in kept.items()}
    todo = [c for c in needed if why[c] is not None]
    if todo and say is not None:
        shown = ", ".join(map(str, todo[:-1])) + " and " * (len(todo) > 1) + str(todo[-1])
        crowded = todo[-1] > 2 * cores()
        more = (
            f"; {todo[-1]} processes share {cores()} cores: this takes a while, once"
            if crowded
            else ""
        )
        priced = "; a plan is priced by the ranks it runs on" if len(todo) > 1 else ""
        say(f"calibrating messages between {shown} ranks ({why[todo[0]]}{priced}{more})")
    for c in needed:
        if c in todo:
            kept[c] = _measure_messages(c, say)
        else:
            _doubt(Quality.from_json(kept[c]), _messages_what(c), measured_now=False, say=say)
    return {k: _interpolated(k, kept) for k in counts}


def _interpolated(ranks: int, kept: dict[int, Figures]) -> Figures:
    """``ranks``' figures from the measured ones of ``message_counts(ranks)``: linear in
    log2 of the count between two powers of two, the latency and the seconds per byte."""
    counts = message_counts(ranks)
    if len(counts) == 1:
        return kept[counts[0]]
    (low, high), t = counts, math.log2(ranks) - math.log2(counts[0])
    a, b = kept[low], kept[high]
    latency = a["message_latency"] + t * (b["message_latency"] - a["message_latency"])
    per_byte = 1 / a["bandwidth"] + t * (1 / b["bandwidth"] - 1 / a["bandwidth"])
    return {"message_latency": latency, "bandwidth": 1 / per_byte}


def _kept_messages(ranks: int) -> Figures | None:
    entry = read_records().get(machine_key(fair_share(ranks))) or {}
    return (entry.get("ranks") or {}).get(str(ranks))


def _why_messages(kept: Figures | None) -> str | None:
    return "none kept yet" if kept is None else _why_again(Quality.from_json(kept))


def _messages_what(ranks: int) -> str:
    return f"the calibration of messages between {ranks} ranks"


def _measure_messages(ranks: int, say: Say | None) -> Figures:
    """The message figures of ``ranks`` ranks measured now (again while beyond a bound),
    kept with the record of their share of the cores."""
    threads = fair_share(ranks)
    figures, quality = until_trusted(
        lambda: _measured_messages(ranks, threads),
        f"calibrating messages between {ranks} ranks",
        say,
    )
    key = machine_key(threads)
    records = read_records()  # another process may have written meanwhile
    mine = records.setdefault(key, {})
    mine.setdefault("ranks", {})[str(ranks)] = {**figures, **quality.as_json()}
    write_records(records)
    _doubt(quality, _messages_what(ranks), measured_now=True, say=say)
    return mine["ranks"][str(ranks)]


def _why_measure(entry: dict[str, Any] | None) -> str | None:
    """Why the constants of a kept record should be measured now (None: use them)."""
    if entry is None or not any(f in entry for f in FIELDS):  # none, or message figures alone
        return "once"
    if entry.get("method") != METHOD or any(f not in entry for f in FIELDS):
        return "the one kept was measured by an older pipecompile"
    return _why_again(Quality.from_json(entry))


def _why_again(quality: Quality | None) -> str | None:
    return why_measure(quality, time.time(), load_now, cores())


def _measured_constants(threads: int) -> tuple[dict[str, float], Quality]:
    return watched(lambda: measure(threads))


def _measured_messages(devices: int, threads: int) -> tuple[dict[str, float], Quality]:
    """The message figures, and the load just before (the ranks' own CPU time is not this
    process's, so it cannot be told from others' during the probe)."""
    load = load_now()
    figures = rank_figures(devices, threads)
    return figures, Quality(load, {}, float(int(time.time())))


def _doubt(quality: Quality | None, what: str, *, measured_now: bool, say: Say | None) -> None:
    """Note that ``what`` may be off, and why, when its quality is beyond a bound."""
    why = quality.doubt() if quality is not None else None
    if quality is None or why is None or say is None:  # -q (no progress lines): not this
        return
    when = "measured now" if measured_now else f"kept from {quality.when()}"
    note(
        f"{what} ({when}) is in doubt: {why}. The plan search's predictions may be off; a "
        f"search on a quiet machine from {AGAIN_AFTER_S / 60:.0f} minutes on measures it "
        "again, or run `pipecompile calibration --clear` and search once the machine is quiet"
    )
