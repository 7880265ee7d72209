"""Ranks 1..N-1 of `generate --nproc N` as processes of this one (rank 0): forked by the rank
starter `run --nproc` uses (``runtime.distributed.local_ranks``), which imported torch once,
so a rank starts in a fraction of a second; each runs ``generation.rank.rank_entry``. Their
stderr is one pipe, read here line by line as they write; a rank that fails says so on a line
of its own, which names it."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from typing import Any

from pipecompile.errors import RuntimeFailure

__all__ = ["Children", "ENTRY"]

ENTRY = "pipecompile.generation.rank:rank_entry"
_SAID = re.compile(r"^generation rank (\d+): (.*)$")


class Children:
    """Ranks 1..``spec["world"]``-1, started at once; ``poll`` raises on a failed one,
    ``ended`` waits for all, ``stop`` kills what is left."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from pipecompile.runtime.distributed.local_ranks import LocalRanks, tied_to_us

        env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"])}
        self.ranks = LocalRanks(
            spec["world"] - 1, [json.dumps(spec)], env, preexec=tied_to_us(), entry=ENTRY
        )
        self.said: dict[int, str] = {}  # each rank's failure line
        self.lines: list[str] = []  # the rest of what they wrote, the last few
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.ranks.stderr:
            found = _SAID.match(line.rstrip("\n"))
            if found:
                self.said[int(found.group(1))] = found.group(2)
            elif line.strip():
                self.lines = [*self.lines[-19:], line.rstrip("\n")]

    def _codes(self) -> list[int | None]:
        return [proc.poll() for proc in self.ranks.procs]  # rank k + 1's at k

    def poll(self) -> None:
        """Raise, naming the rank and its line, if one of them failed: the first that failed
        of itself, not one that only saw its neighbour go (``PeerGone``)."""
        if all(code in (None, 0) for code in self._codes()):
            return
        deadline = time.monotonic() + 1.0  # the others see it too and exit: let them
        while None in self._codes() and time.monotonic() < deadline:
            time.sleep(0.01)
        codes = self._codes()  # before the rest are stopped (killed by us, not failed)
        self.stop()
        self._reader.join(timeout=1.0)  # every rank has ended: the pipe is at its end
        failed = [(k + 1, self._words(k + 1, c)) for k, c in enumerate(codes) if c]
        rank, said = next(((r, w) for r, w in failed if not w.startswith("PeerGone")), failed[0])
        raise RuntimeFailure(f"generation rank {rank} (stage {rank}) failed: {said}")

    def _words(self, rank: int, code: int) -> str:
        if rank in self.said:
            return self.said[rank]
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return self.lines[-1] if self.lines else f"exit status {code}"

    def ended(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for every rank to exit, raising on a failed one."""
        deadline = time.monotonic() + grace
        while None in self._codes() and time.monotonic() < deadline:
            self.poll()
            time.sleep(0.01)
        self.poll()

    def stop(self) -> None:
        self.ranks.kill()

    def close(self) -> None:
        self.ranks.__exit__(None, None, None)
