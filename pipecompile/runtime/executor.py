"""The handlers of one training or inference step: one short method per instruction."""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from pipecompile.errors import ModelFileError, PipecompileError, RuntimeFailure
from pipecompile.ir.graph.microbatch import check_target_rows
from pipecompile.ir.graph.saved_bytes import count_saved, tensor_bytes
from pipecompile.ir.graph.swapped_call import functional_call
from pipecompile.ir.graph.user_frame import innermost_in
from pipecompile.ir.programs.instr import FORWARD_OPS, Instr, Op
from pipecompile.runtime.backend import Backend, MessageKey, tie_round
from pipecompile.runtime.interpreter import Handler
from pipecompile.runtime.layout import Layout
from pipecompile.runtime.local_part import laid_out_like, local_part
from pipecompile.runtime.state.precision import autocast, device_of, for_wire
from pipecompile.runtime.state.random_state import draw_base, seeded
from pipecompile.runtime.state.stats import RunStats
from pipecompile.runtime.state.weight_versions import WeightVersions
from pipecompile.runtime.state.whole_loss import Gather, WholeLoss
from pipecompile.runtime.torch_compiled import CompiledStages

__all__ = ["StepExecutor", "LossFn", "call_loss_fn", "defined_at"]

LossFn = Callable[..., torch.Tensor]


def call_loss_fn(loss_fn: LossFn, output: Any, targets: Sequence[Any]) -> torch.Tensor:
    """``loss_fn(output, *targets)``, held to its contract: it takes those arguments and
    returns a scalar tensor.

    Raises:
        ModelFileError: loss_fn takes other arguments, raised, or returned no scalar; the
            message names its file and line.
    """
    where = f"loss_fn ({defined_at(loss_fn)})"
    try:
        inspect.signature(loss_fn).bind(output, *targets)
    except TypeError:
        takes = _parameters(loss_fn)
        raise ModelFileError(
            f"{where} takes {takes} but is called as loss_fn(output, *targets) with "
            f"{1 + len(targets)}: the model's output and {len(targets)} target(s) from "
            "example_targets(); make it take one argument per target after the output"
        ) from None
    except ValueError:  # no signature to check (a builtin): just call it
        pass
    try:
        loss = loss_fn(output, *targets)
    except Exception as err:
        line = _line_in(err, loss_fn)
        raise ModelFileError(f"{where} failed{line}: {type(err).__name__}: {err}") from err
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        got = (
            f"a tensor of shape {tuple(loss.shape)}"
            if isinstance(loss, torch.Tensor)
            else f"a {type(loss).__name__}"
        )
        raise ModelFileError(
            f"{where} returned {got}; it must return a scalar tensor, the batch mean "
            "(e.g. reduction='mean')"
        )
    return loss


@dataclass
class Held:
    """One micro-batch on one stage between its forward and its last backward."""

    args: list[Any]
    outs: tuple[Any, ...] | None  # None: recomputed in backward (FC)
    weights: dict[str, torch.Tensor] | None  # stashed leaves the forward used
    nbytes: int = 0
    roots: list[torch.Tensor] = field(default_factory=list)  # kept from I for W
    root_grads: list[torch.Tensor | None] = field(default_factory=list)
    fused: bool = False  # compiled: I computes the weight gradients too (runtime/torch_compiled)


@dataclass(frozen=True)
class Stages:
    """The stages an executor runs: their layout and modules, their compiled forwards
    (``--compile``) and the autocast dtype of their forwards and traffic (``precision``)."""

    layout: Layout
    modules: Sequence[nn.Module]
    compiled: CompiledStages | None = None
    precision: torch.dtype | None = None


@dataclass(frozen=True)
class StepData:
    """One mini-batch's micro-batches and, to train, their targets and loss; ``loss_scale``
    each micro-batch's loss factor (default 1/m), ``shares`` each one's rows over the
    average's (uneven splits), ``whole_targets`` those of a loss over the whole batch."""

    microbatches: Sequence[dict[str, torch.Tensor]]
    targets: Sequence[tuple[torch.Tensor, ...]] | None = None
    loss_fn: LossFn | None = None
    loss_scale: float | None = None
    shares: Sequence[float] | None = None
    # the whole batch's targets where the loss is one over the whole batch (runtime/state/
    # whole_loss): computed once on every micro-batch's outputs; None: a loss per micro-batch
    whole_targets: tuple[torch.Tensor, ...] | None = None
    # the model's output structure from the last stage's outputs joined (its tail run on
    # them); None: rebuilt by the layout's output spec
    joined_output: Callable[[list[Any]], Any] | None = None
    # under --dp, every copy's joined outputs and targets for the loss over the whole batch
    gather: Gather | None = None


@dataclass(frozen=True)
class StepHooks:
    """What a step calls as it runs: each stage's optimizer, ``on_step(stage)`` before its
    STEP, ``on_backward(stage, last)`` before each B (``last``: its last micro-batch; FSDP's
    gradient sync), and ``span(device, track, name, category, **args)``, a traced step's
    recorder of what happens inside an instruction (the loss; see runtime/timeline.py)."""

    optimizers: Sequence[torch.optim.Optimizer | None] | None = None
    on_step: Callable[[int], None] | None = None
    on_backward: Callable[[int, bool], None] | None = None
    span: Callable[..., AbstractContextManager] | None = None


class StepExecutor:
    """State of one mini-batch in flight: held activations, messages, gradients, losses.

    Values crossing a stage boundary are detached leaves in the consumer, so each stage's
    backward stops at its inputs and their gradients travel back explicitly (SEND_B/RECV_B).
    """

    def __init__(
        self,
        stages: Stages,
        backend: Backend,
        data: StepData,
        hooks: StepHooks | None = None,
        *,
        measure_memory: bool = False,
        keep_grads: bool = False,
        rng_base: int | None = None,
    ) -> None:
        """``rng_base``: the seed of the step's random ops (default: drawn; see
        random_state); ``keep_grads``: STEP leaves the summed gradients for the caller."""
        hooks = hooks or StepHooks()
        layout, modules = stages.layout, stages.modules
        self.layout, self.modules, self.backend = layout, modules, backend
        self.compiled = stages.compiled
        self.span = hooks.span
        self.precision = stages.precision  # autocast dtype of stage forwards and traffic
        self.rng_base = draw_base() if rng_base is None else rng_base  # see random_state
        microbatches, loss_fn = data.microbatches, data.loss_fn
        self.microbatches, self.targets, self.loss_fn = microbatches, data.targets, loss_fn
        self.optimizers, self.on_step = hooks.optimizers, hooks.on_step
        self.on_backward = hooks.on_backward
        self.backwards: dict[int, int] = {}  # B instructions run per stage
        scale = data.loss_scale
        self.loss_scale = 1.0 / len(microbatches) if scale is None else scale
        self.shares = data.shares  # each micro-batch's rows over the average's (uneven splits)
        self.measure_memory = measure_memory
        self._tied: dict[int, list[tuple[tuple[str, ...], dict[int, str]]]] = {}  # per stage
        self.keep_grads = keep_grads  # STEP leaves the summed gradients for the caller
        self.training = loss_fn is not None
        self.versions = WeightVersions(modules)
        self.stats = RunStats.for_devices(max(layout.stage_device) + 1)
        self.received: dict[tuple[int, int], dict[str, Any]] = {}
        self.held: dict[tuple[int, int], Held] = {}
        self.out_grads: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        self.in_grads: dict[tuple[int, int], dict[str, torch.Tensor | None]] = {}
        self.update_grads: dict[tuple[int, int], dict[str, torch.Tensor | None]] = {}
        self.losses: dict[int, torch.Tensor] = {}
        self.whole_targets, self.joined_output = data.whole_targets, data.joined_output
        whole = self.training and data.whole_targets is not None
        self.whole = WholeLoss(len(microbatches), data.gather) if whole else None
        self.to_send: dict[tuple[int, int], tuple[Any, ...]] = {}
        self.results: dict[int, tuple[torch.Tensor, ...]] = {}

    def handlers(self) -> dict[Op, Handler]:
        return {
            Op.F: self._timed(self.forward),
            Op.FC: self._timed(self.forward),
            Op.B: self._timed(self.backward),
            Op.I: self._timed(self.backward),
            Op.W: self._timed(self.backward_weights),
            Op.SEND_F: self.send_activations,
            Op.RECV_F: self.recv_activations,
            Op.SEND_B: self.send_gradients,
            Op.RECV_B: self.recv_gradients,
            Op.ALLREDUCE_TIED: self.all_reduce_tied,
            Op.ALLREDUCE_REPLICAS: self.all_reduce_replicas,
            Op.STEP: self.step,
            Op.STASH: self.stash,
            Op.UPDATE: self.update,
        }

    def _timed(self, handler: Handler) -> Handler:
        """``handler``, adding the wall time of each instruction it completes to its stage's
        compute time in ``stats``."""

        def run(instr: Instr) -> bool:
            start = time.perf_counter_ns()
            done = handler(instr)
            if done:
                forward = instr.op in FORWARD_OPS
                self.stats.add_compute(instr.stage, forward, time.perf_counter_ns() - start)
            return done

        return run

    # -- forward -------------------------------------------------------------------------

    def forward(self, instr: Instr) -> bool:
        j, i = instr.stage, _mb(instr)
        args = [self._input(j, i, name) for name in self.layout.inputs[j]]
        weights = self.versions.leaves(j, i) if self.training else None
        keep = self.training and instr.op == Op.F
        kept = args
        if self.training and not keep and j == 0:  # the model may write its inputs in place:
            kept = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]  # recompute
        with torch.set_grad_enabled(keep), self._counting(j, i, keep) as saved:
            with seeded(self.rng_base, j, i):
                outs = self._call(j, args, weights)
        if self.training:
            nbytes = sum(saved.values()) if keep else self._bytes(kept)
            fused = self.compiled is not None and self.compiled.active(j)
            self.held[(j, i)] = Held(kept, outs if keep else None, weights, nbytes, fused=fused)
            self.stats.devices[self.layout.stage_device[j]].hold(nbytes)
        self._deliver(j, i, outs)
        if j == self.layout.last:
            self.results[i] = tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in outs)
            if self.whole is not None:
                self._whole_loss(i, outs)
            elif self.training:
                self.losses[i] = self._loss(outs, i)
        return True

    def _whole_loss(self, i: int, outs: tuple[Any, ...]) -> None:
        """Keep micro-batch ``i``'s outputs; after the last, the loss over the whole batch and
        each kept micro-batch's backward root (``WholeLoss``)."""
        assert self.whole is not None
        if not self.whole.add(i, outs):
            return
        last = self.layout.last
        with self._inside(last, "loss", i), autocast(self.precision, device_of(self.modules[last])):
            assert self.whole_targets is not None
            scale = self.loss_scale * len(self.microbatches)
            self.whole.compute(self._joined_loss, self.whole_targets, scale)
        for k in range(len(self.microbatches)):
            held = self.held.get((last, k))
            kept = held.outs if held is not None and held.outs is not None else self.results[k]
            self.losses[k] = self.whole.surrogate(k, kept)

    def _joined_loss(self, joined: list[Any], targets: Sequence[torch.Tensor]) -> torch.Tensor:
        assert self.loss_fn is not None
        if self.joined_output is not None:
            output = self.joined_output(joined)
        else:
            output = pytree.tree_unflatten(joined, self.layout.output_spec)
        return call_loss_fn(self.loss_fn, output, tuple(targets))

    def _call(self, j: int, args: list[Any], weights: dict[str, torch.Tensor] | None) -> tuple:
        """Stage j's forward; a failure names the line of the stage file it happened on."""
        module = self.modules[j]
        try:
            with autocast(self.precision, device_of(module)):
                if self.compiled is not None and self.compiled.active(j):
                    outs = self.compiled.call(j, module, args, weights)
                    if outs is not None:
                        return outs
                if weights is None:
                    return tuple(module(*args))
                return tuple(functional_call(module, weights, tuple(args)))
        except PipecompileError:
            raise
        except Exception as err:
            line = _line_in(err, type(module).forward)
            raise RuntimeFailure(f"stage {j} forward{line}: {type(err).__name__}: {err}") from err

    def _deliver(self, j: int, i: int, outs: tuple[Any, ...]) -> None:
        if any(self.layout.remote(j, dst) for _, dst in self.layout.out_edges[j]):
            self.to_send[(j, i)] = outs
        for name, value in zip(self.layout.outputs[j], outs):
            for value_name, dst in self.layout.out_edges[j]:
                if value_name == name and not self.layout.remote(j, dst):
                    self.received.setdefault((dst, i), {})[name] = value

    # -- backward ------------------------------------------------------------------------

    def backward(self, instr: Instr) -> bool:
        """B: the whole backward; I: only the gradients of the stage inputs (W follows)."""
        j, i = instr.stage, _mb(instr)
        held = self.held[(j, i)]
        if self.on_backward is not None and instr.op == Op.B:
            self.backwards[j] = self.backwards.get(j, 0) + 1
            self.on_backward(j, self.backwards[j] == len(self.microbatches))
        outs = held.outs if held.outs is not None else self._recompute(j, i, held)
        roots, grads = self._roots(j, i, outs)
        args = held.args
        if instr.op == Op.B or held.fused:
            if roots:
                torch.autograd.backward(roots, grads)
            grads_in = {n: _grad(a) for n, a in zip(self.layout.inputs[j], args)}
            if instr.op == Op.B:
                self._finish(j, i)
        else:
            wanted = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            found = (
                torch.autograd.grad(roots, wanted, grads, retain_graph=True, allow_unused=True)
                if roots and wanted
                else ()
            )
            by_id = {id(a): g for a, g in zip(wanted, found)}
            grads_in = {n: by_id.get(id(a)) for n, a in zip(self.layout.inputs[j], args)}
            held.roots, held.root_grads = roots, grads
        if j > 0:
            for name, src in self.layout.in_edges[j]:
                if not self.layout.remote(src, j):
                    self._add_out_grad(src, i, name, grads_in[name])
            self.in_grads[(j, i)] = grads_in
        return True

    def backward_weights(self, instr: Instr) -> bool:
        """W: parameter gradients of a micro-batch whose I has run."""
        j, i = instr.stage, _mb(instr)
        held = self.held[(j, i)]
        params = list(held.weights.values()) if held.weights else list(self.modules[j].parameters())
        params = [p for p in params if p.requires_grad]
        if held.roots and params:
            torch.autograd.backward(held.roots, held.root_grads, inputs=params)
        self._finish(j, i)
        return True

    def _roots(self, j: int, i: int, outs: tuple[Any, ...]) -> tuple[list, list]:
        """What backward starts from: the loss on the last stage, else the outputs with the
        gradients their consumers sent back."""
        if j == self.layout.last:
            loss = self.losses[i]
            return ([loss], [None]) if loss.requires_grad else ([], [])
        grads = self.out_grads.pop((j, i), {})
        pairs = [
            (out, grads[name].to(out.dtype))  # a gradient sent in low precision
            for name, out in zip(self.layout.outputs[j], outs)
            if grads.get(name) is not None and isinstance(out, torch.Tensor) and out.requires_grad
        ]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def _recompute(self, j: int, i: int, held: Held) -> tuple[Any, ...]:
        """Re-run a recomputed forward (FC) with autograd on. Buffers the recomputation updates
        (BatchNorm statistics) are put back by swapping the saved copies in, not by copying
        in place, since autograd may have saved the updated tensors."""
        owners = [(sub, dict(sub._buffers)) for sub in self.modules[j].modules() if sub._buffers]
        copies = [
            (sub, {n: b.clone() if b is not None else None for n, b in bufs.items()})
            for sub, bufs in owners
        ]
        with (
            self._inside(j, "recompute", i),
            torch.enable_grad(),
            self._counting(j, i, True) as saved,
        ):
            with seeded(self.rng_base, j, i):  # the forward's own random numbers
                outs = self._call(j, held.args, held.weights)
        for sub, bufs in copies:
            sub._buffers.update(bufs)
        if j == self.layout.last:
            whole = self.whole
            self.losses[i] = whole.surrogate(i, outs) if whole is not None else self._loss(outs, i)
        grown = max(0, sum(saved.values()) - held.nbytes)
        held.nbytes += grown
        self.stats.devices[self.layout.stage_device[j]].grow(grown)
        return outs

    def _finish(self, j: int, i: int) -> None:
        held = self.held.pop((j, i))
        self.stats.devices[self.layout.stage_device[j]].release(held.nbytes)
        grads = self.versions.take_grads(j, i)
        if grads is not None:
            self.update_grads[(j, i)] = grads

    # -- communication -------------------------------------------------------------------

    def send_activations(self, instr: Instr) -> bool:
        j, i = instr.stage, _mb(instr)
        outs = dict(zip(self.layout.outputs[j], self.to_send.pop((j, i))))
        for name, dst in self.layout.out_edges[j]:
            if self.layout.remote(j, dst):
                value = for_wire(outs[name].detach(), self.precision)
                self.backend.send(MessageKey("F", j, dst, i, name), value)
        return True

    def receive_keys(self, instr: Instr) -> list[MessageKey]:
        """The messages a RECV_F or RECV_B instruction takes."""
        j, i = instr.stage, _mb(instr)
        if instr.op == Op.RECV_F:
            return [
                MessageKey("F", s, j, i, n)
                for n, s in self.layout.in_edges[j]
                if self.layout.remote(s, j)
            ]
        return [
            MessageKey("B", j, d, i, n)
            for n, d in self.layout.out_edges[j]
            if self.layout.remote(j, d)
        ]

    def recv_activations(self, instr: Instr) -> bool:
        j, i = instr.stage, _mb(instr)
        keys = self.receive_keys(instr)
        if not self.backend.ready(keys):
            return False
        box = self.received.setdefault((j, i), {})
        for key in keys:
            box[key.value] = self.backend.recv(key)
        return True

    def send_gradients(self, instr: Instr) -> bool:
        j, i = instr.stage, _mb(instr)
        grads = self.in_grads.pop((j, i))
        for name, src in self.layout.in_edges[j]:
            if self.layout.remote(src, j):
                self.backend.send(MessageKey("B", src, j, i, name), grads.get(name))
        return True

    def recv_gradients(self, instr: Instr) -> bool:
        j, i = instr.stage, _mb(instr)
        keys = self.receive_keys(instr)
        if not self.backend.ready(keys):
            return False
        for key in keys:
            self._add_out_grad(j, i, key.value, self.backend.recv(key))
        return True

    def all_reduce_tied(self, instr: Instr) -> bool:
        """Contribute the stage's tied gradients to their sums; the STEP waits for them. With
        a micro-batch (PipeDream-2BW), the window's gradients awaiting its UPDATE, summed
        under the window's own key, which that UPDATE waits for."""
        j, i = instr.stage, instr.microbatch
        params = dict(self.modules[j].named_parameters(remove_duplicate=False))
        window = self._window_grads(j) if i is not None else {}
        for key, held in self._tied_here(j):
            param = params[held[j]]
            grad = param.grad if i is None else window.get(held[j])
            grad = grad if grad is not None else torch.zeros_like(param)
            self.backend.contribute(tie_round(key, i), j, sorted(held), local_part(grad))
        return True

    def _tied_here(self, j: int) -> list[tuple[tuple[str, ...], dict[int, str]]]:
        """The tied tensors stage j holds that are parameters: a buffer several stages share
        (a table of rotary frequencies) is tied too, but has no gradient to sum. Kept for
        the step: a STEP waiting for the sums asks again each time the devices take turns."""
        if j not in self._tied:
            params = dict(self.modules[j].named_parameters(remove_duplicate=False))
            ties = self.layout.ties.items()
            self._tied[j] = [(k, held) for k, held in ties if held.get(j) in params]
        return self._tied[j]

    def _window_grads(self, j: int) -> dict[str, torch.Tensor]:
        """Stage j's gradients of every micro-batch since its last UPDATE, summed by name."""
        summed: dict[str, torch.Tensor] = {}
        for key in sorted(k for k in self.update_grads if k[0] == j):
            for name, grad in self.update_grads[key].items():
                if grad is not None:
                    summed[name] = summed[name] + grad if name in summed else grad
        return summed

    def all_reduce_replicas(self, instr: Instr) -> bool:
        """Sum the stage's gradients over its replicas (tied parameters excepted: their
        ALLREDUCE_TIED already sums over every rank holding them)."""
        j = instr.stage
        tied = {held[j] for held in self.layout.ties.values() if j in held}
        module = self.modules[j]
        assert module is not None
        self.backend.reduce_replicas(j, [p for n, p in module.named_parameters() if n not in tied])
        return True

    def _take_tied_sums(self, j: int) -> bool:
        mine = self._tied_here(j)
        if any(not self.backend.has_reduced(key, j) for key, _ in mine):
            return False
        params = dict(self.modules[j].named_parameters(remove_duplicate=False))
        for key, held in mine:
            total = self.backend.reduced(key, j)
            assert isinstance(total, torch.Tensor)
            params[held[j]].grad = laid_out_like(params[held[j]], total.clone())
        return True

    # -- weights -------------------------------------------------------------------------

    def step(self, instr: Instr) -> bool:
        """Optimizer step, then zero the gradients (zeroed even without an optimizer, so the
        next step never accumulates onto this one's). A stage holding tied parameters first
        waits for their sums (see ALLREDUCE_TIED). With ``keep_grads`` it only takes the tied
        sums and leaves every gradient in place."""
        j = instr.stage
        if not self._take_tied_sums(j):
            return False
        if self.on_step is not None:
            self.on_step(j)
        if self.keep_grads:
            return True
        optimizer = self.optimizers[j] if self.optimizers is not None else None
        if optimizer is not None:
            optimizer.step()
        self.modules[j].zero_grad(set_to_none=True)
        return True

    def stash(self, instr: Instr) -> bool:
        if self.training:
            self.versions.stash(instr.stage, _mb(instr))
        return True

    def update(self, instr: Instr) -> bool:
        j, i = instr.stage, _mb(instr)
        if self.optimizers is None:
            raise RuntimeFailure(
                "an asynchronous program (UPDATE) needs an optimizer; call set_optimizer first"
            )
        mine = self._tied_here(j)
        if any(not self.backend.has_reduced(tie_round(key, i), j) for key, _ in mine):
            return False  # PipeDream-2BW: the tied peers' window sums are not all in yet
        summed = self._window_grads(j)  # one micro-batch's (PipeDream) or a window's
        for key in [k for k in self.update_grads if k[0] == j]:
            del self.update_grads[key]
        for name, param in self.modules[j].named_parameters():
            param.grad = summed.get(name)
        params = dict(self.modules[j].named_parameters(remove_duplicate=False))
        for key, held in mine:
            total = self.backend.reduced(tie_round(key, i), j)
            assert isinstance(total, torch.Tensor)
            params[held[j]].grad = total.clone()
        if self.on_step is not None:
            self.on_step(j)
        optimizer = self.optimizers[j]
        if optimizer is not None:
            optimizer.step()
        self.modules[j].zero_grad(set_to_none=True)
        self.versions.bump(j)
        return True

    # -- helpers -------------------------------------------------------------------------

    def _input(self, j: int, i: int, name: str) -> Any:
        if j == 0:
            return self.microbatches[i][name]
        value = self.received[(j, i)].pop(name)
        if isinstance(value, torch.Tensor):
            value = value.detach().requires_grad_(value.is_floating_point() and self.training)
        return value

    def _loss(self, outs: tuple[Any, ...], i: int) -> torch.Tensor:
        assert self.loss_fn is not None and self.targets is not None
        output = pytree.tree_unflatten(list(outs), self.layout.output_spec)
        count = len(self.microbatches)
        check_target_rows(
            output, self.targets[i], self.microbatches[i], split=count > 1, scale=count
        )
        last = self.layout.last
        with self._inside(last, "loss", i), autocast(self.precision, device_of(self.modules[last])):
            loss = call_loss_fn(self.loss_fn, output, self.targets[i])
        if not loss.requires_grad and any(
            t.requires_grad for t in outs if isinstance(t, torch.Tensor)
        ):
            raise ModelFileError(
                f"loss_fn ({defined_at(self.loss_fn)}) returned a loss that does not require "
                "grad (a new or detached tensor: torch.tensor(...), .detach(), .item()), so "
                "training could not change a weight; compute it from the output with torch ops"
            )
        share = self.shares[i] if self.shares is not None else 1.0
        return loss.float() * (self.loss_scale * share)

    def _add_out_grad(self, j: int, i: int, name: str, grad: torch.Tensor | None) -> None:
        if grad is None:
            return
        box = self.out_grads.setdefault((j, i), {})
        box[name] = grad if name not in box else box[name] + grad

    def _inside(self, j: int, what: str, i: int) -> AbstractContextManager:
        """A traced step's span of ``what`` (loss, recompute) inside stage j's instruction for
        micro-batch i, on the compute track of its device; nothing when not traced."""
        if self.span is None:
            return nullcontext()
        return self.span(self.layout.stage_device[j], "compute", what, what, microbatch=i)

    def _counting(self, j: int, i: int, active: bool):  # type: ignore[no-untyped-def]
        """Count the bytes autograd saves (parameters, buffers and stashed weights aside)."""
        if not (active and self.measure_memory):
            return _NoCount()
        module = self.modules[j]
        exclude = list(module.parameters()) + list(module.buffers()) + self.versions.storages(j, i)
        return count_saved(exclude)

    def _bytes(self, args: list[Any]) -> int:
        return tensor_bytes(args) if self.measure_memory else 0


class _NoCount:
    def __enter__(self) -> dict[int, int]:
        return {}

    def __exit__(self, *exc: object) -> None:
        return None


def _mb(instr: Instr) -> int:
    assert instr.microbatch is not None
    return instr.microbatch


def _grad(value: Any) -> torch.Tensor | None:
    return value.grad if isinstance(value, torch.Tensor) else None


def defined_at(fn: Callable[..., Any]) -> str:
    """``file:line`` where ``fn`` is defined, or its name."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return getattr(fn, "__qualname__", repr(fn))
    return f"{_shown(code.co_filename)}:{code.co_firstlineno}"


def _line_in(err: BaseException, fn: Callable[..., Any]) -> str:
    """`` at FILE:LINE``: the innermost frame of ``err`` in the file defining ``fn``."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    line = innermost_in(err, code.co_filename)
    return f" at {_shown(code.co_filename)}:{line}" if line is not None else ""


def _shown(path: str) -> str:
    """``path`` relative to the working directory when that is shorter."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return relative if len(relative) < len(path) else path


def _parameters(fn: Callable[..., Any]) -> str:
    params = list(inspect.signature(fn).parameters.values())
    names = ", ".join(p.name for p in params)
    return f"{len(params)} argument{'s' * (len(params) != 1)} ({names})"
