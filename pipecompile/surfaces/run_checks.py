"""`pipecompile run`'s options checked against each other, the emitted directory and the
mesh, before anything runs or any rank starts. Each option's declaration says what it needs
and what `--check` or `--nproc` cannot honour (``runtime.option_fields.Option``); the
refusals here read it."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pipecompile.errors import PipecompileError
from pipecompile.ir.manifest import Manifest
from pipecompile.ir.program import Program
from pipecompile.options.fields import HONOURED, declared, flag_of, from_args
from pipecompile.options.run import RunFlags, TrainFlags, for_loop, given
from pipecompile.runtime.distributed.placement import Placement
from pipecompile.runtime.faults import FAULT_ENV, parse_faults
from pipecompile.runtime.load import Emitted
from pipecompile.runtime.notes import note
from pipecompile.schedules import ORDER, REGISTRY, SYNCHRONOUS, listed

__all__ = ["check_run_options", "check_mesh", "check_fully_sharded"]


def check_run_options(args: argparse.Namespace, emitted: Emitted) -> None:
    """Options that contradict each other or the directory, refused before anything runs
    (``args`` as parsed: an option not given is still None)."""
    run, train = from_args(RunFlags, args), from_args(TrainFlags, args)
    directory = emitted.directory
    loop = for_loop(train, directory)  # the training flags as the loop will take them
    from pipecompile.codegen.output_dir import inside
    from pipecompile.runtime.training.train_state import latest_step_dir, read_meta

    if train.save_every and not train.save:
        raise PipecompileError("--save-every needs --save DIR (where to write the train state)")
    _check_faults()
    on_gpus = _uses_cuda(run)  # also refuses --device cuda with too few GPUs
    if train.precision == "fp16" and not on_gpus:
        raise PipecompileError(
            "--precision fp16 needs a GPU (run --nproc N --device cuda): on the CPU, use "
            "--precision bf16"
        )
    _check_program_options(run, train, loop, emitted)
    if run.max_restarts and not train.save:
        raise PipecompileError(
            f"--max-restarts {run.max_restarts} needs --save DIR: a restart resumes from the "
            "newest step saved there (add --save-every N to lose at most N steps a failure)"
        )
    if train.save and inside(Path(train.save), directory):
        raise PipecompileError(
            f"--save {train.save} lies inside {directory}, which a recompile replaces; "
            f"save beside it instead, e.g. --save {directory.resolve()}-train-state"
        )
    if train.resume:
        step = read_meta(latest_step_dir(Path(train.resume)))["step"]
        if train.steps is None and train.epochs is None:
            raise PipecompileError(
                f"--resume {train.resume}: the saved step is {step}, and without --steps "
                f"the run has nothing more to do; pass --steps greater than {step}"
            )
        if train.steps is not None and step >= train.steps:
            raise PipecompileError(
                f"--resume {train.resume} continues after step {step}, but --steps {train.steps} "
                f"ends there; pass --steps greater than {step}"
            )
    if not run.check:
        _check_run_places(train, loop)


def _check_run_places(train: TrainFlags, loop: TrainFlags) -> None:
    """Where the run writes (--save, --metrics), checked before it starts."""
    from pipecompile.runtime.training.loop_options import check_places

    if train.force and not train.save:
        raise PipecompileError("--force lets --save replace another run's train state; drop it")
    replaced = check_places(loop, force=train.force)
    if replaced:
        note(replaced)


def _uses_cuda(run: RunFlags) -> bool:
    """Whether the run's stages would be on a GPU (only `--nproc` places them there); refuses
    --device cuda with fewer GPUs than ranks before any rank starts."""
    from pipecompile.runtime.distributed.gpus import device_kind

    if not run.nproc:
        return False
    return device_kind(run.device or "auto", run.nproc) == "cuda"


def _check_program_options(
    run: RunFlags, train: TrainFlags, loop: TrainFlags, emitted: Emitted
) -> None:
    """Options this run would ignore, and training options the program's schedule cannot
    honour (see training.check_options)."""
    from pipecompile.runtime.training.loop_options import check_options

    _refuse_ignored(run, train)
    check_options(loop, emitted.program)


def _is_not_given(value: object) -> bool:
    return value is None or value is False  # 0 and 0.0 are given values


def _refuse_ignored(run: RunFlags, train: TrainFlags) -> None:
    """Options given that this run would accept and ignore, refused with the reason: each
    option's declaration says which mode it needs (``needs``) and what `--check` or
    `--nproc` cannot honour (``under_check``, ``under_nproc``)."""
    run_given = [o for f, o in declared(RunFlags) if not _is_not_given(getattr(run, f.name))]
    for o in run_given:
        if o.needs and not getattr(run, o.needs):
            mode = flag_of(RunFlags, o.needs)
            raise PipecompileError(f"{o.flag} {o.needs_why}; drop {o.flag}, or add {mode}")
    for o in run_given if run.nproc else ():
        if o.under_nproc:
            raise PipecompileError(f"{o.flag} {o.under_nproc}; drop it with --nproc")
    if not run.check:
        return
    # why `run --check` (one fp32 step of the compiled weights on the example batch, against
    # the eager model) cannot honour an option: each option's declaration says
    why = {f.name: o.under_check for f, o in declared(TrainFlags) if o.under_check != HONOURED}
    cannot = [(flag, why[name]) for flag, name in given(train) if name in why]
    cannot += [(o.flag, o.under_check) for o in run_given if o.under_check]
    if cannot:
        listed = "; ".join(f"{flag}: {why}" for flag, why in cannot)
        them = "it" if len(cannot) == 1 else "them"
        raise PipecompileError(
            f"--check runs one fp32 step of the compiled weights on the example batch against "
            f"the eager model and cannot honour {listed}; drop {them}, or train without --check"
        )


def check_mesh(run: RunFlags, program: Program, width: int) -> None:
    """--dp and --shard, refused where they cannot run (before any rank starts)."""
    if run.dp > 1 and run.nproc % run.dp:
        raise PipecompileError(
            f"--dp {run.dp} does not divide --nproc {run.nproc}: each of the {run.dp} copies "
            f"of the pipeline needs {width} ranks; run --nproc {width * run.dp}"
        )
    if run.dp > 1 and program.asynchronous:
        synchronous = listed(o for o in ORDER if o in SYNCHRONOUS)
        raise PipecompileError(
            f"--dp {run.dp} needs a synchronous schedule: {program.schedule} updates the weights "
            "after each micro-batch, before the copies could average their gradients; compile "
            f"with a synchronous schedule (--schedule {synchronous})"
        )
    if run.dp > 1 and run.check:
        raise PipecompileError(
            "--check compares one pipeline with the eager model; drop --dp (the copies run "
            "the same program)"
        )
    if run.shard is None:
        return
    if run.dp == 1:
        raise PipecompileError(
            f"--shard {run.shard} shards across the data-parallel copies, and there is one; "
            "add --dp D (D copies), or drop --shard"
        )


def check_fully_sharded(
    run: RunFlags, train: TrainFlags, program: Program, placement: Placement, manifest: Manifest
) -> None:
    """--shard grads|params: the stages run under FSDP2, which owns each stage's backward
    and gradients; what it cannot run with is refused before any rank starts."""
    from pipecompile.ir.instr import Op
    from pipecompile.runtime.torch_compiled import resolve_backend

    flag = f"--shard {run.shard}"
    if any(instr.op in (Op.I, Op.W) for _, _, instr in program.instructions()):
        raise PipecompileError(
            f"{flag}: {program.schedule} splits each backward in two (I and W), and FSDP "
            "reduces a stage's gradients in one backward; compile with --schedule "
            f"{listed(n for n, s in REGISTRY.items() if s.synchronous and not s.split_backward)}, "
            "or use --shard optimizer"
        )
    if placement.world != len(program.devices):
        raise PipecompileError(
            f"{flag}: the program replicates stages (--replicate, replicas "
            f"{list(placement.device_replicas)}), whose sums FSDP does not make; compile "
            "without --replicate and add copies with --dp, or use --shard optimizer"
        )
    if resolve_backend(train.compile, manifest.compile) is not None:
        raise PipecompileError(
            f"{flag}: the stages' forwards run through torch.compile, which pipecompile does "
            "not combine with FSDP; add --compile off, or use --shard optimizer"
        )


def _check_faults() -> None:
    """A ``PIPECOMPILE_FAULT`` the ranks could not read, refused before they start."""
    try:
        parse_faults(os.environ.get(FAULT_ENV, ""))
    except ValueError as err:
        raise PipecompileError(str(err)) from None
