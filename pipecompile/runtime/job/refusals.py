"""A run's options checked against each other, the emitted directory and the mesh: every
refusal ``RunJob.build`` makes, on whichever door built it (`pipecompile run`, ``fit()``, a
rank under torchrun or the rank starter). Each option's declaration says what it needs and
what `--check` or the ranks cannot honour (``options.fields.Option``); the refusals here read
it. All of them are pure functions of the options, the directory and the rank counts, so
every rank reaches the same verdict before its process group forms."""

from __future__ import annotations

from pathlib import Path

from pipecompile.errors import PipecompileError
from pipecompile.files.writable import inside
from pipecompile.ir.programs.program import Program
from pipecompile.ir.records.batch_coupling import mixes
from pipecompile.ir.records.manifest import Manifest
from pipecompile.options.fields import HONOURED, declared, flag_of
from pipecompile.options.run import RunFlags, TrainFlags, given
from pipecompile.runtime.job.gpus import device_kind
from pipecompile.runtime.job.placement import Placement
from pipecompile.runtime.load import Emitted
from pipecompile.schedules import ORDER, REGISTRY, SYNCHRONOUS, listed

__all__ = [
    "check_run_options",
    "check_resume",
    "check_mesh",
    "check_fully_sharded",
    "check_world",
    "check_batch_split",
]


def check_run_options(
    run: RunFlags, train: TrainFlags, loop: TrainFlags, emitted: Emitted, *, local_ranks: int
) -> None:
    """Options that contradict each other or the directory (``run`` and ``train`` as given:
    an option not given is still None; ``loop``: the training options as the loop takes
    them). ``run.nproc``: the ranks (those a launcher started, for a rank); ``local_ranks``:
    those of them on this machine."""
    from pipecompile.runtime.training.loop_options import check_train_options

    if train.save_every and not train.save:
        raise PipecompileError("--save-every needs --save DIR (where to write the train state)")
    on_gpus = bool(run.nproc) and device_kind(run.device or "auto", local_ranks) == "cuda"
    if train.precision == "fp16" and not on_gpus:
        raise PipecompileError(
            "--precision fp16 needs a GPU (run --nproc N --device cuda): on the CPU, use "
            "--precision bf16"
        )
    _refuse_ignored(run, train)
    check_train_options(loop, emitted.program)
    if run.max_restarts and not train.save:
        raise PipecompileError(
            f"--max-restarts {run.max_restarts} needs --save DIR: a restart resumes from the "
            "newest step saved there (add --save-every N to lose at most N steps a failure)"
        )
    if train.save and inside(Path(train.save), emitted.directory):
        raise PipecompileError(
            f"--save {train.save} lies inside {emitted.directory}, which a recompile replaces; "
            f"save beside it instead, e.g. --save {emitted.directory.resolve()}-train-state"
        )
    if train.force and not train.save and not run.check:
        raise PipecompileError("--force lets --save replace another run's train state; drop it")


def check_resume(train: TrainFlags) -> int | None:
    """The step ``--resume`` continues after (None without it), refused where the run would
    then have nothing to do."""
    from pipecompile.runtime.training.train_state import latest_step_dir, read_meta

    if not train.resume:
        return None
    step = int(read_meta(latest_step_dir(Path(train.resume)))["step"])
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
    return step


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
        said = "; ".join(f"{flag}: {why}" for flag, why in cannot)
        them = "it" if len(cannot) == 1 else "them"
        raise PipecompileError(
            f"--check runs one fp32 step of the compiled weights on the example batch against "
            f"the eager model and cannot honour {said}; drop {them}, or train without --check"
        )


def check_mesh(run: RunFlags, program: Program, width: int) -> None:
    """--dp and --shard, refused where they cannot run (``run.nproc``: the ranks)."""
    dp = run.dp or 1
    if dp > 1 and (run.nproc or 0) % dp:
        raise PipecompileError(
            f"--dp {dp} does not divide --nproc {run.nproc}: each of the {dp} copies "
            f"of the pipeline needs {width} ranks; run --nproc {width * dp}"
        )
    if dp > 1 and program.asynchronous:
        synchronous = listed(o for o in ORDER if o in SYNCHRONOUS)
        raise PipecompileError(
            f"--dp {dp} needs a synchronous schedule: {program.schedule} updates the weights "
            "after each micro-batch, before the copies could average their gradients; compile "
            f"with a synchronous schedule (--schedule {synchronous})"
        )
    if dp > 1 and run.check:
        raise PipecompileError(
            "--check compares one pipeline with the eager model; drop --dp (the copies run "
            "the same program)"
        )
    if run.shard is not None and dp == 1:
        raise PipecompileError(
            f"--shard {run.shard} shards across the data-parallel copies, and there is one; "
            "add --dp D (D copies), or drop --shard"
        )


def check_fully_sharded(
    run: RunFlags, train: TrainFlags, program: Program, placement: Placement, manifest: Manifest
) -> None:
    """--shard grads|params: the stages run under FSDP2, which owns each stage's backward
    and gradients; what it cannot run with is refused."""
    from pipecompile.ir.programs.instr import Op
    from pipecompile.runtime.torch_compiled import resolve_backend

    if run.shard not in ("grads", "params"):
        return
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


def check_batch_split(run: RunFlags, loop: TrainFlags, emitted: Emitted) -> None:
    """A model that mixes the samples of its batch (the manifest's ``batch_coupling``) run
    with its batch split: by ``--dp`` copies, ``--accumulate`` parts, or a program of several
    micro-batches (``--program``). Each part would mix only its own samples, and training
    would follow another objective than the model's. The ``--dp`` copies of a loss over the
    whole batch or a tail cut off gather their values instead (not under ``--shard``)."""
    mixing = mixes(emitted.manifest.batch_coupling or ())
    if not mixing:
        return
    tail = emitted.manifest.tail is not None  # a tail cut off: it runs on the whole batch
    # the copies of --dp gather their values for a loss over the whole batch or a tail cut
    # off (runtime/state/whole_loss); FSDP's average and replays do not
    gathered = all(c.kind == "loss" or (c.kind == "tail" and tail) for c in mixing)
    if gathered and run.dp is not None and run.dp > 1 and run.shard is not None:
        raise PipecompileError(
            f"--shard {run.shard}: {mixing[0].op} mixes the samples of the batch, and the "
            f"--dp copies gather their values to compute it on the global batch, which FSDP's "
            "replay of a batch at weight 0 (a copy the data left without one) would join; "
            "run --dp without --shard"
        )
    splits = [
        (f"--dp {run.dp}", run.dp is not None and run.dp > 1 and not gathered),
        (f"--accumulate {loop.accumulate}", loop.accumulate > 1),
        (  # a loss over the whole batch or a tail joins every micro-batch's outputs
            f"a program of {emitted.program.microbatches} micro-batches",
            emitted.program.microbatches > 1
            and any(c.kind == "middle" or (c.kind == "tail" and not tail) for c in mixing),
        ),
    ]
    split = next((what for what, yes in splits if yes), None)
    if split is not None:
        raise PipecompileError(
            f"{split} splits the batch, and {mixing[0].op} mixes the samples of the batch "
            f"(the manifest's batch_coupling): each part would mix only its own samples, and "
            "training would follow another objective than the model's; run it on the whole "
            "batch (no --dp or --accumulate; a larger batch per step instead)"
        )
