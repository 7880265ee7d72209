"""`pipecompile run`: its job built and checked (``RunJob.build``, as every door builds it),
then the run here (training, or ``--check`` against the eager model) or its ranks launched
(``--nproc``), each rank building the same job again from the launcher's record."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pipecompile.files.held import holding
from pipecompile.ir.graph.noise_floor import Tolerance
from pipecompile.model.model_file import ModelSpec
from pipecompile.options.fields import from_args
from pipecompile.options.run import RunFlags, TrainFlags
from pipecompile.runtime.check.batch_shapes import check_shapes
from pipecompile.runtime.job.run import RunJob
from pipecompile.runtime.process.notes import note

__all__ = ["run_directory"]


def run_directory(args: argparse.Namespace) -> int:
    """`pipecompile run DIRECTORY`: train (or ``--check``) here, or launch the ranks of
    ``--nproc``; returns the exit status."""
    if args.nproc and args.command_line:  # before anything runs a torch op in this process
        from pipecompile.runtime.distributed.local_ranks import fork_a_starter

        fork_a_starter()
    given = vars(args)
    run_flags, train_flags = from_args(RunFlags, given), from_args(TrainFlags, given)
    job = RunJob.build(Path(args.directory), run_flags, train_flags)
    replaced = job.check_places()
    if replaced:
        note(replaced)
    if job.train.save is None or job.run.check:
        return _run_here(job)
    with holding(Path(job.train.save)):  # one run at a time saves there
        return _run_here(job)


def _run_here(job: RunJob) -> int:
    """The run, checked: launched (``--nproc``), checked or trained here."""
    from pipecompile.runtime.pipeline import Pipeline
    from pipecompile.runtime.process.threads import use_threads

    if job.ranks:
        return _launch(job)
    use_threads(job.run.threads)
    spec = job.model_file()  # only --check builds the model: its eager reference
    pipe = Pipeline.opened(job.emitted)
    if job.run.check:
        return _check(job, pipe, spec)
    status = _train(pipe, spec, job)
    if status == 0 and job.run.stats and pipe.last is not None:
        from pipecompile.reports.stats_table import stats_table

        print(stats_table(pipe, job.directory, job.run.program))
    return status


def _train(pipe: Any, spec: ModelSpec, job: RunJob) -> int:
    from pipecompile.model.data_hooks import EVAL, batch_source, example_source
    from pipecompile.runtime.process.interrupt import EXIT_INTERRUPTED, interrupted_line, user_stop
    from pipecompile.runtime.training.loop import TrainState, train
    from pipecompile.runtime.training.train_state import remove_partial

    assert spec.loss_fn is not None  # run_model saw to it
    options = job.train
    data = batch_source(spec) or example_source(spec)
    options.measure_memory = True
    state = TrainState()
    try:
        train(pipe, spec.loss_fn, data, options, eval_data=batch_source(spec, EVAL), state=state)
    except (KeyboardInterrupt, Exception) as err:  # Ctrl-C or SIGTERM (main turns it into one)
        # or an error raised while one was handled (a save's writer, stopped mid-write,
        # failing again as it closes its file): the stop is still the user's
        if not isinstance(err, KeyboardInterrupt) and user_stop(err) is None:
            raise
        if options.save is not None:  # a stop between a save's first steps leaves them too
            remove_partial(Path(options.save))
        print(interrupted_line(state.done, state.total, options.save), file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def _check(job: RunJob, pipe: Any, spec: ModelSpec) -> int:
    """`run --check`: one step against the eager model, on each batch shape."""
    from pipecompile.runtime.check.eager import check_against_eager

    assert spec.model is not None  # built for --check
    pipe.compile_stages(job.train.compile)
    flags = job.run

    def compare(shaped: ModelSpec) -> Any:
        return check_against_eager(
            pipe, shaped, lr=job.train.lr, tolerance=Tolerance(flags.atol, flags.rtol)
        )

    check_shapes(spec, pipe, flags.batch_shapes, compare)
    return 0


def _launch(job: RunJob) -> int:
    """``--nproc N``: N ranks started, each with the job's record."""
    from pipecompile.runtime.distributed.restarts import launch_restarting

    return launch_restarting(job)
