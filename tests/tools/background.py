"""The tools' quick runs (and other commands tests only read the results of), started in the
background as soon as the session's tests are known.

A quick run is mostly Python processes starting and importing torch: work on one core, while
the in-process tests before it leave CI's second core half idle. Started when collection
ends (tests/conftest.py), one at a time, the runs fill that core and are done by the time
tests/tools/test_quick.py, collected last, reads their results. When nothing else is selected
they run two at a time, as there is nothing to overlap with.

Other tests' commands go ahead of them in the queue, by a key of their own (``jobs``): the
examples run as scripts (tests/test_example_scripts.py), which the in-process tests would
otherwise wait for on one core.

Each run gets the environment as it was when the session started: tests change this process's
environment for their own commands (``PIPECOMPILE_FAULT``, ``PATH``), and a run started
meanwhile must not inherit that.

A script's quick run is forked from a warm process (multiprocessing's fork server, which
imported torch, its compiler front end and pipecompile once and runs no torch op) and then
runs as ``python SCRIPT --quick`` would: ``__main__``, its own folder first on ``sys.path``,
that argv, environment and working directory, its stdout and stderr captured. A fresh
interpreter would spend about 3 s of CPU importing them, 24 times a session. Before the script
runs, the run forks the rank starter of its own `--nproc` launches from itself, as the
`pipecompile run --nproc` command does (``local_ranks.fork_a_starter``), instead of starting
one more interpreter. The commands the scripts start themselves are fresh interpreters, as a
user's are.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from pipecompile.runtime.distributed.local_ranks import fork_a_starter

ROOT = Path(__file__).resolve().parent.parent.parent
TIMEOUT_S = 300  # per script: a quick mode takes seconds; this only bounds a hang


WARM = ["torch", "torch._dynamo", "pipecompile.surfaces.cli", "tests.tools.background"]
_server: multiprocessing.context.ForkServerContext | None = None


def _forking() -> multiprocessing.context.ForkServerContext:
    global _server
    if _server is None:
        _server = multiprocessing.get_context("forkserver")
        _server.set_forkserver_preload(WARM)
    return _server


def _become_script(script: str, env: dict[str, str], stdout: str, stderr: str) -> None:
    """In the forked process: ``python SCRIPT --quick``. multiprocessing ends the process on
    the script's SystemExit as the interpreter would (None: 0, a message: on stderr, then 1),
    flushing its output and running its finalizers."""
    for path, fd in ((stdout, 1), (stderr, 2)):
        target = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(ROOT)
    sys.argv = [script, "--quick"]
    sys.path.insert(0, str(Path(script).parent))
    fork_a_starter()  # as `pipecompile run --nproc` does: no torch op has run here yet
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except BaseException:  # the interpreter's own report, without multiprocessing's header
        traceback.print_exc()
        raise SystemExit(1) from None


class _ForkedRun:
    """A script's quick run forked from the warm process, with what the runner uses of a
    ``subprocess.Popen``: ``kill``, ``communicate`` and ``returncode``."""

    def __init__(self, script: Path, env: dict[str, str]) -> None:
        self._folder = tempfile.mkdtemp(prefix="pipecompile-quick-")
        self._out, self._err = (os.path.join(self._folder, n) for n in ("stdout", "stderr"))
        for path in (self._out, self._err):
            Path(path).touch()
        self.returncode: int | None = None
        self.args = [sys.executable, str(script), "--quick"]
        self._process = _forking().Process(
            target=_become_script, args=(str(script), env, self._out, self._err)
        )
        self._process.start()

    def kill(self) -> None:
        self._process.kill()

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        self.returncode = self._process.exitcode
        try:
            printed = [
                Path(p).read_text(encoding="utf-8", errors="replace")
                for p in (self._out, self._err)
            ]
        finally:
            shutil.rmtree(self._folder, ignore_errors=True)
        return printed[0], printed[1]


class QuickRuns:
    """``python SCRIPT --quick`` for each selected script, in a pool; ``stop`` kills what is
    still running when the session ends early (``-x``, Ctrl-C)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._futures: dict[Path | str, Future] = {}
        self._commands: dict[Path | str, list[str]] = {}
        self._running: set[subprocess.Popen | _ForkedRun] = set()
        self._lock = threading.Lock()
        self._stopped = False
        self._env = dict(os.environ)
        self.seconds: dict[Path | str, float] = {}  # each finished run's wall time

    def start(
        self, scripts: list[Path], *, at_once: int, jobs: dict[str, list[str]] | None = None
    ) -> None:
        """Queue each job's command (by its key), then each script's quick run: a job's test
        comes before tests/tools/test_quick.py, collected last."""
        self._commands.update(jobs or {})
        keys = [*(jobs or {}), *scripts]
        if not keys:
            return
        self._env = dict(os.environ)  # before any test has changed it
        self._pool = ThreadPoolExecutor(max_workers=at_once, thread_name_prefix="quick-run")
        for key in keys:
            self._futures[key] = self._pool.submit(self._run, key)

    def result(
        self, key: Path | str, command: list[str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The finished run of a script's quick mode or of a job (run now, as ``command`` for a
        job, if it was not started in the background)."""
        future = self._futures.get(key)
        if future is not None:
            return future.result()
        if command is not None:
            self._commands[key] = command
        return self._run(key)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            for proc in self._running:
                proc.kill()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _run(self, key: Path | str) -> subprocess.CompletedProcess[str]:
        job = self._commands.get(key)
        command = job or [sys.executable, str(key), "--quick"]
        with self._lock:
            if self._stopped:
                raise RuntimeError("the test session ended before this quick run started")
            proc: subprocess.Popen | _ForkedRun
            if job is None:
                proc = _ForkedRun(Path(key), self._env)
            else:
                proc = subprocess.Popen(
                    command,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    cwd=ROOT,
                    env=self._env,
                )
            self._running.add(proc)
        began = time.perf_counter()
        try:
            stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
            stderr += f"\n(killed after {TIMEOUT_S} s: a quick run takes seconds)"
        finally:
            with self._lock:
                self._running.discard(proc)
            self.seconds[key] = time.perf_counter() - began
        return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)

    def summary(self) -> str:
        """One line: how many runs, their total wall time, and each run's, slowest first."""
        if not self.seconds:
            return ""
        slowest = sorted(self.seconds.items(), key=lambda kv: -kv[1])
        named = ", ".join(f"{Path(str(k)).stem} {s:.0f} s" for k, s in slowest)
        total = sum(self.seconds.values())
        return f"background runs: {len(self.seconds)} in {total:.0f} s: {named}"


RUNS = QuickRuns()
