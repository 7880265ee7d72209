"""Start a benchmark's own ranks (a peer's, or its timed workers) as torchrun starts them.

``run_ranks(nproc, script, *args, timeout=...)`` is ``torchrun --standalone
--nproc-per-node=NPROC SCRIPT ARGS`` with one intra-op thread per rank, its output captured,
returned as ``subprocess.run`` returns it. Under ``--quick`` (this process's command line holds
it) the ranks are forked instead from a warm process, a ``multiprocessing`` fork server that
imported torch and the benchmark script once: a fresh interpreter spends about 3 s of CPU
importing torch, and torchrun starts NPROC + 1 of them. Each forked rank gets the variables
torchrun gives its ranks (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``), runs SCRIPT as ``__main__`` with ARGS, and writes its stdout
and stderr to files that make the result's; when one rank fails the others are stopped, as
torchrun stops them. The figures in docs/BENCHMARKS.md come from full runs, under torchrun.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import torchrun_command

QUICK = "--quick" in sys.argv[1:]
_PRELOAD = ["__main__", "torch", "torch.distributed"]  # __main__: the benchmark script
_POLL_S = 0.05


def run_ranks(
    nproc: int, script: str, *args: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node=NPROC SCRIPT ARGS`` (forked under --quick).

    Raises:
        subprocess.TimeoutExpired: a rank still ran after ``timeout`` seconds (all are stopped).
    """
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = torchrun_command(nproc, script, *args)
    if not QUICK:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=environment
        )
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as tmp:
        files = [(Path(tmp, f"{r}.out"), Path(tmp, f"{r}.err")) for r in range(nproc)]
        ranks = [
            context.Process(
                target=_rank,
                args=(r, nproc, port, script, list(args), environment, *map(str, files[r])),
                daemon=True,
            )
            for r in range(nproc)
        ]
        for rank in ranks:
            rank.start()
        code = _wait(ranks, command, timeout)
        out = "".join(o.read_text(errors="replace") for o, _ in files)
        err = "".join(e.read_text(errors="replace") for _, e in files)
    return subprocess.CompletedProcess(command, code, out, err)


def _wait(ranks: list, command: list[str], timeout: float) -> int:  # type: ignore[type-arg]
    """The first non-zero exit code (0 if none); a failed rank stops the others."""
    deadline = time.monotonic() + timeout
    while any(r.is_alive() for r in ranks):
        failed = [r.exitcode for r in ranks if r.exitcode]
        if failed or time.monotonic() > deadline:
            for r in ranks:
                r.kill()
                r.join()
            if not failed:
                raise subprocess.TimeoutExpired(command, timeout)
            return failed[0]
        time.sleep(_POLL_S)
    return next((r.exitcode for r in ranks if r.exitcode), 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(
    rank: int,
    world: int,
    port: int,
    script: str,
    args: list[str],
    environment: dict[str, str],
    out: str,
    err: str,
) -> None:
    """One forked rank: torchrun's variables, its output to files, SCRIPT as ``__main__``."""
    os.environ.clear()
    os.environ.update(environment)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))  # fmt: skip
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = [script, *args]
    sys.path[0] = str(Path(script).resolve().parent)
    runpy.run_path(script, run_name="__main__")  # its SystemExit ends the process as python's
