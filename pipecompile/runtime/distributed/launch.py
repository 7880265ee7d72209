"""`pipecompile run OUT --nproc N`: start N ranks on this machine and see them to their end.

This process hosts the run's c10d store and starts the ranks, each running the worker on the
run's job (``RunJob.record()``, which each rank builds and checks again; under ``torchrun`` the
worker reads the same job from its argv, ``python -m pipecompile.runtime.distributed.worker
OUT ...``) with the
environment torch's own launcher would give it (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT`` of the store, ``TORCHELASTIC_USE_AGENT_STORE``), so a rank
cannot tell the two apart and the worker still runs under ``torchrun`` for several machines.
The ranks are forked by one starter process that imports torch and the worker once
(``local_ranks``, ``rank_starter``): N ranks pay one interpreter's start-up, not N (about 3 s
of CPU each on 2 cores). Starting the ranks here, not through ``torchrun``, saves the agent
process that would import torch before any rank can start.

Rank 0's output is passed through, and what the model file's hooks print on any rank is shown
as it comes, each line prefixed ``rank k:``; the ranks' other stderr is kept and shown only
if the run fails without a line of its own saying why. When a rank fails, the others get
SIGTERM at once (their watchdogs name the failed rank), and SIGKILL ``GRACE_S`` later.

Ctrl-C or SIGTERM stops the whole run. Each rank runs in a session of its own, so a terminal's
Ctrl-C reaches only this process, which sends SIGTERM to every rank, SIGKILLs whatever is left
after ``GRACE_S`` seconds, removes the train state's temporary files and prints one line. The
run's processes are found by the status directory in their environment, which they keep even
once they outlive their parent. On Linux each rank is also SIGKILLed when this process dies,
however it dies.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from pipecompile.runtime.distributed.local_ranks import LocalRanks, tied_to_us
from pipecompile.runtime.distributed.rank_output import USER_LINE, say
from pipecompile.runtime.job.run import RunJob
from pipecompile.runtime.process.interrupt import EXIT_INTERRUPTED, interrupted_line
from pipecompile.runtime.process.threads import launch_threads
from pipecompile.runtime.training.train_state import remove_partial

__all__ = ["launch", "GRACE_S"]

WORKER_ENTRY = "pipecompile.runtime.distributed.worker:run_record"  # what each rank runs
GRACE_S = 5.0  # after a stop signal, seconds before what is left of the run is SIGKILLed
_POLL_S = 0.1
_STATUS_ENV = "PIPECOMPILE_STATUS_DIR"
_RANK_LINE = re.compile(r"(?=pipecompile: rank \d+: )")  # where a rank's line begins


def launch(
    job: RunJob,
    *,
    keep: list | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """Run the ranks of ``job`` (its ``--nproc``); returns the worst rank status (0 ok, 1 check
    failed, 2 error, 3 stopped because another rank failed), or 130 after Ctrl-C or SIGTERM.
    ``keep`` receives each rank's status record (status, end time, steps done, the reason of
    a failure, and for an injected kill the instruction); ``env``: more of the ranks'
    environment."""
    nproc = job.ranks
    assert nproc, "a job of one process has no ranks to launch"
    save = job.train.save
    with _StopSignals() as stop:
        with tempfile.TemporaryDirectory(prefix="pipecompile-run-") as status_dir:
            threads = launch_threads(job.run.threads, nproc)  # the OpenMP pool's size, too
            job = job.with_threads(threads)  # each rank sets torch's count to it, not its share
            ranks_env = {
                **os.environ,
                **(env or {}),
                _STATUS_ENV: status_dir,
                "OMP_NUM_THREADS": str(threads),
            }
            record = [json.dumps(job.record())]
            returncode, stderr = _supervise(nproc, record, ranks_env, status_dir, stop)
            entries = [json.loads(p.read_text()) for p in Path(status_dir).glob("rank*.json")]
        if keep is not None:
            keep.extend(entries)
        if save is not None:
            remove_partial(save)  # no process of the run is left: what a rank left is stale
        if stop.caught:
            steps = job.train.steps
            print(interrupted_line(_steps_done(entries), steps, save), file=sys.stderr)
            return EXIT_INTERRUPTED
    return _outcome(nproc, returncode, stderr, entries)


def _outcome(nproc: int, returncode: int, stderr: str, entries: list[dict]) -> int:
    """Print the ranks' own lines (and their other stderr if none says why it failed);
    return the run's exit status."""
    statuses = {entry["rank"]: entry["status"] for entry in entries}
    ours = [
        part  # two ranks' lines that reached the pipe as one are shown as two
        for ln in stderr.splitlines()
        for part in _RANK_LINE.split(ln)
        if part.startswith("pipecompile:")
    ]
    for line in ours:
        print(line, file=sys.stderr)
    if returncode == 0 and len(statuses) == nproc and not any(statuses.values()):
        return 0
    missing = sorted(set(range(nproc)) - set(statuses))
    if missing:
        print(
            f"pipecompile: rank(s) {', '.join(map(str, missing))} ended without a status (killed?)",
            file=sys.stderr,
        )
    if not ours and returncode:
        print(stderr[-4000:], file=sys.stderr)
    worst = max(statuses.values(), default=2)
    return 1 if worst == 1 and not missing else 2  # 3 (stopped for a peer) is an error too


def _steps_done(entries: list[dict]) -> int | None:
    """Steps the run finished, as rank 0 (else any rank) recorded them; None if unknown."""
    steps = {entry["rank"]: entry.get("step") for entry in entries}
    if steps.get(0) is not None:
        return steps[0]
    return max((s for s in steps.values() if s is not None), default=None)


class _StopSignals:
    """While active, SIGINT and SIGTERM are noted in ``caught`` instead of ending the
    process (only the main thread may set handlers; elsewhere this does nothing)."""

    def __init__(self) -> None:
        self.caught: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.caught.append(signum)


def _supervise(
    nproc: int, record: list[str], env: dict[str, str], status_dir: str, stop: _StopSignals
) -> tuple[int, str]:
    """Start the ranks on the job's ``record`` and see them to their end; returns the run's
    exit status and the ranks' stderr. Whatever way this ends, no process of the run is left
    afterwards."""
    marker = f"{_STATUS_ENV}={status_dir}".encode()
    with LocalRanks(nproc, record, env, preexec=tied_to_us(), entry=WORKER_ENTRY) as ranks:
        relay = _Relay(ranks.stderr)
        relay.start()
        try:
            _wait(ranks, relay, marker, stop)
        finally:
            _end_run(ranks, marker)  # normally nothing is left; after an exception, everything
        relay.join(GRACE_S)
        return ranks.returncode() or 0, relay.text


class _Relay(threading.Thread):
    """Reads the stderr the ranks share to its end: the model file's own lines
    (``rank k: ...``) are shown as they come, and everything is kept for the end."""

    def __init__(self, stream: Any) -> None:
        super().__init__(daemon=True, name="pipecompile-relay")
        self.stream = stream
        self.lines: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def run(self) -> None:
        try:
            for line in self.stream:
                self.lines.append(line)
                if USER_LINE.match(line):
                    say(line.rstrip("\n"))
        except (OSError, ValueError):  # the pipe was closed under us: the run is over
            pass


def _wait(ranks: LocalRanks, relay: _Relay, marker: bytes, stop: _StopSignals) -> None:
    """Until every rank has ended and closed the stderr they share. A failed rank, like a
    stop signal, sends the others SIGTERM; GRACE_S later (or at a second signal) SIGKILL."""
    deadline = None
    while True:
        relay.join(_POLL_S)
        if not relay.is_alive() and not ranks.running():
            return
        if (stop.caught or ranks.failed()) and deadline is None:
            _signal_run(ranks, marker, signal.SIGTERM)
            deadline = time.monotonic() + GRACE_S
        if deadline is not None and (time.monotonic() > deadline or len(stop.caught) > 1):
            _signal_run(ranks, marker, signal.SIGKILL)
            relay.join(GRACE_S)  # else something outside the run holds the pipe
            return  # _end_run finishes


def _end_run(ranks: LocalRanks, marker: bytes) -> None:
    """SIGTERM what is left of the run, SIGKILL it GRACE_S later; returns once it is gone."""
    if ranks.running() or _run_pids(marker):
        _signal_run(ranks, marker, signal.SIGTERM)
        if not _gone(ranks, marker, GRACE_S):
            _signal_run(ranks, marker, signal.SIGKILL)
            _gone(ranks, marker, GRACE_S)
    ranks.stderr.close()


def _gone(ranks: LocalRanks, marker: bytes, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while ranks.running() or _run_pids(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)
    return True


def _signal_run(ranks: LocalRanks, marker: bytes, sig: int) -> None:
    """Send ``sig`` to each rank's process group and to every process of the run."""
    ranks.signal(sig)
    for pid in _run_pids(marker):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # it ended meanwhile


def _run_pids(marker: bytes) -> list[int]:
    """The live processes whose environment holds ``marker`` (the ranks and anything they started);
    an exited process's environment reads empty. Without /proc: none."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    pids = []
    for name in names:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as environ:
                if marker in environ.read().split(b"\0"):
                    pids.append(int(name))
        except OSError:
            continue
    return pids
