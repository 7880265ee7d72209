"""How many intra-op threads each process of a run uses, so that ranks do not fight for cores.

A rank on a machine shared with ``k`` ranks takes its share of the cores this process may run
on (at least one); ``--threads N`` sets it for every process, and so does ``OMP_NUM_THREADS``
for the ranks ``run --nproc`` starts when the caller set it. A run in one process (the local
backend, ``fit()``) without ``--threads`` follows the idle cores instead (``IdleCores``):
torch's threads wait for each other at every op, so one thread that shares its core with
another program's work holds all of them back; on a 2-core machine with one core busy, a
step with 2 threads took 2.5x the step with 1. Compiled stages (``--compile``) fix the count
before their first call instead (``IdleCores.settle``): Dynamo guards compiled code on the
thread count, so a change between steps would compile every stage again (under Inductor, a
step of 23 ms took 4142 ms after the threads changed).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

import torch

from pipecompile.runtime.process.machine_load import STAT, Reading, cores, others_load, read_machine

__all__ = ["cores", "fair_share", "launch_threads", "use_threads", "IdleCores"]

_STAT = STAT  # IdleCores is on where the system has it
_given = False  # the last use_threads set a count (--threads, a rank's share): IdleCores is off
SETTLE_S = 0.25  # how long IdleCores.settle watches the other programs before compiled stages
_WINDOW_S = 0.05  # the shortest time over which the cores others use can be told


def fair_share(ranks_here: int) -> int:
    """The threads of one of ``ranks_here`` ranks on this machine."""
    return max(1, cores() // max(ranks_here, 1))


def launch_threads(given: int | None, ranks_here: int) -> int:
    """The threads of each of ``ranks_here`` ranks that ``run --nproc`` starts: ``given``
    (``--threads``), else ``OMP_NUM_THREADS`` where the caller set it (a machine shared with
    other work, several runs at once), else the fair share."""
    if given:
        return given
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else fair_share(ranks_here)


def use_threads(threads: int | None, ranks_here: int | None = None) -> int:
    """Set this process's intra-op threads to ``threads``, else to the fair share of one of
    ``ranks_here`` ranks (None: leave torch's default); returns the count in use."""
    global _given
    count = threads or (fair_share(ranks_here) if ranks_here else None)
    _given = count is not None
    if count is not None and count != torch.get_num_threads():
        torch.set_num_threads(count)
    return torch.get_num_threads()


class IdleCores:
    """Between the steps of a run in one process: the cores others keep busy, measured over
    the last step (the machine's busy time from /proc/stat less this process's own CPU time),
    and this process's threads set to the cores left (at least one, at most ``cores()``).

    Does nothing where a count was given (``use_threads``), ``OMP_NUM_THREADS`` is set, or
    the system has no /proc/stat.
    """

    def __init__(self, say: Callable[[str], None] | None = None) -> None:
        fixed = _given or bool(os.environ.get("OMP_NUM_THREADS"))
        self.on = not fixed and _STAT.exists()
        self.say = say
        self.most = cores()
        self.start = torch.get_num_threads()
        self.settled = False  # settle() chose the count for the rest of the run
        self._last = _sample() if self.on else None

    def between_steps(self) -> int:
        """Measure the step just ended and set the threads for the next; returns the count.
        Steps shorter than a reading can tell apart (a decoding turn) are measured together:
        the machine is read again only once ``_WINDOW_S`` has passed."""
        if self._last is not None and time.monotonic() - self._last.at < _WINDOW_S:
            return torch.get_num_threads()  # too soon to read the machine again (cheap)
        now = _sample() if self.on and not self.settled else None
        if now is None or self._last is None:
            return torch.get_num_threads()
        others = _others(self._last, now)
        if others is None:  # a short step: measure over the next ones too
            return torch.get_num_threads()
        self._last = now
        want = self._want(others)
        if want != torch.get_num_threads():
            torch.set_num_threads(want)
            if self.say is not None:
                self.say(
                    f"other programs keep {others:.1f} of {self.most} cores busy: "
                    f"{_threads(want)} from the next step"
                )
        return want

    def settle(self) -> int:
        """Before compiled stages' first call: measure the cores others use over ``SETTLE_S``
        seconds, set the threads to the cores left, say so, and keep that count for the rest
        of the run (``between_steps`` then changes nothing): Dynamo guards compiled code on the
        thread count, so a change would compile every stage again. Returns the count."""
        if not self.on or self.settled:
            return torch.get_num_threads()
        self.settled = True
        before = _sample()
        time.sleep(SETTLE_S)
        after = _sample()
        others = _others(before, after) if before is not None and after is not None else None
        want = self._want(others) if others is not None else torch.get_num_threads()
        if want != torch.get_num_threads():
            torch.set_num_threads(want)
        if self.say is not None:
            busy = f"other programs keep {others:.1f} of {self.most} cores busy; " if others else ""
            self.say(
                f"{busy}{_threads(want)} for the whole run: compiled stages keep the thread "
                "count they are compiled with (a change would compile them again)"
            )
        return want

    def _want(self, others: float) -> int:
        """A thread less for each core others use, counting from 0.3 (a step's own noise)."""
        return max(1, min(self.most, self.most - math.ceil(others - 0.3)))

    def restore(self) -> None:
        """Put back the thread count the run started with (``fit()`` returns to its caller)."""
        if self.on and torch.get_num_threads() != self.start:
            torch.set_num_threads(self.start)


def _threads(count: int) -> str:
    return f"{count} thread{'s' * (count != 1)}"


def _sample() -> Reading | None:
    """The machine now (``machine_load.read_machine``), or None where /proc/stat is not
    readable."""
    now = read_machine()
    return now if now.busy is not None else None


def _others(before: Reading, after: Reading) -> float | None:
    """Cores kept busy by other programs between two readings (None: too short to tell)."""
    if after.at - before.at < _WINDOW_S:
        return None
    return others_load(before, after, 1)  # over one core: a count of cores
