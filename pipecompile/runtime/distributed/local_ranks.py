"""The ranks of a run on this machine, started by this process the way torch's launcher would.

This process hosts the run's c10d store; each rank gets the environment ``torchrun`` gives
(its ranks, the store's address, ``TORCHELASTIC_USE_AGENT_STORE`` so that every rank is a
client of that store and it outlives any one rank) and writes its stderr into one pipe, read
here through ``stderr``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

from torch.distributed import TCPStore

__all__ = ["LocalRanks", "WORKER_MODULE"]

WORKER_MODULE = "pipecompile.runtime.distributed.worker"
_HOST = "127.0.0.1"


class LocalRanks:
    """``nproc`` worker processes, each in a session of its own; ``preexec`` runs in each
    before it starts (see ``subprocess.Popen``). Used as a context manager, whatever is left
    of them is SIGKILLed on the way out and the store is closed."""

    def __init__(
        self, nproc: int, worker_args: list[str], env: dict[str, str], preexec: Any = None
    ) -> None:
        self.store = TCPStore(_HOST, 0, is_master=True, wait_for_workers=False)
        self.procs: list[subprocess.Popen] = []
        read_end, write_end = os.pipe()
        try:
            for rank in range(nproc):
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", WORKER_MODULE, *worker_args],
                        env={**env, **self._rank_env(rank, nproc)},
                        stderr=write_end,
                        start_new_session=True,
                        preexec_fn=preexec,
                    )
                )
        except BaseException:
            os.close(read_end)
            self.kill()
            raise
        finally:
            os.close(write_end)  # the ranks hold it now: the pipe ends when the last one does
        self.stderr = os.fdopen(read_end, encoding="utf-8", errors="replace")

    def _rank_env(self, rank: int, nproc: int) -> dict[str, str]:
        world = str(nproc)
        return {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "ROLE_RANK": str(rank),
            "WORLD_SIZE": world,
            "LOCAL_WORLD_SIZE": world,
            "ROLE_WORLD_SIZE": world,
            "GROUP_RANK": "0",
            "GROUP_WORLD_SIZE": "1",
            "MASTER_ADDR": _HOST,
            "MASTER_PORT": str(self.store.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }

    def __enter__(self) -> LocalRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        for proc in self.procs:
            proc.wait()
        del self.store  # the store's server stops with its last reference

    def running(self) -> list[subprocess.Popen]:
        """The ranks still running (each is reaped here once it has ended)."""
        return [proc for proc in self.procs if proc.poll() is None]

    def failed(self) -> bool:
        """Whether a rank has ended with a non-zero status."""
        return any(proc.poll() not in (None, 0) for proc in self.procs)

    def returncode(self) -> int | None:
        """None while a rank runs; then 0 if every rank succeeded, else the first failure's
        status (a negative number: the signal that ended it)."""
        codes = [proc.poll() for proc in self.procs]
        if None in codes:
            return None
        return next((code for code in codes if code), 0)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to each running rank's process group (the rank and what it started)."""
        for proc in self.running():
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass  # it ended meanwhile

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
