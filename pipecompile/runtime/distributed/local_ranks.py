"""The ranks of a run on this machine, started by this process the way torch's launcher would.

This process hosts the run's c10d store; each rank gets the environment ``torchrun`` gives
(its ranks, the store's address, ``TORCHELASTIC_USE_AGENT_STORE`` so that every rank is a
client of that store and it outlives any one rank) and writes its stderr into one pipe, read
here through ``stderr``. The ranks are forked by a starter process (``rank_starter``) that
imported torch once; it reports each rank's process id and exit status. The starter is kept
for this process's later launches while the variables that shape an interpreter's start-up
(all but the launch's own) stay the same, so a second launch starts its ranks at once.

A starter is a fresh interpreter, unless the process forks its own beforehand
(``fork_a_starter``) while it has imported torch and run no torch op: the `pipecompile run
--nproc N` command does, first thing, which saves it the start-up of a second interpreter
(about 3.5 s of CPU: torch and its compiler front end).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
from functools import partial
from typing import Any

from torch.distributed import TCPStore

from pipecompile.runtime.distributed.rank_starter import _PR_SET_PDEATHSIG, send_request, serve

__all__ = ["IMPORT_TIME", "LocalRanks", "Rank", "STARTER_MODULE", "fork_a_starter", "tied_to_us"]

STARTER_MODULE = "pipecompile.runtime.distributed.rank_starter"
_HOST = "127.0.0.1"
# The variables an interpreter or torch may read while starting up or importing, and those
# pipecompile reads when a module is imported (IMPORT_TIME; the rest of its variables, such as
# PIPECOMPILE_FAULT, are read when a rank runs): a starter serves only launches that give them
# the same values. The rest reach each rank as its environment (a test runner's
# PYTEST_CURRENT_TEST, say, changes with every test).
IMPORT_TIME = ("PIPECOMPILE_RECEIVE_AHEAD",)  # tests/runtime/test_rank_starter.py keeps it whole
_START_UP = ("PYTHON", "LD_", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "TORCH")
_START_UP += ("PYTORCH_", "CUDA_", "NCCL_", "GLOO_", *IMPORT_TIME)
_PER_LAUNCH = ("PIPECOMPILE_STATUS_DIR", "OMP_NUM_THREADS")  # set by each launch; the worker
# sets its threads itself, and the status directory marks the run's processes (launch.py)


def fork_a_starter() -> None:
    """Fork the starter of this process's later launches now, from this process itself.

    Only for a process that has imported torch and run no torch op (and started no thread):
    a process forked after OpenMP has run a parallel region hangs in its own next one. Where
    a starter is kept already, nothing happens; a launch whose start-up variables differ from
    this process's starts a fresh one as before.

    Example:
        >>> fork_a_starter()  # doctest: +SKIP  (first thing in `pipecompile run --nproc`)
    """
    _Starter.fork_here()


def tied_to_us() -> Any:
    """On Linux, what a child runs before it starts so that our death, even by SIGKILL, kills
    it too (a rank would otherwise lose the store we host and stop, at its next heartbeat,
    without a line anyone reads); elsewhere None."""
    if not sys.platform.startswith("linux"):
        return None
    return partial(_killed_when_parent_dies, ctypes.CDLL(None).prctl, os.getpid())


def _killed_when_parent_dies(prctl: Any, parent: int) -> None:
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above took effect
        os.kill(os.getpid(), signal.SIGKILL)


class _Forked:
    """A starter forked from this process, seen as ``subprocess.Popen`` sees a child."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


class Rank:
    """One rank's process as the starter reports it: ``pid`` once forked, and ``returncode``
    (as ``subprocess.Popen``'s: negative for a signal) once ended."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


class _Starter:
    """A ``rank_starter`` process and the socket its requests go through."""

    _kept: _Starter | None = None
    _lock = threading.Lock()

    def __init__(self, env: dict[str, str], preexec: Any) -> None:
        self.key = _start_up(env)
        rest = {k: v for k, v in env.items() if k not in _PER_LAUNCH}
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", STARTER_MODULE, str(theirs.fileno())],
                env=rest,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                preexec_fn=preexec,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours

    @classmethod
    def fork_here(cls) -> None:
        """Keep a starter forked from this process (see ``fork_a_starter``)."""
        with cls._lock:
            if cls._kept is not None and cls._kept.proc.poll() is None:
                return
            starter = cls.__new__(cls)
            starter.key = _start_up(dict(os.environ))
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            tie = tied_to_us()
            pid = os.fork()
            if pid == 0:  # the starter: as a fresh one is started, then serving until closed
                try:
                    ours.close()
                    os.setsid()
                    null = os.open(os.devnull, os.O_RDWR)
                    os.dup2(null, 0)
                    os.dup2(null, 1)
                    if tie is not None:
                        tie()
                    serve(theirs)
                finally:
                    os._exit(1)  # serve ends the process itself; this only after an error
            theirs.close()
            starter.sock, starter.proc = ours, _Forked(pid)
            cls._kept = starter

    @classmethod
    def serving(cls, env: dict[str, str], preexec: Any) -> _Starter:
        """The kept starter if it runs with this start-up environment, else a new one."""
        with cls._lock:
            kept = cls._kept
            if kept is None or kept.proc.poll() is not None or kept.key != _start_up(env):
                if kept is not None:
                    kept.close()
                cls._kept = kept = cls(env, preexec)
            return kept

    @classmethod
    def forget(cls, starter: _Starter) -> None:
        with cls._lock:
            if cls._kept is starter:
                cls._kept = None

    def close(self) -> None:
        """End it (closing the socket ends it once its ranks have ended; SIGKILL ends them)."""
        self.sock.close()
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait()


def _start_up(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_START_UP) and k not in _PER_LAUNCH}


class LocalRanks:
    """``nproc`` ranks, each in a session of its own, forked by the kept starter process;
    ``preexec`` runs in a new starter before it starts (see ``subprocess.Popen``); ``entry``
    (``MODULE:FUNCTION``) is what the ranks run with ``worker_args``, the worker by default.
    Used as a context manager, whatever is left of them is SIGKILLed on the way out and the
    store is closed."""

    def __init__(
        self,
        nproc: int,
        worker_args: list[str],
        env: dict[str, str],
        preexec: Any = None,
        entry: str | None = None,
    ) -> None:
        self.store = TCPStore(_HOST, 0, is_master=True, wait_for_workers=False)
        self.procs = [Rank() for _ in range(nproc)]
        self._lock = threading.Lock()  # the reader thread writes the ranks' pids and codes
        ranks = [self._rank_env(rank, nproc) for rank in range(nproc)]
        request = {"worker_args": worker_args, "cwd": os.getcwd(), "env": env, "ranks": ranks}
        if entry is not None:  # MODULE:FUNCTION the ranks run instead of the worker
            request["entry"] = entry
        read_end, write_end = os.pipe()
        status_read, status_write = os.pipe()
        fds = [status_write, write_end, 1]  # the ranks write to this process's stdout
        try:
            self.starter = _Starter.serving(env, preexec)
            try:
                send_request(self.starter.sock, request, fds)
            except OSError:  # the kept starter has died since: once more with a new one
                _Starter.forget(self.starter)
                self.starter = _Starter.serving(env, preexec)
                send_request(self.starter.sock, request, fds)
        except BaseException:
            os.close(read_end)
            os.close(status_read)
            raise
        finally:
            os.close(write_end)  # the ranks hold it now: the pipe ends when the last one does
            os.close(status_write)
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
            with self._lock:
                if word == "started" and waiting:
                    rank = waiting.pop(0)
                    rank.pid = int(pid)
                    by_pid[rank.pid] = rank
                elif word == "ended" and int(pid) in by_pid:
                    by_pid[int(pid)].returncode = int(code[0])
        status.close()
        with self._lock:  # the starter ended (or never got the request) before these did
            for rank in self.procs:
                if rank.returncode is None:
                    rank.returncode = -signal.SIGKILL

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
        SIGKILL while some rank is not started yet kills the starter too (its ranks die with
        it; the next launch starts another)."""
        with self._lock:
            running = self.running()
            unstarted = any(proc.pid is None for proc in running)
        for proc in running:
            try:
                if proc.pid is not None:
                    os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass  # it ended meanwhile
        if unstarted and sig == signal.SIGKILL:  # a rank may be forked at any moment
            _Starter.forget(self.starter)
            self.starter.close()

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
