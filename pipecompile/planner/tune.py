"""``--tune K``: run the K best plans of the search for a few steps on this machine, print
predicted against measured, and keep the measured best.

Each plan is compiled with the search's own cost model (so its split is the one predicted),
written to a temporary directory and trained for S steps: on D ranks started from this
process, as ``pipecompile run DIR --nproc D`` starts them (forked by its rank starter, so a
plan's run does not pay for importing torch again), when it needs D > 1 devices, else by
``pipecompile run DIR`` in a subprocess. Its
step is the median ``step_ms`` of the steps after the first (which warms up). The ratio of
measured to predicted steps (their median) is kept with this machine's calibration, so the
next search of this model predicts plans on as many ranks in measured terms (a ratio per
rank count: each count has its own calibration). A plan measured
more than ``FAR``-fold off its prediction (either way) is warned of: the calibration, not
the plan, is then likely at fault (one measured on a busy machine).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from pipecompile.errors import PlanError
from pipecompile.ir.records.compiled import Compiled
from pipecompile.ir.records.plan_record import PlanRow, TunedRow
from pipecompile.planner.calibrate import remember_scale
from pipecompile.runtime.process.notes import warning

__all__ = ["FAR", "far_off", "measure_step", "tune"]

FAR = 2.0  # a measured step this many times the predicted one, or 1/FAR of it, is warned of

Rebuild = Callable[[PlanRow], Compiled]  # a plan the search priced -> its compiled form
Write = Callable[[Compiled, Path], None]  # write a compiled plan into a directory


def tune(
    compiled: Compiled,
    count: int,
    *,
    rebuild: Rebuild,
    write: Write,
    steps: int = 4,
    say: Callable[[str], None] | None = None,
) -> Compiled:
    """The measured best of the ``count`` best plans of ``compiled.plan``, its record
    extended with each tuned plan's predicted and measured step (``tuned``)."""
    record = compiled.plan
    if record is None:
        raise PlanError("--tune K measures the plans a search found: give --devices N too")
    ranked = record.ranked
    plans = ranked[:count]
    rows: list[TunedRow] = []
    counts: list[int] = []  # the ranks each tuned plan ran on
    best: tuple[float, Compiled, int] | None = None
    with tempfile.TemporaryDirectory(prefix="pipecompile-tune-") as tmp:
        for k, plan in enumerate(plans):
            candidate = compiled if k == 0 else rebuild(plan)
            directory = Path(tmp) / f"plan{k}"
            write(candidate, directory)
            replicated = any(r > 1 for r in candidate.replicas)
            ranks = sum(candidate.replicas) if replicated else len(candidate.program.devices)
            measured = measure_step(directory, ranks, steps)
            rows.append(TunedRow(plan.flags, plan.predicted_step_s, round(measured, 6)))
            counts.append(ranks)
            if say is not None:
                say(
                    f"tune {k + 1}/{len(plans)}: {plan.label()}: predicted "
                    f"{plan.predicted_step_s * 1e3:.1f} ms, measured {measured * 1e3:.1f} ms"
                )
            off = far_off(f"{k + 1} ({plan.label()})", plan.predicted_step_s, measured)
            if off is not None:
                warning(off)
            if best is None or measured < best[0]:
                best = (measured, candidate, k)
    assert best is not None
    model_key = str(record.cost_model.get("model_key") or "")
    for ranks in sorted(set(counts)):
        ratios = [
            r.measured_step_s / r.predicted_step_s
            for r, k in zip(rows, counts)
            if k == ranks and r.predicted_step_s
        ]
        if ratios:
            remember_scale(ranks, statistics.median(ratios), model_key)
    measured, chosen, k = best
    return replace(chosen, plan=record.retuned(k, tuple(rows), measured))


def far_off(plan: str, predicted_s: float, measured_s: float) -> str | None:
    """The warning for ``plan`` when its measured step is more than ``FAR`` times its
    predicted one or less than 1/``FAR`` of it (None: closer, or nothing predicted)."""
    if predicted_s <= 0 or measured_s <= 0:
        return None
    ratio = measured_s / predicted_s
    if 1 / FAR <= ratio <= FAR:
        return None
    more = f"{ratio:.1f}x more" if ratio > 1 else f"{1 / ratio:.1f}x less"
    return (
        f"--tune: plan {plan} was predicted at {predicted_s * 1e3:.1f} ms a step but measured "
        f"{measured_s * 1e3:.1f} ms, {more} than predicted: the machine's calibration is "
        "likely off (one measured on a busy machine?). See it with `pipecompile calibration`; "
        "clear it with `pipecompile calibration --clear` and search again on a quiet machine"
    )


def measure_step(directory: Path, ranks: int, steps: int) -> float:
    """The median seconds of a training step of ``directory`` after the first: on ``ranks``
    ranks launched from this process when more than one, else by ``pipecompile run`` in a
    subprocess (the local run a user would start)."""
    metrics = directory / "tune-metrics.jsonl"
    flags = ["--steps", str(steps), "--metrics", str(metrics), "-q"]
    if ranks > 1:
        from pipecompile.options.run import RunFlags, TrainFlags
        from pipecompile.runtime.distributed.launch import launch
        from pipecompile.runtime.job.run import RunJob

        train = TrainFlags(steps=steps, metrics=str(metrics), quiet=True)
        job = RunJob.build(directory, RunFlags(nproc=ranks), train)
        if launch(job) != 0:  # the ranks' errors are on stderr
            raise PlanError(f"--tune: running {directory.name} on {ranks} ranks failed")
    else:
        argv = [sys.executable, "-m", "pipecompile", "run", str(directory), *flags]
        done = subprocess.run(argv, capture_output=True, text=True, env=os.environ.copy())
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise PlanError(f"--tune: running {directory.name} failed: {last}")
    lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    times = [r["step_ms"] / 1e3 for r in lines if r.get("kind") == "train"]
    if not times:
        raise PlanError(f"--tune: running {directory.name} recorded no step")
    return statistics.median(times[1:] or times)
