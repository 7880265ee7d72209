"""Whether a calibration can be trusted: how busy other programs kept this process's cores
while it was measured, and how far the repeats of its timings spread, each against a bound.

The bounds, and why:

- ``LOAD_BOUND`` 0.25: other programs may keep at most a quarter of the cores busy, on
  average over the measurement. Their share is the machine's busy time on this process's
  cores (Linux's /proc/stat) less the CPU time of this process and of the probes it waited
  for, over the wall time and the cores; without /proc/stat, the 1-minute load average per
  core before measuring. On 2 cores the bound is half a core: one other busy program is
  beyond it, a shell or an editor is not. This is the check that counts: on a 2-core
  machine, 6 calibrations at 1 thread with others at 40-67% spread (worst constant
  0.2-1.2) no more than 4 quiet ones did (others at most 2%: 0.13-0.62).
- ``SPREAD_BOUND`` 1.0: the repeats of each constant's timing, (median - best) / best, the
  worst constant: a typical repeat twice the best is no timing to keep, whatever the load
  reading says (calibrations at 2 threads beside busy cores spread 4.3 and 19; quiet, the
  noisiest constant, ``elementwise_rate``'s tanh over 4 MB, reached 0.62).
- ``TRIES`` 2: a calibration beyond a bound is measured once more (a busy spell of a few
  seconds passes, a long build beside it does not); if still beyond, it is used, with a
  note that the predictions may be off and why, and kept marked by its figures.
- ``AGAIN_AFTER_S`` 600: a kept calibration beyond a bound is measured again by a search at
  least ten minutes later whose machine is quiet then (others' share over ``GLANCE_S`` within
  ``LOAD_BOUND``); one command's repeated searches (``--tune`` rebuilds its plans) measure
  once. `pipecompile calibration --clear` forgets it at once.

The decisions are pure functions of the readings (``others_load``, ``doubt``, ``why_measure``)
and of injected measuring functions (``until_trusted``), so tests give them made-up figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

from pipecompile.runtime.process.machine_load import Reading, cores, others_load, read_machine

__all__ = [
    "AGAIN_AFTER_S",
    "LOAD_BOUND",
    "SPREAD_BOUND",
    "TRIES",
    "Quality",
    "Reading",
    "doubt",
    "load_now",
    "others_load",
    "read_machine",
    "until_trusted",
    "watched",
    "why_measure",
]

LOAD_BOUND = 0.25
SPREAD_BOUND = 1.0
TRIES = 2
AGAIN_AFTER_S = 600.0
GLANCE_S = 0.2  # how long ``load_now`` watches the machine

T = TypeVar("T")


@dataclass(frozen=True)
class Quality:
    """How a calibration was measured: others' share of the cores (``load``), the spread of
    each constant's repeats, and when (seconds since the epoch, whole)."""

    load: float
    spread: dict[str, float] = field(default_factory=dict)
    taken: float = 0.0

    def doubt(self, cores_here: int | None = None) -> str | None:
        """Why this calibration's predictions may be off (None: within the bounds)."""
        return doubt(self.load, self.spread, cores_here or cores())

    def when(self) -> str:
        """When it was measured, as a person reads it: ``2025-11-24 16:00:00 UTC``."""
        return datetime.fromtimestamp(self.taken, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")

    def as_json(self) -> dict[str, Any]:
        """The record's fields: ``load``, ``spread`` and ``taken`` (ISO 8601, UTC)."""
        when = datetime.fromtimestamp(self.taken, timezone.utc)
        return {
            "load": round(self.load, 4),
            "spread": dict(self.spread),
            "taken": when.isoformat(timespec="seconds"),
        }

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> Quality | None:
        """The quality a record keeps; None when it keeps none (or a damaged one)."""
        try:
            taken = datetime.fromisoformat(str(entry["taken"])).timestamp()
            spread = {str(k): float(v) for k, v in dict(entry.get("spread") or {}).items()}
            return cls(float(entry["load"]), spread, taken)
        except (KeyError, TypeError, ValueError):
            return None


def doubt(load: float, spread: Mapping[str, float], cores_here: int) -> str | None:
    """Why figures measured under ``load`` with these ``spread``s may be off: each bound
    passed, in words with its figures; None when both are within their bounds."""
    why = []
    if load > LOAD_BOUND:
        why.append(
            f"other programs kept {load:.0%} of the {cores_here} cores busy (bound "
            f"{LOAD_BOUND:.0%})"
        )
    worst = max(spread, key=lambda name: spread[name], default=None)
    if worst is not None and not spread[worst] <= SPREAD_BOUND:  # NaN is beyond too
        why.append(
            f"its timings' repeats spread {spread[worst]:.0%} ({worst}; bound {SPREAD_BOUND:.0%})"
        )
    return "; ".join(why) or None


def why_measure(
    quality: Quality | None,
    now: float,
    load: Callable[[], float],
    cores_here: int,
) -> str | None:
    """Why a kept calibration of this ``quality`` should be measured again now (None: use
    it): it keeps no quality (an older record), or it was beyond a bound, is at least
    ``AGAIN_AFTER_S`` old, and the machine is quiet now (``load()``, called only then, is
    within ``LOAD_BOUND``)."""
    if quality is None:
        return "the one kept records no load or spread"
    said = quality.doubt(cores_here)
    if said is None or now - quality.taken < AGAIN_AFTER_S:
        return None
    if load() > LOAD_BOUND:
        return None
    return f"the one kept is in doubt: {said}; the machine is quiet now"


def until_trusted(
    measure_once: Callable[[], tuple[T, Quality]],
    what: str,
    say: Callable[[str], None] | None = None,
    cores_here: int | None = None,
) -> tuple[T, Quality]:
    """``measure_once()`` up to ``TRIES`` times, until its quality is within the bounds
    (each try after the first announced through ``say``, with why); the last figures."""
    for attempt in range(1, TRIES + 1):
        found, quality = measure_once()
        why = quality.doubt(cores_here)
        if why is None or attempt == TRIES:
            return found, quality
        if say is not None:
            say(f"{what} again (try {attempt + 1} of {TRIES}): {why}")
    raise AssertionError("unreachable: the last try returns")


def watched(
    run: Callable[[], tuple[T, dict[str, float]]],
    read: Callable[[], Reading] | None = None,
    clock: Callable[[], float] = time.time,
) -> tuple[T, Quality]:
    """``run()``'s figures and the quality they were measured in: others' load between a
    reading before and one after, and the spreads ``run`` returns."""
    read = read or read_machine
    before = read()
    found, spreads = run()
    after = read()
    return found, Quality(others_load(before, after, cores()), spreads, float(int(clock())))


def load_now(read: Callable[[], Reading] | None = None, wait: float = GLANCE_S) -> float:
    """Others' share of the cores over the next ``wait`` seconds (this process sleeps)."""
    read = read or read_machine
    before = read()
    time.sleep(wait)
    return others_load(before, read(), cores())
