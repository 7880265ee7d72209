"""Run Python files as scripts, each as ``python FILE ARGS...`` would, paying torch's import once.

Usage: ``python tests/run_as_scripts.py JOBS.json RESULTS.json``, where JOBS.json lists
``[path, [args...]]`` pairs. This process imports torch, then forks one child per file (two
running at a time); the child sets ``sys.argv`` and ``sys.path[0]`` as the interpreter does for
a script, sends its stdout and stderr to files and runs the file as ``__main__``. RESULTS.json
maps each path to its exit status, stdout and stderr. A child still running after ``TIMEOUT_S``
is killed (status -9). Nothing here runs a torch operation before forking: OpenMP's thread pool
is not safe to fork once it has started.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch  # noqa: F401  (the import every child shares)

TIMEOUT_S = 300.0  # per file: a hang guard, not a speed limit
# Two at once: much of a script is importing and tracing in one Python thread, which leaves
# one of CI's two cores idle (as tests/tools/test_quick.py runs the tools' quick modes).
AT_ONCE = 2


def _child(path: str, args: list[str], out: Path, err: Path) -> None:
    """In the forked child: run ``path`` as ``__main__`` and exit with its status."""
    os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
    os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    sys.argv = [path, *args]
    sys.path[0] = str(Path(path).resolve().parent)
    status = 0
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as stop:
        code = stop.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _start(path: str, args: list[str], scratch: Path) -> int:
    """Fork a child running ``path``; its stdout and stderr go to files in ``scratch``."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(path, args, scratch / "stdout", scratch / "stderr")
    return pid


def _reap(running: dict[int, tuple[str, Path, float]], found: dict[str, dict]) -> None:
    """Wait for one child to end (or kill the first past its deadline) and record it."""
    while True:
        for pid, (path, scratch, deadline) in running.items():
            done, status = os.waitpid(pid, os.WNOHANG)
            if not done and time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                done, status = os.waitpid(pid, 0)
            if done:
                del running[pid]
                found[path] = {
                    "status": os.waitstatus_to_exitcode(status),
                    "stdout": (scratch / "stdout").read_text(),
                    "stderr": (scratch / "stderr").read_text(),
                }
                return
        time.sleep(0.05)


def main() -> None:
    jobs, results = sys.argv[1], sys.argv[2]
    found: dict[str, dict] = {}
    running: dict[int, tuple[str, Path, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k, (path, args) in enumerate(json.loads(Path(jobs).read_text())):
            if len(running) == AT_ONCE:
                _reap(running, found)
            scratch = Path(tmp) / str(k)
            scratch.mkdir()
            running[_start(path, args, scratch)] = (path, scratch, time.monotonic() + TIMEOUT_S)
        while running:
            _reap(running, found)
    Path(results).write_text(json.dumps(found))


if __name__ == "__main__":
    main()
