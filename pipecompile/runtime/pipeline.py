"""A compiled pipeline loaded from its directory: train steps, inference, weights by model name."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from pipecompile.errors import (
    InputError,
    MicrobatchError,
    ModelFileError,
    PipecompileError,
    RuntimeFailure,
)
from pipecompile.ir.graph.microbatch import (
    batch_rows,
    input_mismatch,
    join_microbatches,
    row_shares,
    split_microbatches,
    split_targets,
)
from pipecompile.ir.programs.instr import INFERENCE_OPS, Instr, Op
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.topology import topology_from_manifest
from pipecompile.ir.programs.verify_program import verify_program
from pipecompile.ir.programs.whole_batch import waits_for_whole_batch
from pipecompile.ir.records.batch_coupling import loss_over_batch
from pipecompile.ir.records.manifest import Manifest
from pipecompile.options.run import OptimizerFactory
from pipecompile.runtime.executor import (
    LossFn,
    Stages,
    StepData,
    StepExecutor,
    StepHooks,
    call_loss_fn,
    defined_at,
)
from pipecompile.runtime.interpreter import Handler, run_program
from pipecompile.runtime.layout import Layout
from pipecompile.runtime.load import Emitted, load_stages, load_tail, open_emitted
from pipecompile.runtime.local_backend import LocalBackend
from pipecompile.runtime.state.loss_split import loss_mix
from pipecompile.runtime.state.step_options import PLAIN_STEP, StepOptions
from pipecompile.runtime.state.step_result import StepResult
from pipecompile.runtime.timeline import Tracer, traced
from pipecompile.runtime.torch_compiled import CompiledStages, resolve_backend
from pipecompile.schedules import WHOLE_BATCH, listed

__all__ = ["Pipeline", "Messaging", "LOCAL", "OptimizerFactory", "forward_only"]

# What builds a stage's optimizer from its parameters, e.g. ``lambda ps: torch.optim.SGD(ps,
# lr=0.1)``: the one type the API, the training loop and the pipeline take.


@dataclass(frozen=True)
class Messaging:
    """How a pipeline's steps talk: ``backend`` makes each step's message backend, ``wrap``
    may wrap the instruction handlers (a rank's watchdog), ``after_step`` runs when a step's
    messages are all delivered."""

    backend: Callable[[], Any] = LocalBackend
    wrap: Callable[[dict[str, Handler]], dict[str, Handler]] | None = None
    after_step: Callable[[], None] | None = None


LOCAL = Messaging()  # one process: the local backend, nothing wrapped


def forward_only(program: Program) -> Program:
    """The program's forward part: what inference runs."""
    devices = tuple(tuple(x for x in instrs if x.op in INFERENCE_OPS) for instrs in program.devices)
    return replace(program, devices=devices)


class Pipeline:
    """Stages, program and optimizers of one compiled model, run by the local backend.

    Example:
        >>> pipe = Pipeline.load("out/gpt")                     # doctest: +SKIP
        >>> pipe.set_optimizer(lambda ps: torch.optim.SGD(ps, lr=0.1))  # doctest: +SKIP
        >>> loss = pipe.train_step(inputs, targets, loss_fn).loss  # doctest: +SKIP
    """

    def __init__(
        self,
        manifest: Manifest,
        modules: Sequence[nn.Module | None],
        program: Program,
        *,
        device: int | None = None,
        replica: tuple[int, int] | None = None,
        default_device: torch.device | None = None,
        messaging: Messaging = LOCAL,
        tail: nn.Module | None = None,
    ) -> None:
        """``device``: run only that device's instructions (one rank of a distributed run;
        ``modules`` then holds None for the stages of other devices); ``replica`` = (k, r):
        this is replica k of r of its device, running micro-batches i with i mod r == k.
        ``default_device``: where the stages' factory ops (which emitted code leaves to the
        default device) put their tensors while the program runs; the user's own code (data
        hooks, the model file) keeps torch's default. ``messaging``: how the steps talk
        (``Messaging``; default: the local backend). ``tail``: the manifest's batch-coupled
        tail (``runtime.load.load_tail``), needed where this pipeline holds the last stage."""
        verify_program(program, topology_from_manifest(manifest))
        self.whole_loss = loss_over_batch(manifest.batch_coupling)
        self.tail, self.tail_spec = tail, None
        if manifest.tail is not None:
            self.tail_spec = pytree.treespec_loads(manifest.tail.output_spec)
        # a step computes the loss once on every micro-batch's outputs joined
        self.whole = self.whole_loss is not None or manifest.tail is not None
        if self.whole and not waits_for_whole_batch(program):
            what = (
                f"{self.whole_loss.op} is a loss over the whole batch"
                if self.whole_loss is not None
                else "the model's batch-coupled tail (tail.py) runs on the whole batch"
            )
            raise PipecompileError(
                f"{what} (the manifest's batch_coupling), computed once a step on every "
                f"micro-batch's outputs, and the program ({program.schedule}) starts the last "
                "stage's backward before its last forward: it cannot wait for that; run a "
                f"program of the {listed(WHOLE_BATCH)} schedule, or of one micro-batch"
            )
        self.manifest = manifest
        self.modules = modules
        self.program = program
        self.device = device
        self.messaging = messaging
        self.replica = replica
        self.default_device = default_device
        self.last: StepResult | None = None  # what the last step or inference gave
        self.layout = Layout.from_manifest(manifest, program.stage_device)
        self.optimizers: list[torch.optim.Optimizer | None] | None = None
        self.asynchronous = program.asynchronous
        self.precision: torch.dtype | None = None  # autocast and traffic dtype (precision.py)
        self.name = "the pipeline"  # how messages call it; Pipeline.load: its directory
        self.tracer: Tracer | None = None  # records the traced steps (runtime/timeline.py)
        self.compiled: CompiledStages | None = None  # --compile (runtime/torch_compiled.py)
        self._losses_checked: set[LossFn] = set()  # each checked on its first step

    def compile_stages(self, backend: str | None) -> None:
        """Run each held stage's forward through ``torch.compile`` with ``backend`` (None or
        ``off``: eagerly; not given to ``run``: what the compile recorded, see
        ``resolve_backend``)."""
        chosen = resolve_backend(backend, self.manifest.compile)
        if chosen is None:
            self.compiled = None
        elif self.compiled is None or self.compiled.backend != chosen:
            self.compiled = CompiledStages(self.modules, chosen, announce=self.device in (None, 0))

    @classmethod
    def load(cls, directory: str | Path, program: str | Path | None = None) -> Pipeline:
        """Load the directory written by ``pipecompile MODEL -o DIR`` (and optionally another
        program file, verified before use)."""
        return cls.opened(open_emitted(directory, program))

    @classmethod
    def opened(cls, emitted: Emitted) -> Pipeline:
        """The pipeline of a directory already opened (``runtime.load.open_emitted``)."""
        directory, manifest, program = emitted
        tail = load_tail(directory, manifest)
        pipe = cls(manifest, load_stages(directory, manifest), program, tail=tail)
        pipe.name = str(directory)
        return pipe

    def _loss_scale(self) -> float:
        """Each micro-batch's share of the gradient an update applies: 1/m for a synchronous
        step, 1 for PipeDream's update per micro-batch, 1/w for a window of w (2BW)."""
        m = self.program.microbatches
        if not self.asynchronous:
            return 1 / m
        first = self.program.stage_device[0]
        updates = sum(1 for x in self.program.devices[first] if x.op == Op.UPDATE and x.stage == 0)
        return updates / m

    def set_optimizer(self, factory: OptimizerFactory) -> None:
        """One optimizer per stage over that stage's parameters (tied copies step identically);
        a stage without parameters gets none.

        Raises:
            PipecompileError: the factory raised, returned no ``torch.optim.Optimizer``, or
                one over none of the parameters it was given (it would train nothing).
        """
        self.optimizers = [
            _optimizer(factory, params)
            if m is not None and (params := list(m.parameters()))
            else None
            for m in self.modules
        ]

    def train_step(
        self,
        inputs: dict[str, torch.Tensor] | None,
        targets: Sequence[torch.Tensor] | None,
        loss_fn: LossFn,
        on_step: Callable[[int], None] | None = None,
        *,
        measure_memory: bool = False,
        options: StepOptions = PLAIN_STEP,
    ) -> StepResult:
        """Run the program on one mini-batch; returns what it gave (``StepResult``: the mean
        loss over micro-batches, the outputs per micro-batch, the run's figures), also kept
        as ``last``. ``on_step(j)`` is called before each optimizer step of stage j.

        Synchronous programs (one STEP per stage) scale each micro-batch's loss by 1/m, so
        the step's gradient is the mini-batch mean's; asynchronous ones (UPDATE per
        micro-batch) apply each micro-batch's own gradient. ``measure_memory`` records the
        activation bytes held per device in its ``stats`` (``peak_inflight`` always is).
        ``options`` (``StepOptions``): the loss scale, gradients kept instead of stepped, the
        random ops' seed (default: drawn from torch's global generator and kept as the
        result's ``rng_base``, so dropout masks do not depend on the schedule's order), and
        what a rank that reads no data learns otherwise.
        On a rank of a distributed run, ``inputs`` may be None unless it holds the first
        stage, and ``targets`` unless it holds the last: other ranks never read the data.
        A batch of N rows (``options.rows``: N where ``inputs`` is None) splits into
        micro-batches as evenly as possible; a synchronous step weighs each one's loss by its
        share of the rows (unless ``options.weigh_rows`` is off), so the gradient is the mean
        over all N whatever their split.
        """
        rows, sizes = options.rows, options.sizes
        count = self.program.microbatches
        micro = self._split(inputs)
        split = self.manifest.dynamic.split
        if inputs is not None:
            rows = batch_rows(self._ordered(inputs), self._batch_dim)
        elif rows is None and sizes is not None and split:
            rows = sizes[split[0]]
        micro_targets = split_targets(targets, count, rows=rows) if targets is not None else None
        scale = options.loss_scale if options.loss_scale is not None else self._loss_scale()
        weighed = options.weigh_rows and rows is not None and not self.asynchronous
        tracer = self.tracer if self.tracer is not None and self.tracer.active else None
        backend = self._sized(self.messaging.backend(), inputs, sizes)
        if tracer is not None:
            backend = tracer.backend(backend, self.device)
        shares = row_shares(rows, count) if weighed else None  # type: ignore[arg-type]
        executor = StepExecutor(
            self._stages(),
            backend,
            StepData(
                micro,
                micro_targets,
                loss_fn,
                scale,
                shares,
                self._whole(targets),
                self.output,
                options.gather,
            ),
            StepHooks(
                self.optimizers,
                on_step,
                options.on_backward,
                tracer.span if tracer is not None else None,
            ),
            measure_memory=measure_memory,
            keep_grads=options.keep_grads,
            rng_base=options.rng_base,
        )
        self._run(self._own_program(self.program), executor, inputs or {})
        backend.finish()
        if self.messaging.after_step is not None:
            self.messaging.after_step()
        self.last = self._result(executor, backend, scale)
        if options.weigh_rows and loss_fn not in self._losses_checked:  # a mean's, not a sum's
            self._check_loss(loss_fn, targets, options.splits)
            self._losses_checked.add(loss_fn)  # a refused one is checked again
        return self.last

    def _check_loss(
        self, loss_fn: LossFn, targets: Sequence[torch.Tensor] | None, splits: tuple[str, ...]
    ) -> None:
        """On a first step that splits the batch, with a loss per part: that loss must be a
        mean over the samples (``state/loss_split``), checked on the outputs joined.

        Raises:
            ModelFileError: naming ``loss_fn``, the losses and what to do.
        """
        m = self.program.microbatches
        said = (*((f"{m} micro-batches",) if m > 1 else ()), *splits)
        last = self.last
        if not said or self.asynchronous or self.whole or targets is None:
            return
        if last is None or not last.outputs:
            return
        try:
            joined = join_microbatches(last.outputs)
        except PipecompileError:  # a scalar output: refused at compile where it splits
            return
        output = pytree.tree_unflatten(joined, self.layout.output_spec)
        mix = loss_mix(lambda o, t: call_loss_fn(loss_fn, o, t), output, tuple(targets))
        if mix is None:
            return
        why = (
            "return the mean over the batch instead of the sum"
            if "sums" in mix
            else "a loss over the whole batch (a contrastive loss) runs exactly where the "
            "compile sees it (the model file's loss_fn and example_targets(), or compile()'s "
            "loss_fn and example_targets): once a step on every micro-batch's outputs joined, "
            f"under the {listed(WHOLE_BATCH)} schedule; or keep the batch whole (--microbatches "
            "1, no --dp or --accumulate)"
        )
        raise ModelFileError(
            f"loss_fn ({defined_at(loss_fn)}) is not a mean over the samples of its batch: "
            f"{mix}. The run splits each batch ({', '.join(said)}) and averages the parts' "
            f"losses, so it would train another objective than the model's; {why}"
        )

    def _whole(self, targets: Sequence[torch.Tensor] | None) -> tuple[torch.Tensor, ...] | None:
        """The targets of a loss over the whole batch (None: a loss per micro-batch)."""
        if not self.whole or targets is None or self.asynchronous:
            return None
        return tuple(targets)

    def _result(self, executor: StepExecutor, backend: Any, scale: float) -> StepResult:
        """The step's ``StepResult`` (the mean loss NaN on a rank without the last stage)."""
        count = self.program.microbatches
        if len(executor.losses) < count:  # the last stage runs elsewhere
            loss, outputs = torch.tensor(float("nan")), []
        else:
            loss = sum(executor.losses[i].detach() for i in range(count)) / (count * scale)
            outputs = [executor.results[i] for i in range(count)]
        return StepResult(
            loss,
            outputs,
            executor.losses,
            executor.results,
            executor.stats,
            backend.sent_bytes,
            executor.rng_base,
        )

    def _sized(self, backend: Any, inputs: dict[str, Any] | None, sizes: Any) -> Any:
        """``backend``, told each micro-batch's sizes of the dimensions compiled ``--dynamic``
        (from ``inputs``, else ``sizes``) where it sizes messages (DistBackend.resize)."""
        dynamic = self.manifest.dynamic
        if dynamic.sizes:
            if inputs is not None:
                sizes = dynamic.sizes_of(self._ordered(inputs))
            if sizes:
                backend.resize(dynamic.per_microbatch(sizes, self.program.microbatches))
        return backend

    def apply_step(self) -> None:
        """Step each held stage's optimizer on the gradients ``train_step(keep_grads=True)``
        left (tied and replica sums included), then zero them."""
        for j, module in enumerate(self.modules):
            if module is None:
                continue
            optimizer = self.optimizers[j] if self.optimizers is not None else None
            if optimizer is not None:
                device = self.layout.stage_device[j]
                with traced(self.tracer, device, "compute", f"{j}optimizer", "optimizer", stage=j):
                    optimizer.step()
            module.zero_grad(set_to_none=True)

    def drop_step(self) -> None:
        """Discard the gradients ``train_step(keep_grads=True)`` left: the step never happened."""
        for module in self.modules:
            if module is not None:
                module.zero_grad(set_to_none=True)

    @property
    def _own_stages(self) -> set[int]:
        return {j for j, m in enumerate(self.modules) if m is not None}

    def _stages(self) -> Stages:
        """The stages as an executor runs them."""
        return Stages(self.layout, self.modules, self.compiled, self.precision)  # type: ignore[arg-type]

    def _own_program(self, program: Program) -> Program:
        if self.device is None:
            return program
        mine = program.devices[self.device]
        if self.replica is not None:
            k, r = self.replica
            mine = tuple(x for x in mine if x.microbatch is None or x.microbatch % r == k)
        devices = tuple(mine if d == self.device else () for d in range(len(program.devices)))
        return replace(program, devices=devices)

    def _run(self, program: Program, executor: StepExecutor, inputs: dict[str, Any]) -> None:
        """Run ``program``; a failure that inputs of another shape or dtype than compiled
        explain is reported as that."""
        handlers = self._handlers(executor)
        if self.device is not None:  # a rank: its receives can start ahead
            handlers = _receiving_ahead(handlers, executor, program.devices[self.device])
        try:
            with self.default_device or contextlib.nullcontext():
                run_program(program, handlers)
        except (RuntimeFailure, InputError) as err:  # InputError: targets that do not fit
            self.blame_inputs(inputs, err)
            raise

    def blame_inputs(self, inputs: dict[str, Any], cause: BaseException | None = None) -> None:
        """Something failed: raise InputError instead if ``inputs`` do not fit what was
        compiled (they explain the failure better than a torch error from inside a stage)."""
        problem = self.input_problem(inputs)
        if problem is not None:
            raise InputError(problem) from cause

    def input_problem(self, inputs: dict[str, Any], *, exact: bool = False) -> str | None:
        """Why ``inputs`` do not fit the shapes and dtypes compiled for, or None (sizes along
        the batch dimension are compared only if ``exact`` or the stages are specialised to
        them)."""
        compiled = {v.value: (v.shape, v.dtype) for v in self.manifest.input_values or ()}
        model = self.manifest.model
        exact = exact or (model is not None and model.tracer == "torch.export")
        exact = exact or bool(self.manifest.dynamic.fixed)  # the model fixes the batch
        tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        return input_mismatch(
            tensors,
            compiled,
            self.program.microbatches,
            dim=self._batch_dim,
            exact=exact,
            where=self.name,
            free=self.manifest.dynamic.inputs,
            fixed=self.manifest.dynamic.fixed,
        )

    @property
    def _batch_dim(self) -> int:
        return self.manifest.batch_dim

    def _split(self, inputs: dict[str, Any] | None) -> list[dict[str, torch.Tensor]]:
        """The micro-batches of ``inputs`` (empty ones where None: a rank that does not hold
        the first stage). A distributed run receives messages of the compiled shapes, so its
        inputs must have exactly those."""
        if inputs is None:
            if self.device is None or 0 in self._own_stages:
                raise InputError(f"{self.name} needs the inputs: it runs the first stage")
            return [{} for _ in range(self.program.microbatches)]
        ordered = self._ordered(inputs)
        above = self.manifest.dynamic.above_maximum(ordered)
        if above is not None:
            raise InputError(above)
        if self.device is not None or self.manifest.dynamic.fixed:
            problem = self.input_problem(ordered, exact=True)
            if problem is not None:
                raise InputError(problem)
        try:
            return split_microbatches(ordered, self.program.microbatches, self._batch_dim)
        except MicrobatchError:
            self.blame_inputs(ordered)
            raise

    def _handlers(self, executor: StepExecutor) -> dict[str, Handler]:
        handlers = executor.handlers()
        if self.tracer is not None:
            handlers = self.tracer.handlers(handlers)  # unchanged outside a traced step
        wrap = self.messaging.wrap
        return wrap(handlers) if wrap is not None else handlers

    @torch.no_grad()
    def __call__(
        self,
        inputs: dict[str, torch.Tensor] | None,
        *,
        rng_base: int | None = None,
        sizes: dict[str, int] | None = None,
    ) -> Any:
        """Inference through the pipeline; returns the model's output structure.
        ``rng_base`` and ``sizes`` as in ``StepOptions``."""
        count = self.program.microbatches
        micro = self._split(inputs)
        backend = self._sized(self.messaging.backend(), inputs, sizes)
        executor = StepExecutor(
            self._stages(),
            backend,
            StepData(micro),  # type: ignore[arg-type]
            rng_base=rng_base,
        )
        self._run(self._own_program(forward_only(self.program)), executor, inputs or {})
        backend.finish()
        held = [executor.results[i] for i in range(count) if i in executor.results]
        self.last = StepResult(
            torch.tensor(float("nan")),
            held if len(held) == count else [],
            {},
            executor.results,
            executor.stats,
            backend.sent_bytes,
            executor.rng_base,
        )
        if len(executor.results) < count:  # the last stage runs elsewhere, or in part here
            return None
        results = [executor.results[i] for i in range(count)]
        return self.output(join_microbatches(results, names=self.manifest.outputs))

    def output(self, joined: list[Any]) -> Any:
        """The model's output structure from the last stage's outputs joined over the
        micro-batches (the tail, where the model has one, run on them).

        Raises:
            PipecompileError: the manifest has a tail this pipeline was built without.
        """
        return pytree.tree_unflatten(
            self.flat_output(joined), self.tail_spec or self.layout.output_spec
        )

    def flat_output(self, joined: list[Any]) -> list[Any]:
        """``output``'s flat values."""
        if self.manifest.tail is None:
            return list(joined)
        if self.tail is None:
            raise PipecompileError(
                f"{self.name} has a batch-coupled tail (tail.py), and this pipeline was built "
                "without it: load it with Pipeline.load, or pass tail=load_tail(...)"
            )
        return list(self.tail(*joined))

    def held_outputs(self) -> dict[int, Any]:
        """The model's output structure of each micro-batch whose last stage the last step or
        inference ran in this process: every one, except on a rank of a distributed run that
        does not hold the last stage (none) or holds replica k of r of it (the micro-batches
        i with i mod r == k, for which ``__call__`` returns None)."""
        results = self.last.results if self.last is not None else {}
        spec, held = self.layout.output_spec, sorted(results.items())
        return {i: pytree.tree_unflatten(list(r), spec) for i, r in held}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter and buffer under each of the original model's names for it."""
        state: dict[str, torch.Tensor] = {}
        for module, params in zip(self.modules, self.layout.params):
            if module is None:
                continue
            own = module.state_dict(keep_vars=False)
            for name, originals in params.items():
                for original in originals:
                    state.setdefault(original, own[name])
        return state

    def named_grads(self, stage: int) -> dict[str, torch.Tensor]:
        """Stage ``stage``'s current gradients, detached copies, under the original names."""
        module = self.modules[stage]
        assert module is not None, f"stage {stage} runs on another rank"
        own = dict(module.named_parameters(remove_duplicate=False))
        grads: dict[str, torch.Tensor] = {}
        for name, originals in self.layout.params[stage].items():
            grad = own[name].grad if name in own else None
            if grad is not None:
                for original in originals:
                    grads[original] = grad.detach().clone()
        return grads

    def _ordered(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        missing = [n for n in self.layout.model_inputs if n not in inputs]
        if missing:
            raise InputError(
                f"the inputs lack {', '.join(map(repr, missing))} (given: "
                f"{', '.join(map(repr, inputs)) or 'none'}); {self.name} was compiled for "
                f"inputs {', '.join(map(repr, self.layout.model_inputs))}"
            )
        return {n: inputs[n] for n in self.layout.model_inputs}


# Receives a rank keeps posted before the instructions that take them; the environment's
# PIPECOMPILE_RECEIVE_AHEAD=0 receives each message only when needed (for measuring the gain).
RECEIVE_AHEAD = int(os.environ.get("PIPECOMPILE_RECEIVE_AHEAD", "2"))


def _receiving_ahead(
    handlers: dict[str, Handler], executor: StepExecutor, instrs: Sequence[Instr]
) -> dict[str, Handler]:
    """``handlers`` on a backend that can post receives early: the first ``RECEIVE_AHEAD``
    receives of the rank's program are posted now, and each one taken posts the next."""
    receives = [x for x in instrs if x.op in (Op.RECV_F, Op.RECV_B)]
    for instr in receives[:RECEIVE_AHEAD]:
        executor.backend.post(executor.receive_keys(instr))
    after = {x: receives[k + RECEIVE_AHEAD] for k, x in enumerate(receives[:-RECEIVE_AHEAD])}

    def ahead(handler: Handler) -> Handler:
        def run(instr: Instr) -> bool:
            done = handler(instr)
            if done and instr in after:
                executor.backend.post(executor.receive_keys(after[instr]))
            return done

        return run

    return {op: ahead(h) if op in (Op.RECV_F, Op.RECV_B) else h for op, h in handlers.items()}


def _optimizer(factory: OptimizerFactory, params: list[torch.nn.Parameter]) -> Any:
    """``factory(params)``, held to returning an optimizer of (some of) ``params``."""
    example = "e.g. lambda ps: torch.optim.AdamW(ps, lr=1e-3)"
    try:
        optimizer = factory(params)
    except Exception as err:
        raise PipecompileError(
            f"the optimizer factory failed on a stage's parameters: {type(err).__name__}: "
            f"{err}; it must take an iterable of parameters ({example})"
        ) from err
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise PipecompileError(
            f"the optimizer factory returned {_kind(optimizer)}, not a torch.optim.Optimizer; "
            f"return one over the parameters it is given ({example})"
        )
    given = {id(p) for p in params}
    if not any(id(p) in given for group in optimizer.param_groups for p in group["params"]):
        raise PipecompileError(
            "the optimizer factory returned an optimizer of other parameters than the ones it "
            f"was given (a stage's), so nothing would train; build it over its argument ({example})"
        )
    return optimizer


def _kind(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"
