"""Faults never hang a distributed run: heartbeats, failure reports and a stop on SIGTERM.

Each rank's watchdog thread publishes, in the run's c10d store, the instruction its rank is
on (every ``interval``), and checks the others: a failure another rank reported, a rank on
this host whose process is gone, a rank whose heartbeat stopped, or this rank stuck on one
instruction (or in the model file's data hook) longer than ``timeout``. Whichever it finds,
it prints one line naming the rank and the instruction, and ends the process: a rank
blocked inside a receive cannot be woken any other way. torchrun's SIGTERM to the survivors
of a dead rank is handled the same way.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from pipecompile.runtime.distributed.rank_output import say

__all__ = ["Watchdog", "EXIT_PEER_FAILED"]

EXIT_PEER_FAILED = 3
_FAILED = "pipecompile/failed"
_READING = "reading "  # the position of a rank waiting on the data hook, as others see it


class Watchdog:
    def __init__(
        self,
        store: Any,
        rank: int,
        world: int,
        *,
        timeout: float,
        interval: float = 0.05,
        on_stop: Any = None,
    ) -> None:
        """``on_stop(status, problem)`` runs just before the watchdog ends the process."""
        self.on_stop = on_stop
        self.store, self.rank, self.world = store, rank, world
        self.timeout, self.interval = timeout, interval
        self.current = "start"
        self._since: float | None = None  # None: not inside an instruction, no hang timer
        self._ending = False  # the main thread reported a failure and ends the rank itself
        self._stderr = sys.stderr  # not the model file's output, even while that is redirected
        self._stop = threading.Event()
        self.store.set(f"pipecompile/pid/{rank}", f"{socket.gethostname()} {os.getpid()}")
        self._beat()

    def start(self) -> None:
        """Start the heartbeat thread and route SIGTERM to it (the main thread may be blocked
        inside a receive, where a Python signal handler would never run)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # no-op if already
        threading.Thread(target=self._loop, daemon=True, name="pipecompile-watchdog").start()
        threading.Thread(target=self._on_sigterm, daemon=True, name="pipecompile-sigterm").start()

    def stop(self, finished: bool) -> None:
        """Stop the thread; ``finished`` marks a normal end, which the others must not take
        for a death."""
        if finished:
            self.store.set(f"pipecompile/done/{self.rank}", "1")
        self._stop.set()

    def at(self, instr: str) -> None:
        """The main thread starts ``instr``."""
        self.current = instr
        self._since = time.monotonic()

    def reading(self, what: str) -> None:
        """The main thread waits on the model file's code (``what``: its import, or a data
        hook and the batch); it too must return within the timeout."""
        self.current = _READING + what
        self._since = time.monotonic()

    def report_failure(self, message: str) -> None:
        """This rank failed: tell the others (first report wins); the main thread ends it,
        so this thread does not stop it for its own report."""
        self._ending = True
        self.store.compare_set(
            _FAILED, "", f"rank {self.rank} failed at instruction {self.current}: {message}"
        )

    def idle(self, what: str) -> None:
        """The main thread left the program (setup, checks, saving): no hang timer."""
        self.current = what
        self._since = None

    def publish_now(self) -> None:
        self._beat()

    # -- the thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._beat()
                problem = self.diagnose(stale_after=max(2.0, 40 * self.interval))
            except Exception as err:  # the store itself is gone: the launcher is stopping us
                problem = f"lost contact with the run's store ({type(err).__name__})"
            since = self._since
            if problem is None and since is not None and time.monotonic() - since > self.timeout:
                problem = self._no_progress()
            if problem is not None and not self._ending:
                self._die(problem)

    def _no_progress(self) -> str:
        """Why this rank waited ``timeout`` in vain: a rank stuck in the data hook, if one is
        (the others wait on it), else where each rank is."""
        positions = self._positions()
        for r, at in sorted(positions.items(), key=lambda p: p[0] != self.rank):  # own first
            if at.startswith(_READING):
                return (
                    f"rank {r}: {at.removeprefix(_READING)} did not return within --timeout "
                    f"{self.timeout:g} s: the model file's code blocks; make it return, or raise "
                    "--timeout"
                )
        return f"no progress for {self.timeout:g} s; " + "; ".join(
            f"rank {r} at {at}" for r, at in positions.items()
        )

    def _on_sigterm(self) -> None:
        signal.sigwait({signal.SIGTERM})
        try:
            problem = self.diagnose(stale_after=0.5) or "stopped by the launcher (SIGTERM)"
        except Exception:
            problem = "stopped by the launcher (SIGTERM)"
        self._die(problem)

    def diagnose(self, stale_after: float) -> str | None:
        """What went wrong elsewhere, if anything: a reported failure first, then dead ranks.
        The report is read again after a death is found: a rank that failed reports and
        then exits, possibly between the two reads."""
        reported = self._reported()
        if reported is not None:
            return reported
        death = self._dead_rank(stale_after)
        if death is None:
            return None
        return self._reported() or death

    def _reported(self) -> str | None:
        if self.store.check([_FAILED]):
            reported = self.store.get(_FAILED).decode()
            if reported:
                return reported
        return None

    def _dead_rank(self, stale_after: float) -> str | None:
        now = time.time()
        host = socket.gethostname()
        for r in range(self.world):
            if r == self.rank or not self.store.check([f"pipecompile/pid/{r}"]):
                continue
            if self.store.check([f"pipecompile/done/{r}"]):
                continue
            their_host, pid = self.store.get(f"pipecompile/pid/{r}").decode().split()
            beat, at = self._heartbeat(r)
            gone = their_host == host and not _alive(int(pid))
            silent = their_host != host and now - beat > stale_after
            # Asked again: a rank that finished between the first look and now is not dead.
            if (gone or silent) and self.store.check([f"pipecompile/done/{r}"]):
                continue
            if gone:
                return f"rank {r} died (pid {pid}) at instruction {at}"
            if silent:
                return f"rank {r} stopped responding {now - beat:.1f} s ago at instruction {at}"
        return None

    def blame(self, problem: str) -> None:
        """Pass a peer's failure on, so every rank names the same root cause; the caller ends
        the rank, so the heartbeat thread no longer stops it (nor prints a second line)."""
        self._ending = True
        try:
            self.store.compare_set(_FAILED, "", problem)
        except Exception:
            pass

    def _die(self, problem: str) -> None:
        try:
            self.blame(problem)
            own = f"rank {self.rank}: "
            if self.current.startswith(_READING) and problem.startswith(own):
                line = f"error: {problem.removeprefix(own)}"  # this rank's hook blocks
            elif self.current.startswith(_READING):
                line = f"stopping in {self.current.removeprefix(_READING)}: {problem}"
            else:
                line = f"stopping at instruction {self.current}: {problem}"
            say(f"pipecompile: rank {self.rank}: {line}", self._stderr)
            if self.on_stop is not None:
                self.on_stop(EXIT_PEER_FAILED, problem)
        finally:
            # Whatever failed above (stderr is a pipe nobody reads once `pipecompile` was
            # killed), the rank ends: a thread that died here would leave it training.
            os._exit(EXIT_PEER_FAILED)

    def _beat(self) -> None:
        self.store.set(f"pipecompile/hb/{self.rank}", f"{time.time()} {self.current}")

    def _heartbeat(self, r: int) -> tuple[float, str]:
        if not self.store.check([f"pipecompile/hb/{r}"]):
            return time.time(), "start"
        stamp, at = self.store.get(f"pipecompile/hb/{r}").decode().split(" ", 1)
        return float(stamp), at

    def _positions(self) -> dict[int, str]:
        return {r: self._heartbeat(r)[1] for r in range(self.world)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by the launcher) counts as dead
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True
