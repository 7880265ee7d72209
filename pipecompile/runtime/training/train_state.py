"""Train state (what ``run --save DIR`` writes and ``--resume`` reads): weights, optimizer
state, step count, data position and seed, written atomically.

Layout of a train state directory::

    latest                  the name of the newest complete step directory
    step_<n>/meta.json      {"step": n, "stages": count, "format": "pipecompile-checkpoint/1",
                             "layout": "dcp", "optimizer": "AdamW",
                             "train": {"loss_scale": ..., "epoch": ..., "batches": ...,
                                       "seed": ...}}
    step_<n>/.metadata, step_<n>/__<r>_0.distcp
                            a torch.distributed.checkpoint keyed by the model's names
                            (``model_keyed``): any compile of the model loads it

A step written before that layout (no ``"layout"``; ``stage_<j>.safetensors`` and
``stage_<j>.optim.pt`` per stage, and the split's fingerprint) still resumes, into the split
that wrote it only.

Each rank writes its share into ``.step_<n>.tmp``; after a barrier, rank 0 writes
``meta.json``, renames the directory into place and replaces ``latest`` (a temporary file,
then ``os.replace``), so a crash at any point leaves the previous saved step intact. An
interrupted save removes its temporary files; a rank killed mid-save leaves them to the next
save or to the launcher (``remove_partial``). PipeDream
programs drain at the end of every step, so no stashed weight version outlives a step and
none needs saving.

Only what pipecompile wrote is replaced: a ``step_<n>`` whose ``meta.json`` carries the
format marker, and a ``latest`` naming a step. A run refuses (``check_save_dir``) a directory
holding another run's train state unless it resumes from there or is forced. A save the disk
refuses (full, read-only) names the path and the last complete saved step, and a local run
saves that step to a fresh directory under the system's temporary directory instead.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from functools import partial
from pathlib import Path
from typing import NotRequired, TypedDict

import torch
import torch.distributed as dist
from safetensors.torch import load_model

from pipecompile.errors import EmitError
from pipecompile.files.atomic import write_atomically
from pipecompile.files.disk import disk_message, os_error, writing
from pipecompile.files.names import LATEST, STEP_META, stage_optimizer, stage_weights, step_name
from pipecompile.files.owned import TRAIN_STATE_FORMAT, is_our_latest, is_our_step_dir
from pipecompile.files.writable import check_directory
from pipecompile.ir.records.manifest import Manifest
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.process.faults import fail_save
from pipecompile.runtime.process.interrupt import user_stop
from pipecompile.runtime.training.model_keyed import (
    LAYOUT,
    load_model_keyed,
    local_optimizer,
    save_model_keyed,
)

__all__ = [
    "LoopState",
    "StepMeta",
    "save",
    "check_save_dir",
    "resume",
    "train_state",
    "latest_step_dir",
    "read_meta",
    "save_due",
    "remove_partial",
    "split_fingerprint",
    "publish",
    "last_complete",
    "step_meta",
]

FORMAT = TRAIN_STATE_FORMAT
_STEP = re.compile(r"step_\d+")


class LoopState(TypedDict, total=False):
    """The training loop's own state, saved in ``meta.json``'s ``train``: where the data
    stood, the run's seed and fp16's loss scale."""

    epoch: int
    batches: int
    seed: int
    loss_scale: dict[str, float]


class StepMeta(TypedDict):
    """A saved step's ``meta.json`` (``layout``, ``optimizer`` and ``train``: absent in the
    older per-stage layout, which names its cut in ``split``)."""

    format: str
    step: int
    stages: int
    layout: NotRequired[str]
    split: NotRequired[str]
    train: NotRequired[LoopState]
    optimizer: NotRequired[str | None]


def save(
    pipe: Pipeline, root: Path, step: int, rank: int = 0, train: LoopState | None = None
) -> Path:
    """Write this rank's stages for ``step`` under ``root`` (all ranks call it together);
    ``train`` (the training loop's own state: loss scale, epoch) goes into meta.json.

    Raises:
        EmitError: ``root`` holds a ``step_<step>`` or ``latest`` pipecompile did not write;
            or the disk refused the save: the message names ``root``, the last complete
            saved step in it and (in one process) where this step was saved instead.
    """
    failed = partial(_failed_save, pipe, root, step, rank, train)
    with writing("save the train state to", root, message=failed):
        return _save(pipe, root, step, rank, train)


def _save(pipe: Pipeline, root: Path, step: int, rank: int, train: LoopState | None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{step_name(step)}.tmp"
    try:
        if rank == 0:
            remove_partial(root)  # left by a save that was killed, this step's included
            tmp.mkdir()
        return _write(pipe, root, tmp, step, rank, train)
    except BaseException as err:  # Ctrl-C or an error mid-save: `latest` names a complete step
        if rank == 0:
            remove_partial(root)
        stop = user_stop(err)
        if stop is not None and stop is not err:
            raise stop from None  # a stop mid-write that the writer turned into its own error
        raise


def _write(
    pipe: Pipeline, root: Path, tmp: Path, step: int, rank: int, train: LoopState | None
) -> Path:
    _barrier()
    save_model_keyed(pipe, tmp)  # collective: every rank writes its share, rank 0 the index
    fail_save(rank, step)  # a test's injected failure (runtime.faults), if one is set here
    _barrier()
    final = root / step_name(step)
    if rank == 0:
        publish(root, tmp, step_meta(pipe, step, train))
    _barrier()
    return final


def step_meta(pipe: Pipeline, step: int, train: LoopState | None) -> StepMeta:
    """What ``meta.json`` says of the step ``pipe`` is at."""
    return StepMeta(
        format=FORMAT,
        step=step,
        stages=len(pipe.modules),
        layout=LAYOUT,
        train=train or LoopState(),
        optimizer=_optimizer_kind(pipe),
    )


def publish(root: Path, tmp: Path, meta: StepMeta) -> Path:
    """Rank 0, once every rank's share is in ``tmp``: its ``meta.json`` written, ``tmp``
    renamed into ``step_<n>`` and ``latest`` moved to it (a temporary file, then
    ``os.replace``); returns the step's directory."""
    final = root / step_name(meta["step"])
    _check_replaceable(root, final)
    (tmp / STEP_META).write_text(json.dumps(meta) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    write_atomically(root / LATEST, final.name + "\n")
    return final


def _check_replaceable(root: Path, final: Path) -> None:
    """Never replace a ``step_<n>`` or ``latest`` pipecompile did not write (``check_save_dir``
    refuses them before a run; this guards a user who puts one there meanwhile)."""
    foreign = [
        p.name
        for p in (final, root / LATEST)
        if p.exists() and not (is_our_step_dir(p) if p is final else is_our_latest(p))
    ]
    if foreign:
        raise EmitError(
            f"cannot save train state {final}: {root} holds {', '.join(foreign)}, which "
            "pipecompile did not write and never replaces; move it away or --save elsewhere"
        )


def _failed_save(
    pipe: Pipeline,
    root: Path,
    step: int,
    rank: int,
    train: LoopState | None,
    cause: OSError,
) -> str:
    """What a save the disk refused tells the user; in one process, this step is saved to a
    fresh temporary directory first, so that the training done is not lost."""
    line = disk_message(f"write train state {step_name(step)} to", root, cause)
    kept = last_complete(root)
    if dist.is_available() and dist.is_initialized():
        return f"{line}; {kept}"
    rescue = Path(tempfile.mkdtemp(prefix=f"pipecompile-rescue-step{step}-"))
    try:
        _save(pipe, rescue, step, rank, train)
    except Exception as err:
        shutil.rmtree(rescue, ignore_errors=True)
        why = os_error(err)
        return f"{line}; {kept}; saving it to {tempfile.gettempdir()} failed too ({why or err})"
    return (
        f"{line}\n{kept}; step {step} was saved to {rescue} instead: continue with --resume "
        f"{rescue} --save DIR (where there is room)"
    )


def last_complete(root: Path) -> str:
    """Which complete saved step ``root`` keeps, in words, for a failed save's message."""
    latest = root / LATEST
    if is_our_latest(latest) and is_our_step_dir(root / latest.read_text().strip()):
        return f"the last complete saved step there is {root / latest.read_text().strip()}"
    return f"no complete saved step is in {root}"


def check_save_dir(
    root: Path, *, resume: Path | None, force: bool, force_flag: str = "--force"
) -> str | None:
    """Refuse, before a run starts, a ``--save`` directory that cannot be written or where the
    run could lose saved steps; returns a note of what ``force`` will replace (else None).

    A directory holding another run's train state is refused unless ``resume`` continues
    from it (the same directory, or one of its steps) or ``force`` is set: then the run's
    saves replace those steps of the earlier run it saves again. A ``step_<n>`` or ``latest``
    pipecompile did not write is refused, ``force`` or not.

    Raises:
        EmitError: naming ``root`` and the way out.
    """
    check_directory(root, "train state")
    if not root.is_dir():
        return None
    steps = sorted(
        (p for p in root.iterdir() if _STEP.fullmatch(p.name)), key=lambda p: int(p.name[5:])
    )
    foreign = [p.name + "/" * p.is_dir() for p in steps if not is_our_step_dir(p)]
    latest = root / LATEST
    if latest.exists() and not is_our_latest(latest):
        foreign.append(LATEST)
    if foreign:
        raise EmitError(
            f"--save {root} holds {', '.join(foreign[:4])}, which pipecompile did not write (not "
            f"a saved step with meta.json's format {FORMAT!r}) and never replaces, --force or "
            "not; choose another --save, or move them away"
        )
    ours = [p.name for p in steps]
    if not ours or (resume is not None and _continues(resume, root)):
        return None
    shown = ", ".join(ours[:3]) + (f" ... {ours[-1]}" if len(ours) > 3 else "")
    if not force:
        raise EmitError(
            f"--save {root} holds another run's train state ({shown}), which this run would "
            f"replace; continue that run with --resume {root}, choose another --save, or pass "
            f"{force_flag} to replace them"
        )
    return (
        f"--force: the saved steps in {root} ({shown}) are replaced as this run saves their steps"
    )


def _continues(resume: Path, root: Path) -> bool:
    """Whether ``--resume resume`` continues the run saved in ``root``."""
    resume, root = Path(resume).resolve(), Path(root).resolve()
    return resume == root or (resume.parent == root and _STEP.fullmatch(resume.name) is not None)


def _optimizer_kind(pipe: Pipeline) -> str | None:
    """The class name of this rank's optimizers (every stage uses the same kind; a sharded
    one's is the kind it shards)."""
    kinds = [type(local_optimizer(o)).__name__ for o in pipe.optimizers or [] if o]
    return kinds[0] if kinds else None


def _check_optimizer_kind(pipe: Pipeline, step_dir: Path, kind: str | None) -> None:
    """Refuse state another kind of optimizer saved (its fields would not fit this one)."""
    mine = _optimizer_kind(pipe)
    if kind is not None and mine is not None and kind != mine:
        raise _other_optimizer(step_dir, kind, mine, kind)


def _other_optimizer(step_dir: Path, trained: str, mine: str, kind: str | None) -> EmitError:
    """The error of a resume with another optimizer than ``trained`` (``kind``: its class)."""
    flag = f" (--optimizer {kind.lower()})" if kind in ("SGD", "Adam", "AdamW") else ""
    return EmitError(
        f"train state {step_dir} was trained with {trained}, this run uses {mine}; resume with "
        f"the optimizer it was trained with{flag}"
    )


def remove_partial(root: Path) -> None:
    """Remove what an unfinished save left under ``root`` (``.step_<n>.tmp``, ``.latest.tmp``);
    call it only while no rank is saving there."""
    for tmp in root.glob(".step_*.tmp"):
        shutil.rmtree(tmp, ignore_errors=True)
    (root / ".latest.tmp").unlink(missing_ok=True)


def save_due(done: int, steps: int, every: int) -> bool:
    """Whether to save after step ``done`` of ``steps``: after the last, and every ``every``."""
    return done == steps or (every > 0 and done % every == 0)


def latest_step_dir(root: Path) -> Path:
    """The newest complete saved step under ``root`` (or ``root`` itself, a ``step_<n>``
    directory); EmitError if there is none."""
    if (root / STEP_META).is_file():  # --resume ck/step_3: that step, not the newest
        read_meta(root)
        return root
    pointer = root / LATEST
    if not pointer.is_file():
        raise EmitError(
            f"{root} holds no train state (no {LATEST!r} file); pass a --save directory"
        )
    try:
        step_dir = root / pointer.read_text().strip()
    except (OSError, UnicodeDecodeError) as err:
        raise EmitError(
            f"cannot read {pointer}: {err}; pass a step directory instead, e.g. "
            f"--resume {root}/step_N"
        ) from None
    if not (step_dir / STEP_META).is_file():
        raise EmitError(f"{step_dir} is not a complete step saved by pipecompile")
    read_meta(step_dir)
    return step_dir


def read_meta(step_dir: Path) -> StepMeta:
    """``step_dir/meta.json``, checked; EmitError naming the file if it is damaged."""
    path = step_dir / STEP_META
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise EmitError(
            f"train state {path} is damaged ({type(err).__name__}: {err}); {_earlier(step_dir)}"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise EmitError(
            f"{step_dir} is not a complete step saved by pipecompile ({path} lacks "
            f"the format {FORMAT!r}); {_earlier(step_dir)}"
        )
    if not isinstance(meta.get("step"), int) or not isinstance(meta.get("stages"), int):
        raise EmitError(
            f"train state {path} is damaged (no whole 'step' and 'stages'); {_earlier(step_dir)}"
        )
    return meta


def _earlier(step_dir: Path) -> str:
    """Advice to resume from another step of the same train state directory."""
    others = sorted(
        (p for p in step_dir.parent.glob("step_*") if p != step_dir and p.name[5:].isdigit()),
        key=lambda p: int(p.name[5:]),
    )
    if others:
        return f"resume from another step, e.g. --resume {others[-1]}"
    return "resume from another saved step, or start again without --resume"


def resume(pipe: Pipeline, root: Path, rank: int = 0) -> int:
    """Load this rank's stages and optimizer states from the newest saved step; returns the
    step count to continue from."""
    step_dir = latest_step_dir(root)
    meta = read_meta(step_dir)
    if meta.get("layout") == LAYOUT:
        _check_optimizer_kind(pipe, step_dir, meta.get("optimizer"))
        load_model_keyed(pipe, step_dir)
        return int(meta["step"])
    split = meta.get("split")
    if meta["stages"] != len(pipe.modules) or (split and split != split_fingerprint(pipe.manifest)):
        counts = f" ({meta['stages']} stages, this one {len(pipe.modules)})"
        raise EmitError(
            f"train state {step_dir} was written by a pipeline split differently"
            f"{counts if meta['stages'] != len(pipe.modules) else ''}; resume or export it with "
            "the compiled directory it was trained with"
        )
    for j, module in enumerate(pipe.modules):
        if module is None:
            continue
        weights = step_dir / stage_weights(j)
        try:
            load_model(module, str(weights))
        except Exception as err:
            raise EmitError(
                f"train state file {weights} (stage {j}) cannot be loaded: "
                f"{(str(err).splitlines() or [type(err).__name__])[0][:200]}; it is damaged or "
                "from another pipeline: resume from another saved step"
            ) from None
        optimizer = pipe.optimizers[j] if pipe.optimizers else None
        state = step_dir / stage_optimizer(j)
        if optimizer is not None and state.is_file():
            _load_optimizer(optimizer, state, meta.get("optimizer"))
    return int(meta["step"])


def _load_optimizer(optimizer: torch.optim.Optimizer, path: Path, kind: str | None) -> None:
    """Load ``path`` into ``optimizer``, refusing a state another kind of optimizer saved (its
    hyper-parameters would replace this one's, and the first step would fail)."""
    try:
        state = torch.load(path, weights_only=True)
        saved = set(state["param_groups"][0]) - {"params"}
    except Exception as err:
        raise EmitError(
            f"train state file {path} cannot be loaded ({type(err).__name__}: {err}); it is "
            "damaged: resume from another saved step"
        ) from None
    mine = set(optimizer.param_groups[0]) - {"params"}
    if saved != mine:
        trained = kind or f"an optimizer with {', '.join(sorted(saved - mine)[:3])}"
        raise _other_optimizer(path.parent, trained, type(optimizer).__name__, kind)
    optimizer.load_state_dict(state)


def train_state(root: Path) -> LoopState:
    """The training loop's state saved with the newest step under ``root``."""
    return LoopState(**(read_meta(latest_step_dir(root)).get("train") or {}))


def split_fingerprint(manifest: Manifest) -> str:
    """A hash of how ``manifest`` cuts the model: each stage's parameter names and the values
    it takes and gives. A saved train state fits a pipeline only if the two agree."""
    stages = [[s.params, s.inputs, s.outputs] for s in manifest.stages]
    return hashlib.sha256(json.dumps(stages, sort_keys=True).encode()).hexdigest()


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
