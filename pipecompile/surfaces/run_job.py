"""One `pipecompile run`: its options checked, then the run here (training, or ``--check``
against the eager model) or its ranks launched (``--nproc``); each rank sets itself up with
the same ``runtime.distributed.run_setup``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pipecompile.files.held import holding
from pipecompile.model.model_file import ModelSpec
from pipecompile.options.fields import to_argv
from pipecompile.options.run import RunFlags, TrainFlags
from pipecompile.runtime.distributed.run_setup import (
    check_shapes,
    check_world,
    run_flags,
    run_model,
)
from pipecompile.runtime.load import Emitted
from pipecompile.surfaces.run_checks import check_fully_sharded, check_mesh, check_run_options

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """`pipecompile run DIRECTORY`: train (or ``--check``) here, or launch the ranks of
    ``--nproc``; returns the exit status."""
    if args.nproc and args.command_line:  # before anything runs a torch op in this process
        from pipecompile.runtime.distributed.local_ranks import fork_a_starter

        fork_a_starter()
    from pipecompile.runtime.load import open_emitted

    emitted = open_emitted(Path(args.directory), args.program)
    check_run_options(args, emitted)
    # None until here, where what was given is known: each option not given takes its default
    flags, options = run_flags(args, emitted.directory)
    if options.save is None or flags.check:
        return _run_here(flags, options, emitted)
    with holding(Path(options.save)):  # one run at a time saves there
        return _run_here(flags, options, emitted)


def _run_here(flags: RunFlags, options: TrainFlags, emitted: Emitted) -> int:
    """The run, its options settled: launched (``--nproc``), checked or trained here."""
    from pipecompile.runtime.pipeline import Pipeline
    from pipecompile.runtime.threads import use_threads

    if flags.nproc:
        return _launch(flags, options, emitted)
    use_threads(flags.threads)
    spec = run_model(flags, emitted)  # only --check builds the model: its eager reference
    pipe = Pipeline.opened(emitted)
    if flags.check:
        return _check(flags, options, pipe, spec)
    status = _train(pipe, spec, options)
    if status == 0 and flags.stats and pipe.last is not None:
        from pipecompile.reports.stats_table import stats_table

        print(stats_table(pipe, emitted.directory, flags.program))
    return status


def _train(pipe: Any, spec: ModelSpec, options: TrainFlags) -> int:
    from pipecompile.model.data_hooks import EVAL, batch_source, example_source
    from pipecompile.runtime.interrupt import EXIT_INTERRUPTED, interrupted_line, user_stop
    from pipecompile.runtime.training.loop import TrainState, train
    from pipecompile.runtime.training.train_state import remove_partial

    assert spec.loss_fn is not None  # run_model saw to it
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


def _check(flags: RunFlags, options: TrainFlags, pipe: Any, spec: ModelSpec) -> int:
    """`run --check`: one step against the eager model, on each batch shape."""
    from pipecompile.runtime.check.eager import check_against_eager

    assert spec.model is not None  # built for --check
    pipe.compile_stages(options.compile)

    def compare(shaped: ModelSpec) -> Any:
        return check_against_eager(pipe, shaped, lr=options.lr, atol=flags.atol, rtol=flags.rtol)

    check_shapes(spec, pipe, flags.batch_shapes, compare)
    return 0


def _launch(flags: RunFlags, options: TrainFlags, emitted: Emitted) -> int:
    """``--nproc N``: the mesh checked, then N ranks started with the run's options."""
    from pipecompile.runtime.distributed.placement import Placement
    from pipecompile.runtime.distributed.restarts import launch_restarting

    directory, manifest, program = emitted
    assert flags.nproc is not None and flags.dp is not None
    placement = Placement.from_manifest(manifest, program.stage_device)
    check_mesh(flags, program, placement.world)
    if flags.shard in ("grads", "params"):
        check_fully_sharded(flags, options, program, placement, manifest)
    check_world(placement, flags.dp, flags.nproc, started=False)  # before any rank starts
    ranks = to_argv(flags) + to_argv(options)  # --metrics: DIRECTORY/metrics.jsonl by default
    save = Path(options.save) if options.save else None
    return launch_restarting(
        flags.nproc,
        [str(directory), *ranks],
        save=save,
        max_restarts=flags.max_restarts or 0,
        metrics=options.metrics,  # type: ignore[arg-type]
    )
