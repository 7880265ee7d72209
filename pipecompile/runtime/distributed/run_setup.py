"""What a run sets up the same way in `pipecompile run` and on each rank of `run --nproc`:
its flags settled, its model file (with the loss a run needs), the ranks its program asks
for, and `--check`'s pass over the batch shapes."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipecompile.errors import CheckError, ModelFileError, PipecompileError
from pipecompile.model.model_file import ModelSpec, recorded_model
from pipecompile.options.fields import from_args, settled
from pipecompile.options.run import RunFlags, TrainFlags, for_loop
from pipecompile.runtime.distributed.placement import Placement
from pipecompile.runtime.load import Emitted

__all__ = ["run_flags", "run_model", "check_world", "check_shapes"]


def run_flags(args: argparse.Namespace, directory: Path) -> tuple[RunFlags, TrainFlags]:
    """The run's own flags in ``args``, each one not given settled to its default, and its
    training flags as the loop takes them (``for_loop``)."""
    return settled(from_args(RunFlags, args)), for_loop(from_args(TrainFlags, args), directory)


def run_model(flags: RunFlags, emitted: Emitted) -> ModelSpec:
    """The model file the run uses (``--model``, else the one the manifest records; the
    model itself built only for ``--check``'s eager reference).

    Raises:
        ModelFileError: the file has no ``loss_fn`` (or, for ``--check``, no
            ``example_targets``), or it is not the one compiled (unless ``--allow-stale``).
    """
    spec = recorded_model(
        flags.model,
        emitted.directory,
        emitted.manifest,
        allow_stale=bool(flags.allow_stale),
        build=bool(flags.check),
    )
    if spec.loss_fn is None:
        raise ModelFileError(f"{spec.path} needs loss_fn(output, *targets) for `run`")
    if flags.check and spec.targets is None:
        raise ModelFileError(f"{spec.path} needs example_targets() for `run --check`")
    return spec


def check_world(placement: Placement, copies: int, world: int, *, started: bool) -> None:
    """Refuse ``world`` ranks for a program that runs on ``placement.world`` ranks per copy
    and ``copies`` copies (``started``: the ranks exist, a launcher started them; else
    ``--nproc`` asked for them and none has started).

    Raises:
        PipecompileError: naming the ranks the program needs and the command to give.
    """
    need = placement.world * copies
    if world == need:
        return
    devices = len(placement.device_replicas)
    runs = f"runs on {devices} devices with replicas {list(placement.device_replicas)}"
    if not started:
        of = f" (--dp {copies} copies of {placement.world})" if copies > 1 else ""
        raise PipecompileError(
            f"--nproc {world}: the program {runs}, {placement.world} ranks; run --nproc {need}{of}"
        )
    per_copy = f" per copy, {copies} copies (--dp {copies})" if copies > 1 else ""
    raise PipecompileError(
        f"the program {runs}, {placement.world} ranks{per_copy}, but {world} were started; "
        f"start {need} (`pipecompile run --nproc {need}`, or torchrun with that many ranks "
        "in all)"
    )


def check_shapes(
    spec: ModelSpec,
    pipe: Any,
    batch_shapes: str | None,
    compare: Callable[[ModelSpec], Any],
    *,
    show: bool = True,
    what: str = "pipelined results differ from the eager model",
) -> None:
    """`run --check`: ``compare`` (one step against the eager model, giving a report with
    ``ok``) on the example and on each ``--batch-shapes`` shape, each report printed when
    ``show`` (rank 0 of a distributed run).

    Raises:
        CheckError: a shape's results differ (the reports above say where).
    """
    from pipecompile.runtime.check.batch_shapes import checked_shapes

    ok = True
    for label, shaped in checked_shapes(spec, pipe, batch_shapes):
        report = compare(shaped)
        if show:
            print(f"{label}\n{report}" if label else report)
        ok = ok and report.ok
    if show and not ok:
        raise CheckError(f"{what} (see above)")
