"""One run as one value: ``RunJob.build`` opens the compiled directory, makes every refusal the
options declare (their combinations, `--check`, the mesh and sharding, the ranks, the faults)
and settles what was not given. Every door builds it this way: `pipecompile run` (here or
before it launches ranks), ``fit()``, the tuner, each rank forked by `run --nproc` (from the
launcher's ``record()``) and each rank under torchrun (from its own argv, ``from_argv``), so
a combination refused at one door is refused at all of them, and every rank checks what it
runs before its process group forms.

Example:
    >>> job = RunJob.build(Path("out"), RunFlags(nproc=2), TrainFlags(steps=4))  # doctest: +SKIP
    >>> job.run.timeout, job.train.steps                                         # doctest: +SKIP
    (60.0, 4)
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipecompile.errors import ModelFileError, PipecompileError
from pipecompile.model.kv_cache import drop_kv_cache
from pipecompile.model.model_file import ModelSpec, check_fresh, recorded_model
from pipecompile.options.fields import (
    add_options,
    check_values,
    from_args,
    from_record,
    settled,
    to_record,
)
from pipecompile.options.run import RunFlags, TrainFlags, for_loop
from pipecompile.runtime.job.fault_checks import RunShape, check_faults
from pipecompile.runtime.job.placement import Placement
from pipecompile.runtime.job.refusals import (
    check_batch_split,
    check_fully_sharded,
    check_mesh,
    check_resume,
    check_run_options,
    check_world,
)
from pipecompile.runtime.load import Emitted, open_emitted
from pipecompile.runtime.process.faults import Fault, read_faults

__all__ = ["RunJob", "rank_parser"]

WORKER = "python -m pipecompile.runtime.distributed.worker"


@dataclass(frozen=True)
class RunJob:
    """A run, checked: the compiled directory it runs, the options as given (``asked_*``: None
    where not given, what a rank rebuilds the job from) and as they run (``run`` settled,
    ``train`` as the training loop takes them), where its ranks run, its faults and the step
    a resumed run continues after."""

    emitted: Emitted
    asked_run: RunFlags
    asked_train: TrainFlags
    run: RunFlags
    train: TrainFlags
    placement: Placement
    faults: tuple[Fault, ...] = ()
    resumed: int | None = None
    restarted: bool = False  # resumed by a restart, not by the user's --resume
    started: int | None = None  # the ranks a launcher started, built by one of them
    local_ranks: int | None = None  # those of them on this machine

    @property
    def directory(self) -> Path:
        return self.emitted.directory

    @property
    def ranks(self) -> int | None:
        """The run's ranks (``--nproc``, or those a launcher started); None: one process."""
        return self.run.nproc

    @classmethod
    def build(
        cls,
        directory: Path | Emitted,
        run: RunFlags | None = None,
        train: TrainFlags | None = None,
        *,
        started: int | None = None,
        local_ranks: int | None = None,
        restarted: bool = False,
        default_metrics: bool = True,
    ) -> RunJob:
        """The run of ``directory`` (or its opened ``Emitted``) with ``run`` and ``train`` as
        given (None: not given), every refusal made.

        Args:
            started: the ranks a launcher started, when this process is one of them (they
                count as ``--nproc``); None where the run has not started.
            local_ranks: the ranks on this machine (default: all of them).
            restarted: its ``--resume`` is a restart's (the faults of the steps before it
                have fired already), not the user's.
            default_metrics: write the steps to DIRECTORY/metrics.jsonl when ``--metrics``
                is not given (as `run` does; ``fit()`` records them only where asked).

        Raises:
            PipecompileError: a subclass naming the option, the value and what to do.
        """
        run, train = run or RunFlags(), train or TrainFlags()
        for given in (run, train):  # a keyword's value, checked as its flag's text would be
            try:
                check_values(given)
            except ValueError as err:
                raise PipecompileError(str(err)) from None
        asked = run
        if started is not None:
            run = dataclasses.replace(run, nproc=started)
        emitted = (
            directory
            if isinstance(directory, Emitted)
            else open_emitted(Path(directory), run.program)
        )
        if not run.model and not run.allow_stale:  # the stages are still the model file's
            check_fresh(emitted.directory, emitted.manifest)
        loop = for_loop(train, emitted.directory if default_metrics else None)
        check_run_options(run, train, loop, emitted, local_ranks=local_ranks or run.nproc or 1)
        resumed = check_resume(train)
        settled_run = settled(run)
        check_batch_split(settled_run, loop, emitted)
        placement = Placement.from_manifest(emitted.manifest, emitted.program.stage_device)
        if run.nproc:
            check_mesh(settled_run, emitted.program, placement.world)
            check_fully_sharded(settled_run, loop, emitted.program, placement, emitted.manifest)
            copies = settled_run.dp or 1
            check_world(placement, copies, run.nproc, started=started is not None)
        faults = read_faults()
        shape = _shape(emitted, placement, run.nproc, loop, None if restarted else resumed)
        check_faults(faults, shape)
        return cls(
            emitted,
            asked,
            train,
            settled_run,
            loop,
            placement,
            faults,
            resumed,
            restarted,
            started,
            local_ranks,
        )

    @classmethod
    def from_record(
        cls, record: dict[str, Any], *, started: int, local_ranks: int | None = None
    ) -> RunJob:
        """The job a launcher's ``record()`` describes, built again (and so checked again) by
        one of the ``started`` ranks it launched."""
        run = from_record(RunFlags, record["run"])
        train = from_record(TrainFlags, record["train"])
        directory = Path(record["directory"])
        restarted = bool(record.get("restarted"))
        return cls.build(
            directory, run, train, started=started, local_ranks=local_ranks, restarted=restarted
        )

    @classmethod
    def from_argv(
        cls,
        argv: list[str],
        *,
        nproc: int | None = None,
        started: int | None = None,
        local_ranks: int | None = None,
    ) -> RunJob:
        """The job of a rank's command line (``DIRECTORY [options]``, as torchrun starts the
        worker; ``nproc``: as `run --nproc` adds), built and checked as `pipecompile run`
        builds it."""
        parsed = vars(rank_parser().parse_args(argv))
        run, train = from_args(RunFlags, parsed), from_args(TrainFlags, parsed)
        run = dataclasses.replace(run, nproc=nproc) if nproc is not None else run
        return cls.build(
            Path(parsed["directory"]), run, train, started=started, local_ranks=local_ranks
        )

    def model_file(self) -> ModelSpec:
        """The model file the run uses (``--model``, else the one the manifest records, which
        ``build`` found fresh; the model itself built only for ``--check``'s eager reference).

        Raises:
            ModelFileError: the file has no ``loss_fn`` (or, for ``--check``, no
                ``example_targets``).
        """
        flags, emitted = self.run, self.emitted
        spec = recorded_model(
            flags.model,
            emitted.directory,
            emitted.manifest,
            allow_stale=True,  # build() found the file fresh (or --allow-stale took it)
            build=bool(flags.check),
        )
        if spec.loss_fn is None:
            raise ModelFileError(f"{spec.path} needs loss_fn(output, *targets) for `run`")
        if flags.check and spec.targets is None:
            raise ModelFileError(f"{spec.path} needs example_targets() for `run --check`")
        if spec.model is not None:  # the eager reference returns what the stages return
            drop_kv_cache(spec.model)
        return spec

    def record(self) -> dict[str, Any]:
        """What each rank rebuilds this job from (JSON): the directory and the options given
        that the ranks take, paths made absolute (a rank may start elsewhere)."""
        return {
            "directory": str(self.directory.resolve()),
            "run": to_record(self.asked_run),
            "train": to_record(self.asked_train),
            "restarted": self.restarted,
        }

    def resuming(self, save: Path) -> RunJob:
        """This job resuming from the newest step in ``save`` after a restart, checked again."""
        train = dataclasses.replace(self.asked_train, resume=str(save))
        return RunJob.build(
            self.emitted,
            self.asked_run,
            train,
            started=self.started,
            local_ranks=self.local_ranks,
            restarted=True,
        )

    def with_threads(self, threads: int) -> RunJob:
        """This job with ``--threads threads`` where it gives none (each rank's share)."""
        if self.asked_run.threads:
            return self
        return dataclasses.replace(
            self,
            asked_run=dataclasses.replace(self.asked_run, threads=threads),
            run=dataclasses.replace(self.run, threads=threads),
        )

    def check_places(self, *, force_flag: str = "--force") -> str | None:
        """Where the run writes (``--save``, ``--metrics``, ``--trace``), checked before it
        trains by the one process that owns the writing (`pipecompile run`, ``fit()``, rank 0
        under torchrun); returns the note of what ``--force`` lets the save replace."""
        from pipecompile.runtime.training.loop_options import check_places

        if self.run.check:
            return None
        return check_places(self.train, force=self.train.force, force_flag=force_flag)


def rank_parser() -> argparse.ArgumentParser:
    """A rank's command line: the directory and the options `run --nproc` gives its ranks
    (declared in ``options.run``)."""
    parser = argparse.ArgumentParser(prog=WORKER)
    parser.add_argument("directory", help="a directory written by `pipecompile MODEL -o DIR`")
    add_options(parser, RunFlags, forwarded=True)
    add_options(parser, TrainFlags)
    return parser


def _shape(
    emitted: Emitted,
    placement: Placement,
    ranks: int | None,
    loop: TrainFlags,
    resumed: int | None,
) -> RunShape:
    """Where the run's faults can fire (its last step where the options fix it: --steps, or
    1 without --epochs)."""
    steps = loop.steps if loop.steps is not None else (1 if loop.epochs is None else None)
    return RunShape(
        emitted.program, placement, ranks, loop.save is not None, loop.save_every, steps, resumed
    )
