"""Python commands of a quick run forked from a warm process, and a benchmark's own ranks.

A fresh interpreter spends about 3 s of CPU importing torch. Under ``--quick`` (this process's
command line holds it) the tools start the commands whose start-up is not what they measure
from a warm process instead: a ``multiprocessing`` fork server that imported torch, pipecompile
and the running script once. ``start(argv, ...)`` runs ``python -m MODULE ARGS`` or ``python
SCRIPT ARGS`` there as the interpreter would (``__main__``, ``sys.argv``, the script's folder on
``sys.path``), with the given environment, working directory and output files, in a session of
its own. A full run keeps fresh interpreters: the figures in docs/BENCHMARKS.md come from those.

``run_ranks(nproc, script, *args, timeout=...)`` is ``torchrun --standalone
--nproc-per-node=NPROC SCRIPT ARGS`` with one intra-op thread per rank, its output captured and
returned as ``subprocess.run`` returns it; under ``--quick`` each rank is started by ``start``
with the variables torchrun gives its ranks (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), and when one fails the others are
stopped, as torchrun stops them.
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
import warnings
from multiprocessing.process import BaseProcess
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for tools/qa's scripts too

from common import torchrun_command  # noqa: E402

QUICK = "--quick" in sys.argv[1:]
_PRELOAD = [
    "__main__",
    "torch",
    "torch.distributed",
    "pipecompile.surfaces.cli",
]  # __main__: the tool
_POLL_S = 0.05


def start(
    argv: list[str], *, env: dict[str, str], cwd: str, stdout: str, stderr: str
) -> BaseProcess:
    """``argv`` (``[python, -m, MODULE, ...]`` or ``[python, SCRIPT, ...]``) forked from the
    warm process, writing to the files ``stdout`` and ``stderr`` (the same path: both in one)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    process = context.Process(target=_command, args=(argv[1:], env, cwd, stdout, stderr))
    process.daemon = True
    process.start()
    return process


def stop(process: BaseProcess) -> None:
    """SIGKILL ``process`` and what it started (its session), and reap it."""
    try:
        os.killpg(process.pid, 9)  # type: ignore[arg-type]
    except (ProcessLookupError, PermissionError):
        pass
    process.kill()
    process.join()


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
    port = str(_free_port())
    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as tmp:
        files = [(f"{tmp}/{r}.out", f"{tmp}/{r}.err") for r in range(nproc)]
        ranks = []
        for r, (out, err) in enumerate(files):
            own = {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(nproc),
                   "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}  # fmt: skip
            argv = [sys.executable, script, *args]
            ranks.append(start(argv, env={**environment, **own}, cwd=os.getcwd(), stdout=out,
                               stderr=err))  # fmt: skip
        code = _wait(ranks, command, timeout)
        out = "".join(Path(o).read_text(errors="replace") for o, _ in files)
        err = "".join(Path(e).read_text(errors="replace") for _, e in files)
    return subprocess.CompletedProcess(command, code, out, err)


def _wait(ranks: list[BaseProcess], command: list[str], timeout: float) -> int:
    """The first non-zero exit code (0 if none); a failed rank stops the others."""
    deadline = time.monotonic() + timeout
    while any(r.is_alive() for r in ranks):
        failed = [r.exitcode for r in ranks if r.exitcode]
        if failed or time.monotonic() > deadline:
            for r in ranks:
                stop(r)
            if not failed:
                raise subprocess.TimeoutExpired(command, timeout)
            return failed[0]  # type: ignore[return-value]
        time.sleep(_POLL_S)
    return next((r.exitcode for r in ranks if r.exitcode), 0)  # type: ignore[return-value]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _command(args: list[str], env: dict[str, str], cwd: str, stdout: str, stderr: str) -> None:
    """In the forked process: ``python ARGS`` as the interpreter runs it. Its SystemExit ends the
    process as the interpreter's would (multiprocessing's ending of a target)."""
    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    if env.get("PYTHONWARNINGS") == "ignore":  # read at an interpreter's start-up, not here
        warnings.simplefilter("ignore")
    out = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    err = out if stderr == stdout else os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(out, 1)
    os.dup2(err, 2)
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        sys.path[0] = str(Path(args[0]).resolve().parent)
        runpy.run_path(args[0], run_name="__main__")
