"""The calibration's message figures between R ranks on this machine: the latency of a small
message and the bandwidth of an all-reduce (``calibration_timing.rank_figures``), measured for
every count up to ``EXACT_RANKS`` and at the powers of two beyond it, each kept with the
calibration record of its count's share of the cores with the quality it was measured in. A
count between two powers takes their figures interpolated in log2 of the count (the latency
and the seconds per byte alike), so that a count's figures never depend on how many devices a
search was offered.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from pipecompile.planner.calibration_quality import (
    AGAIN_AFTER_S,
    Quality,
    load_now,
    until_trusted,
    why_measure,
)
from pipecompile.planner.calibration_store import machine_key, read_records, write_records
from pipecompile.planner.calibration_timing import rank_figures
from pipecompile.planner.rank_models import EXACT_RANKS
from pipecompile.runtime.process.notes import note
from pipecompile.runtime.process.threads import cores, fair_share

__all__ = ["Figures", "note_doubt", "message_counts", "message_figures", "why_again"]

Say = Callable[[str], None]
Figures = dict[str, Any]  # message_latency, bandwidth (and their quality, where measured)


def message_counts(ranks: int) -> list[int]:
    """The rank counts whose messages are measured to price ``ranks`` ranks: itself up to
    ``EXACT_RANKS`` or at a power of two, else the powers of two either side of it."""
    if ranks <= EXACT_RANKS or ranks & (ranks - 1) == 0:
        return [ranks]
    low = 1 << (ranks.bit_length() - 1)
    return [low, 2 * low]


def message_figures(counts: list[int], say: Say | None) -> dict[int, Figures]:
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
            note_doubt(Quality.from_json(kept[c]), _messages_what(c), measured_now=False, say=say)
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
    return "none kept yet" if kept is None else why_again(Quality.from_json(kept))


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
    note_doubt(quality, _messages_what(ranks), measured_now=True, say=say)
    return mine["ranks"][str(ranks)]


def why_again(quality: Quality | None) -> str | None:
    return why_measure(quality, time.time(), load_now, cores())


def _measured_messages(devices: int, threads: int) -> tuple[dict[str, float], Quality]:
    """The message figures, and the load just before (the ranks' own CPU time is not this
    process's, so it cannot be told from others' during the probe)."""
    load = load_now()
    figures = rank_figures(devices, threads)
    return figures, Quality(load, {}, float(int(time.time())))


def note_doubt(quality: Quality | None, what: str, *, measured_now: bool, say: Say | None) -> None:
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
