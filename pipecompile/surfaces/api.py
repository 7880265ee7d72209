"""The Python API: ``pipecompile.compile(model, example_inputs, stages=...)`` and
``pipecompile.load(directory)`` return a ``CompiledPipeline``.

Example:
    >>> import pipecompile, torch                                    # doctest: +SKIP
    >>> pipe = pipecompile.compile(model, (x,), stages=4, microbatches=8)
    >>> y = pipe(x)                                                  # inference
    >>> loss = pipe.train_step((x,), (target,), loss_fn,
    ...                        lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    >>> pipe.save("out/model"); again = pipecompile.load("out/model")
"""

from __future__ import annotations

import dataclasses
import inspect
import shutil
import tempfile
import warnings
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_model
from torch import nn

from pipecompile.codegen.emit import ModelRef
from pipecompile.codegen.output_dir import (
    check_replaceable,
    new_temp_dir,
    owned_names,
    replace_output,
)
from pipecompile.errors import PipecompileError, WeightsError
from pipecompile.files.names import INIT, INIT_CONSTANTS, stage_weights
from pipecompile.files.writable import inside
from pipecompile.ir.graph.values import non_tensor_input
from pipecompile.ir.programs.program import Program
from pipecompile.ir.records.manifest import WeightsRecord, saved_state, write_manifest
from pipecompile.model.model_configs import model_configs, unsaved_buffers
from pipecompile.options.fields import declared
from pipecompile.options.run import RunFlags, TrainFlags
from pipecompile.runtime.job.run import RunJob
from pipecompile.runtime.load import Emitted, read_manifest
from pipecompile.runtime.pipeline import OptimizerFactory, Pipeline

__all__ = ["compile", "load", "CompiledPipeline", "bind_inputs"]

# fit() also takes the loop's options that have no flag.
_LOOP_ONLY = frozenset({"loss_scale", "measure_memory"})


def compile(  # noqa: A001 - the API's name, as torch.compile
    model: nn.Module,
    example_inputs: Any,
    *,
    stages: int | None = None,
    schedule: str | None = None,
    microbatches: int | str | None = None,
    devices: int | None = None,
    directory: str | Path | None = None,
    progress: bool = False,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    example_targets: Any = None,
    **options: Any,
) -> CompiledPipeline:
    """Compile ``model`` into ``stages`` pipeline stages and load them for running.

    Args:
        model: the model; it is not modified.
        example_inputs: a mini-batch: a tensor, a tuple of positional tensors, or a dict of
            forward()'s keyword tensors; its batch splits into ``microbatches``.
        stages, schedule, microbatches: as the command line's options (``schedule`` and
            ``microbatches`` default to ``schedules.DEFAULT_SCHEDULE`` and 1, or are searched).
        devices: search the plan for this many devices (``--devices``): stages and replicas,
            micro-batches, schedule and recomputation the other keywords leave open; the
            chosen plan is ``pipe.manifest.plan``.
        directory: where to write the stage modules (default: a temporary directory that
            lives as long as the returned object; ``save`` copies it elsewhere).
        progress: print one line per compiler pass to stderr.
        loss_fn, example_targets: as a model file's: a loss over the whole batch (a
            contrastive loss) is then found, and computed exactly (docs/USAGE.md).
        **options: every other option of `pipecompile compile`, by the API name its
            ``CompileOptions`` field declares (docs/API.md lists them): ``recompute``,
            ``balance``, ``split_at``, ``pinned``, ``virtual_stages``, ``vertical_sync``,
            ``memory_budget``, ``replicas``, ``machine`` (a ``CostModel``, for the machine's
            flags), ``dynamic``, ``print_after``, ``verify_each``; ``weights`` (pretrained
            tensors each stage loads by original name: a ``.safetensors`` file or a Hugging
            Face directory) with ``allow_missing``; ``init_seed`` (a meta model's
            initialisation, default 0); ``force``, ``onnx``, ``no_verify``,
            ``compile_stages`` (the torch.compile backend runs use), and ``checkpoint``
            (the old name of ``recompute``).

    Raises:
        PipecompileError: a subclass naming what is wrong with the model or the options.
    """
    from pipecompile.compiler.options import CompileOptions
    from pipecompile.runtime.torch_compiled import check_backend
    from pipecompile.surfaces.compile_job import check_compile_options, compile_into

    named = {"stages": stages, "schedule": schedule, "microbatches": microbatches}
    chosen = CompileOptions.from_keywords(
        **named, devices=devices, directory=directory, progress=progress, **options
    )
    check_backend(chosen.compile_stages, "compile_stages")
    if chosen.allow_missing and chosen.weights is None:
        raise WeightsError(
            "allow_missing applies to weights=; pass the pretrained weights or drop it"
        )
    inputs = bind_inputs(model, example_inputs)
    temporary = directory is None
    out = Path(tempfile.mkdtemp(prefix="pipecompile-")) / "out" if temporary else Path(directory)
    check_compile_options(chosen, out)
    name = type(model).__name__
    _, notes = compile_into(
        model,
        inputs,
        chosen,
        out,
        model_ref=ModelRef(None, name, name, model_configs(model), unsaved_buffers(model)),
        loss=(loss_fn, None if example_targets is None else _as_tuple(example_targets)),
    )
    for note in notes:
        warnings.warn(f"pipecompile: {note}", stacklevel=2)
    pipe = CompiledPipeline(out, model_type=type(model))
    pipe._model = model if chosen.generate else None
    if temporary:
        pipe._temporary = out.parent
        weakref.finalize(pipe, shutil.rmtree, out.parent, True)
    if chosen.onnx:
        pipe.onnx()
    return pipe


def _keywords(cls: type) -> frozenset[str]:
    """The API keywords of the options dataclass ``cls``: its fields' ``api`` names."""
    return frozenset(o.api or f.name for f, o in declared(cls) if o.api is not None)


def _check_keywords(
    function: Callable[..., Any], options: dict[str, Any], known: frozenset[str]
) -> None:
    """Refuse ``options`` (``function``'s ``**options``) that are no ``known`` keyword."""
    unknown = sorted(set(options) - known)
    if unknown:
        named = inspect.signature(function).parameters.values()
        takes = known | {p.name for p in named if p.kind is inspect.Parameter.KEYWORD_ONLY}
        raise PipecompileError(
            f"{function.__name__}() got unknown option(s) {', '.join(unknown)}; it takes "
            f"{', '.join(sorted(takes))}"
        )


def load(directory: str | Path, *, allow_stale: bool = False) -> CompiledPipeline:
    """Load a directory written by ``pipecompile`` or ``CompiledPipeline.save``.

    Raises:
        ModelFileError: the model file the directory was compiled from changed since (its
            stages may no longer be that model), unless ``allow_stale``.
    """
    from pipecompile.model.model_file import check_fresh

    directory = Path(directory)
    if not allow_stale:
        check_fresh(directory, read_manifest(directory), allowed="pass allow_stale=True to use")
    pipe = CompiledPipeline(directory)
    pipe._allow_stale = allow_stale  # its fit() and generate() use it as it was loaded
    return pipe


class CompiledPipeline:
    """A compiled model's stages and schedule program, run on the local backend.

    Callable like the model (inference through the pipeline); ``train_step`` runs the
    schedule for one mini-batch; ``state_dict`` uses the original model's names.
    """

    def __init__(self, directory: Path, model_type: type[nn.Module] | None = None) -> None:
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)
        self.pipeline = Pipeline.load(self.directory)
        self._signature = inspect.signature(model_type.forward) if model_type else None
        self._factory: OptimizerFactory | None = None
        self._fitted_with: OptimizerFactory | str | None = None  # the last fit()'s optimizer
        self._temporary: Path | None = None  # deleted with this object (compiled in memory)
        self._allow_stale = False  # loaded with allow_stale=True: a changed model file is taken
        self._model: nn.Module | None = None  # compiled from Python: its modules, to generate

    @property
    def program(self) -> Program:
        """The schedule program: per device, its instructions."""
        return self.pipeline.program

    @property
    def stages(self) -> list[nn.Module]:
        """The stage modules, in order (each a standalone nn.Module)."""
        return [m for m in self.pipeline.modules if m is not None]

    @property
    def inputs(self) -> list[str]:
        """The model's input names, in forward() order."""
        return list(self.manifest.inputs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Inference through the pipeline on one mini-batch (split into micro-batches)."""
        return self.pipeline(self._named(args, kwargs))

    def train_step(
        self,
        inputs: Any,
        targets: Sequence[torch.Tensor] | torch.Tensor,
        loss_fn: Callable[..., torch.Tensor],
        optimizer: OptimizerFactory,
    ) -> torch.Tensor:
        """Run the schedule on one mini-batch and step the optimizer; returns the mean loss.

        Args:
            inputs: as ``example_inputs`` of ``compile`` (tensor, tuple or dict).
            targets: the targets ``loss_fn(output, *targets)`` takes (split like inputs).
            loss_fn: returns the batch mean of the loss for one micro-batch.
            optimizer: a factory over parameters, e.g. ``lambda ps: torch.optim.AdamW(ps)``;
                it builds one optimizer per stage the first time (and again if it changes).
        """
        if optimizer is not self._factory:
            if not callable(optimizer) or isinstance(optimizer, torch.optim.Optimizer):
                raise PipecompileError(
                    f"optimizer must be a factory over parameters, e.g. lambda ps: "
                    f"torch.optim.AdamW(ps, lr=1e-3); got {optimizer!r}"
                )
            self.pipeline.set_optimizer(optimizer)
            self._factory = optimizer
            self._fitted_with = None  # fit() would go on with these, not its own
        named = inputs if isinstance(inputs, dict) else self._named(_as_tuple(inputs), {})
        loss = self.pipeline.train_step(named, _as_tuple(targets), loss_fn).loss
        return loss

    def fit(
        self,
        batches: Any,
        loss_fn: Callable[..., torch.Tensor],
        optimizer: OptimizerFactory | str = "adamw",
        *,
        epochs: int | None = 1,
        steps: int | None = None,
        eval_batches: Any = None,
        metrics: str | Path | None = None,
        progress: bool = False,
        force: bool = False,
        fresh_optimizer: bool = False,
        **options: Any,
    ) -> list[dict[str, Any]]:
        """Train on ``batches`` with the loop of ``pipecompile run``; returns one record per
        optimizer step (the keys of ``metrics.jsonl``, docs/USAGE.md).

        Args:
            batches: an iterable of ``(inputs, targets)`` mini-batches (inputs as for
                ``__call__``: a tensor, tuple or dict), iterated once per epoch; or a function
                returning a fresh one per epoch.
            loss_fn: ``loss_fn(output, *targets)``, the batch mean.
            optimizer: a factory over parameters, or "sgd", "adam", "adamw" (with ``lr=``).
            epochs, steps: run ``epochs`` passes, or ``steps`` optimizer steps if given.
            eval_batches: like ``batches``; its mean loss is recorded after each epoch.
            metrics: append JSON lines to this file. ``progress``: print a line per step.
            force: let ``save`` replace another run's train state there (as ``run
                --force``); ``save`` and ``metrics`` are checked before training, and may not
                lie in the temporary ``directory`` of a pipeline compiled without one.
            fresh_optimizer: a second ``fit()`` with the same ``optimizer`` (the same name,
                or the same factory object) goes on with the first one's optimizers and
                their state (Adam's moments), as one longer loop would, at its own ``lr``;
                True starts new ones. Another optimizer always starts fresh.
            options: the other training options (the fields of ``TrainFlags``, the flags of
                ``run`` without dashes): ``accumulate``, ``lr``, ``lr_schedule``,
                ``warmup_steps``, ``clip_grad_norm``, ``precision``, ``seed``,
                ``skip_nonfinite``, ``save``, ``save_every``, ...; and ``loss_scale``.
        """
        from pipecompile.model.data_hooks import iterable_source
        from pipecompile.runtime.training.loop import train

        _check_keywords(CompiledPipeline.fit, options, _keywords(TrainFlags) | _LOOP_ONLY)
        chosen = TrainFlags(
            epochs=None if steps is not None else epochs, steps=steps, quiet=not progress, **options
        )
        if isinstance(optimizer, str):
            chosen.optimizer = optimizer
        elif "lr" in options:
            raise PipecompileError(
                f"fit(lr={options['lr']}) sets the rate of a named optimizer ('sgd', 'adam', "
                "'adamw'); an optimizer factory sets its own: drop lr, or pass it to the factory"
            )
        else:
            chosen.optimizer_factory = optimizer
        chosen.metrics = Path(metrics) if metrics is not None else None
        chosen.force = force
        job = self._job(chosen)
        names = self.inputs
        data = iterable_source(batches, names, "fit(batches)")
        evals = iterable_source(eval_batches, names, "fit(eval_batches)") if eval_batches else None
        same = (
            optimizer == self._fitted_with
            if isinstance(optimizer, str)
            else optimizer is self._fitted_with
        )
        # a resumed train state brings its own optimizer state
        options = job.train
        options.keep_optimizer = not fresh_optimizer and options.resume is None and same
        state = train(self.pipeline, loss_fn, data, options, eval_data=evals)
        self._factory = None  # the loop built its own optimizers
        self._fitted_with = optimizer
        return state.records

    def _job(self, options: TrainFlags) -> RunJob:
        """``fit``'s run, built and checked as every door builds one (``RunJob.build``), and
        where it writes: not in this pipeline's temporary directory (it goes with the object),
        writable, and not another run's train state."""
        for name in ("save", "metrics"):
            path = getattr(options, name)
            if path is not None and self._temporary and inside(path, self._temporary):
                raise PipecompileError(
                    f"fit({name}={str(path)!r}): it lies in this pipeline's temporary directory "
                    f"{self._temporary}, which is deleted with the pipeline; {name} elsewhere, "
                    f"e.g. {name}={Path(path).name!r}, or compile with directory=..."
                )
        emitted = Emitted(self.directory, self.manifest, self.pipeline.program)
        flags = RunFlags(allow_stale=self._allow_stale)  # as it was loaded
        job = RunJob.build(emitted, flags, options, default_metrics=False)
        job.check_places(force_flag="force=True")
        return job

    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int = 20,
        *,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
        nproc: int | None = None,
        train_state: str | Path | None = None,
        timeout: float | None = None,
        allow_stale: bool | None = None,
        threads: int | None = None,
        device: str | None = None,
    ) -> torch.Tensor | list[torch.Tensor]:
        """Continue each prompt of ``input_ids`` by up to ``max_new_tokens`` tokens through
        the decode stages (compiled with ``generate=True``): greedy unless ``temperature``,
        ``top_k`` or ``top_p`` ask to sample (``seed``: the same tokens at any stage, lane
        or process count). Returns a (B, P + T) LongTensor as Hugging Face's ``generate``
        does (a sequence stopped at ``eos_token_id`` padded with ``pad_token_id``), or a list
        of 1-D tensors when the prompts differ in length. As Hugging Face's ``generate``, the
        model's own EOS ids and pad id (its generation config, else its config) are the
        defaults: a sequence stops at the model's EOS unless ``eos_token_id`` names another.
        ``nproc``: one rank per stage, each holding its stage's part of this pipeline's
        current weights;
        ``train_state``: a `run --save` directory whose newest weights to use;
        ``timeout``: with ``nproc``, seconds to wait for tokens (default 600);
        ``allow_stale``: generate even though the model file changed since compiling
        (default: as the pipeline was loaded);
        ``threads``: intra-op threads (default: the idle cores, as ``fit`` chooses them);
        ``device``: ``"cpu"``, ``"cuda"`` or ``"auto"`` (the default: the GPUs where each
        rank, or this process, gets one of its own). The options are checked as
        `pipecompile generate` checks them (``GenerateJob.build``)."""
        from pipecompile.generation.job import GenerateJob
        from pipecompile.generation.runner import as_output, run_generation
        from pipecompile.generation.session import as_prompts
        from pipecompile.options.generate import GenerateFlags

        prompts = as_prompts(input_ids)
        flags = GenerateFlags(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed if seed is not None else 0,
            eos=eos_token_id,
            nproc=nproc,
            train_state=str(train_state) if train_state is not None else None,
            timeout=timeout,
            threads=threads,
            device=device,
            allow_stale=self._allow_stale if allow_stale is None else allow_stale,
        )
        job = GenerateJob.build(self.directory, prompts, flags)
        new = run_generation(job, weights=self.pipeline.state_dict)
        pad = pad_token_id if pad_token_id is not None else job.pad
        return as_output(prompts, new, pad)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """What the original model's own ``state_dict()`` holds, under its names: every
        parameter and buffer but those it registered as not persistent, so that
        ``model.load_state_dict(pipe.state_dict())`` takes it."""
        return saved_state(self.pipeline.state_dict(), self.manifest)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy values given under the original model's names into the stages."""
        for module, names in zip(self.pipeline.modules, self.pipeline.layout.params):
            if module is None:
                continue
            own = module.state_dict(keep_vars=True)
            with torch.no_grad():
                for name, originals in names.items():
                    source = next((state[o] for o in originals if o in state), None)
                    if source is not None:
                        own[name].copy_(source)

    def save(self, directory: str | Path, *, force: bool = False) -> Path:
        """Write the stages (with their current weights), program and manifest to
        ``directory``; ``pipecompile.load`` reads it back. Only pipecompile's own files are
        ever replaced: a directory holding anything else is refused, or with ``force`` kept
        beside the new files."""
        out = Path(directory)
        keep = check_replaceable(out, force=force)
        tmp = new_temp_dir(out)
        stages = tuple(
            dataclasses.replace(
                entry,
                weights=entry.weights or stage_weights(j),
                from_pretrained=None,
                from_init=None,
            )
            for j, entry in enumerate(self.manifest.stages)
        )
        # every stage file now holds the current values, all of them
        manifest = dataclasses.replace(
            self.manifest, stages=stages, weights=WeightsRecord("stage_files")
        )
        try:
            for name in owned_names(self.manifest) - {INIT, INIT_CONSTANTS}:
                if (self.directory / name).is_file():
                    shutil.copy2(self.directory / name, tmp / name)
            for module, entry in zip(self.pipeline.modules, manifest.stages):
                if module is not None and entry.weights is not None:
                    save_model(module, str(tmp / entry.weights))
            write_manifest(tmp, manifest)
            replace_output(tmp, out, keep=keep)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return out

    def pictures(self, directory: str | Path | None = None, fmt: str = "svg") -> list[Path]:
        """Draw the stage graph and the schedule (as ``pipecompile viz``) into ``directory``
        (default: the pipeline's own); returns the drawings, or the ``.dot`` sources when
        Graphviz's ``dot`` is not installed."""
        from pipecompile.reports.pictures.pictures import write_pictures

        out = Path(directory) if directory is not None else None
        written = write_pictures(self.directory, out=out, fmt=fmt)
        return list(written.drawn or written.sources)

    def onnx(self) -> list[Path]:
        """Export every stage to ``stage_<j>.onnx`` in the pipeline's directory (as
        ``--onnx``); ``pipecompile.interop.onnx_chain.run_onnx_chain`` runs them in onnxruntime."""
        from pipecompile.interop.onnx_export import export_onnx

        paths = export_onnx(self.directory)
        self.manifest = read_manifest(self.directory)
        return paths

    def _named(self, args: tuple, kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
        names = self.inputs
        if self._signature is not None:
            bound = self._signature.bind_partial(None, *args, **kwargs).arguments
            return {k: v for k, v in bound.items() if k in names}
        if len(args) > len(names):
            raise PipecompileError(
                f"got {len(args)} positional inputs; the pipeline takes {', '.join(names)}"
            )
        return {**dict(zip(names, args)), **kwargs}


def bind_inputs(model: nn.Module, example_inputs: Any) -> dict[str, torch.Tensor]:
    """``example_inputs`` (tensor, tuple or dict) as forward()'s named tensors."""
    signature = inspect.signature(model.forward)
    try:
        if isinstance(example_inputs, dict):
            bound = signature.bind_partial(**example_inputs)
        else:
            bound = signature.bind_partial(*_as_tuple(example_inputs))
    except TypeError as err:
        raise PipecompileError(
            f"example inputs do not fit {type(model).__name__}.forward{signature}: {err}"
        ) from None
    named = dict(bound.arguments)
    problem = non_tensor_input(named)
    if problem:
        raise PipecompileError(problem)
    return named


def _as_tuple(value: Any) -> tuple:
    if isinstance(value, torch.Tensor):
        return (value,)
    return tuple(value)
