"""The ranks of a run on this machine, started by this process the way torch's launcher would.

This process hosts the run's c10d store; each rank gets the environment ``torchrun`` gives
(its ranks, the store's address, ``TORCHELASTIC_USE_AGENT_STORE`` so that every rank is a
client of that store and it outlives any one rank) and writes its stderr into one pipe, read
here through ``stderr``. The ranks are forked by one starter process (``rank_starter``), which
imports torch once for all of them; it reports each rank's process id and exit status.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any

from torch.distributed import TCPStore

__all__ = ["LocalRanks", "Rank", "STARTER_MODULE", "WORKER_MODULE"]

WORKER_MODULE = "pipecompile.runtime.distributed.worker"
STARTER_MODULE = "pipecompile.runtime.distributed.rank_starter"
_HOST = "127.0.0.1"


class Rank:
    """One rank's process as the starter reports it: ``pid`` once forked, and ``returncode``
    (as ``subprocess.Popen``'s: negative for a signal) once ended."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


class LocalRanks:
    """``nproc`` ranks, each in a session of its own, forked by one starter process;
    ``preexec`` runs in the starter before it starts (see ``subprocess.Popen``). Used as a
    context manager, whatever is left of them is SIGKILLed on the way out and the store is
    closed."""

    def __init__(
        self, nproc: int, worker_args: list[str], env: dict[str, str], preexec: Any = None
    ) -> None:
        self.store = TCPStore(_HOST, 0, is_master=True, wait_for_workers=False)
        self.procs = [Rank() for _ in range(nproc)]
        self._changed = threading.Condition()
        read_end, write_end = os.pipe()
        status_read, status_write = os.pipe()
        try:
            self.starter = subprocess.Popen(
                [sys.executable, "-m", STARTER_MODULE, str(status_write)],
                env=env,
                stdin=subprocess.PIPE,
                stderr=write_end,
                pass_fds=(status_write,),
                start_new_session=True,
                preexec_fn=preexec,
            )
        except BaseException:
            os.close(read_end)
            os.close(status_read)
            raise
        finally:
            os.close(write_end)  # the ranks hold it now: the pipe ends when the last one does
            os.close(status_write)
        ranks = [self._rank_env(rank, nproc) for rank in range(nproc)]
        request = {"worker_args": worker_args, "ranks": ranks}
        assert self.starter.stdin is not None
        try:
            self.starter.stdin.write(json.dumps(request).encode() + b"\n")
            self.starter.stdin.close()
        except OSError:  # the starter died at once: its status says so
            pass
        self.stderr = os.fdopen(read_end, encoding="utf-8", errors="replace")
        self._reader = threading.Thread(
            target=self._follow, args=(os.fdopen(status_read),), daemon=True
        )
        self._reader.start()

    def _follow(self, status: Any) -> None:
        """Take the starter's reports; at its end, a rank it did not report ended is taken as
        killed with it."""
        waiting = list(self.procs)
        by_pid: dict[int, Rank] = {}
        for line in status:
            word, pid, *code = line.split()
            with self._changed:
                if word == "started" and waiting:
                    rank = waiting.pop(0)
                    rank.pid = int(pid)
                    by_pid[rank.pid] = rank
                elif word == "ended" and int(pid) in by_pid:
                    by_pid[int(pid)].returncode = int(code[0])
                self._changed.notify_all()
        status.close()
        code = self.starter.wait()
        with self._changed:
            for rank in self.procs:
                if rank.returncode is None:
                    rank.returncode = code or -signal.SIGKILL
            self._changed.notify_all()

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
        self._reader.join()  # the starter has then ended, and every rank with it
        del self.store  # the store's server stops with its last reference

    def running(self) -> list[Rank]:
        """The ranks still running (or not yet started)."""
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
        """Send ``sig`` to each running rank's process group (the rank and what it started);
        while some rank is not started yet, the starter is killed (its ranks die with it)."""
        with self._changed:
            running = self.running()
            unstarted = any(proc.pid is None for proc in running)
        for proc in running:
            try:
                if proc.pid is not None:
                    os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass  # it ended meanwhile
        if unstarted or sig == signal.SIGKILL:
            try:
                self.starter.kill()
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
