"""How busy other programs keep the cores this process may run on, read from the machine
(Linux's /proc/stat): the cores' busy time less this process's own CPU time (and its waited-for
children's), over the time between two readings. Without /proc/stat, the 1-minute load
average per core. The plan search's calibration judges its timings by it
(``planner.calibration_quality``), a run in one process sizes its threads by it
(``runtime.threads.IdleCores``)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["STAT", "Reading", "cores", "others_load", "read_machine"]

STAT = Path("/proc/stat")


def cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this system
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Reading:
    """The machine at one moment, enough to tell how busy others kept it between two."""

    at: float  # time.monotonic()
    busy: float | None  # core-seconds this process's cores were busy since boot (None: unknown)
    ours: float  # CPU seconds of this process and of the children it waited for
    load_average: float  # the 1-minute load average per core


def others_load(before: Reading, after: Reading, cores_here: int) -> float:
    """The share of ``cores_here`` cores other programs kept busy between two readings (0:
    none; 1: all): the cores' busy time less our own, over the time between; without
    /proc/stat, the load average per core at ``before`` (which ours had not yet raised)."""
    wall = after.at - before.at
    if before.busy is None or after.busy is None or wall <= 0:
        return max(0.0, before.load_average)
    others = (after.busy - before.busy) - (after.ours - before.ours)
    return max(0.0, others / (wall * max(cores_here, 1)))


def read_machine() -> Reading:
    """Now: the busy time of this process's cores (/proc/stat), our own CPU time, the load
    average per core."""
    own = os.times()
    ours = own.user + own.system + own.children_user + own.children_system
    try:
        load = os.getloadavg()[0] / cores()
    except OSError:  # no load average on this system
        load = 0.0
    return Reading(time.monotonic(), _busy_seconds(), ours, load)


def _busy_seconds() -> float | None:
    """Core-seconds the cores this process may run on have been busy since boot."""
    try:
        lines = STAT.read_text().splitlines()
        mine = os.sched_getaffinity(0)
    except (OSError, AttributeError):
        return None
    ticks = 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in mine:
            counts = [int(f) for f in fields[:8]]
            ticks += sum(counts) - counts[3] - counts[4]  # less idle and iowait
    return ticks / os.sysconf("SC_CLK_TCK") if ticks else None
