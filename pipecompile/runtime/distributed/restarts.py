"""`run --nproc N --save DIR --max-restarts K`: when a rank fails, every rank is stopped (as
``launch`` does), then all are started again from the newest complete step this run saved in
DIR, up to K times.

Each restart is one line on stderr and one ``{"kind": "restart", ...}`` record in the metrics
file: the failed rank, its reason, the step it failed in and the step resumed from (0: the
start, when the run had saved nothing yet; then a ``--resume`` given is read again). A run
that still fails after K restarts stops with its last failure named. The faults of
``PIPECOMPILE_FAULT`` that name a step fire once over all the restarts (``runtime.faults``).
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipecompile.files.names import LATEST
from pipecompile.runtime.distributed.launch import launch
from pipecompile.runtime.job.run import RunJob
from pipecompile.runtime.process.faults import FIRED_ENV
from pipecompile.runtime.process.interrupt import EXIT_INTERRUPTED
from pipecompile.runtime.training.metrics import append_record

__all__ = ["Failure", "launch_restarting", "failure_of"]


@dataclass(frozen=True)
class Failure:
    """Why an attempt ended: the rank that failed first, in its words, and in which step."""

    rank: int | None
    reason: str
    step: int  # the step it failed in (1 + the steps done)

    def __str__(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "a rank"
        return f"{who} failed in step {self.step} ({self.reason})"


def launch_restarting(job: RunJob) -> int:
    """``launch`` the ranks of ``job``, and again after each failure while its
    ``--max-restarts`` are left; returns the last attempt's status."""
    max_restarts, save, metrics = job.run.max_restarts or 0, job.train.save, job.train.metrics
    nproc = job.ranks or 1
    if not max_restarts:
        return launch(job)
    assert save is not None, "--max-restarts needs --save (refused before)"
    before = _latest(save)  # a step of an earlier run (--force) is not this run's to resume
    with tempfile.TemporaryDirectory(prefix="pipecompile-faults-") as fired:
        attempt, done = job, 0
        while True:
            entries: list[dict] = []
            status = launch(attempt, keep=entries, env={FIRED_ENV: fired})
            if status in (0, 1, EXIT_INTERRUPTED):
                return status
            failure = failure_of(entries, nproc)
            if done == max_restarts:
                print(
                    f"pipecompile: stopped after {done} restart(s) (--max-restarts "
                    f"{max_restarts}): {failure}",
                    file=sys.stderr,
                )
                return status
            done += 1
            latest = _latest(save)
            resumed = latest if latest is not None and latest != before else None
            last = job.train.steps
            if resumed and last is not None and int(resumed.removeprefix("step_")) >= last:
                print(
                    f"pipecompile: {failure}, after the run saved its last step ({resumed} "
                    f"in {save}): nothing is left to run",
                    file=sys.stderr,
                )
                return 0
            _announce(done, max_restarts, failure, resumed, metrics)
            attempt = job.resuming(save) if resumed else job


def failure_of(entries: list[dict], nproc: int) -> Failure:
    """The first cause among the ranks' status records: a rank's own error or injected kill,
    else a rank that left none (killed), else what the stopped ranks blame."""
    done = [e["step"] for e in entries if e.get("step") is not None]
    step = (max(done) if done else 0) + 1
    by_rank = {e["rank"]: e for e in entries}
    for entry in sorted(entries, key=lambda e: e["rank"]):
        if entry["status"] == 137:
            return Failure(entry["rank"], f"killed at instruction {entry.get('killed_at')}", step)
        if entry["status"] == 2:
            return Failure(entry["rank"], entry.get("reason") or "an error", step)
    blamed = [e["reason"] for e in entries if e["status"] == 3 and e.get("reason")]
    missing = sorted(set(range(nproc)) - set(by_rank))
    if missing:  # what the ranks that stopped saw of it ("rank 1 died (pid ...) at ...")
        seen = next((b for b in blamed if b.startswith(f"rank {missing[0]} ")), None)
        reason = seen.removeprefix(f"rank {missing[0]} ") if seen else None
        return Failure(missing[0], reason or "ended without a status (killed?)", step)
    return Failure(None, blamed[0] if blamed else "stopped", step)


def _latest(save: Path) -> str | None:
    """The step ``latest`` names in ``save`` now (None: none)."""
    try:
        return (save / LATEST).read_text().strip() or None
    except OSError:
        return None


def _announce(
    done: int, most: int, failure: Failure, resumed: str | None, metrics: Path | None
) -> None:
    """The restart's line on stderr and its record in the metrics file."""
    step = int(resumed.removeprefix("step_")) if resumed else 0
    where = f"from {resumed}" if resumed else "from the start (no step saved yet)"
    print(f"pipecompile: restart {done} of {most}: {failure}; resuming {where}", file=sys.stderr)
    record = {
        "kind": "restart",
        "restart": done,
        "rank": failure.rank,
        "reason": failure.reason,
        "failed_step": failure.step,
        "resumed_from": step,
    }
    append_record(metrics, record)
