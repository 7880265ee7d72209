"""Prove a compiled directory before it is put in place: its stage files compute the model.

Every emitted stage module, built from its source and its weights file as a run builds it, is
chained on the example micro-batch, forward and backward (a fixed random cotangent on every
output), and compared with the eager model run in its own dtype and in float64
(``ir.noise_floor``: the allowed error is a multiple of the rounding the model itself makes).
Where they disagree - or where the stages draw random numbers, which the eager model draws in
another order - each stage is compared alone with its traced graph, on the same inputs and
with the same random numbers, and the first node that differs is named.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from safetensors.torch import load_file
from torch import nn
from torch.utils import _pytree as pytree

from pipecompile.errors import VerifyError
from pipecompile.ir.graph.microbatch import split_microbatches
from pipecompile.ir.graph.noise_floor import Agreement, agreement, within_rounding
from pipecompile.ir.graph.stage_graph import Stage, StageGraph
from pipecompile.ir.graph.swapped_call import functional_call
from pipecompile.ir.records.compiled import Compiled
from pipecompile.model.init_recipe import is_meta_model
from pipecompile.model.own_forward import tracing
from pipecompile.model.without_init import build_loaded

__all__ = ["Example", "StageFiles", "proof_example", "prove_stages"]

SEED = 20261126  # the random numbers of every run compared: the same for each


@dataclass(frozen=True)
class Example:
    """What a directory is proved on: the eager model and one micro-batch of its inputs."""

    model: nn.Module
    inputs: dict[str, torch.Tensor]


def proof_example(
    model: nn.Module, inputs: dict[str, torch.Tensor], compiled: Compiled
) -> Example | None:
    """The first micro-batch of ``inputs`` to prove ``compiled``'s directory on, or None for a
    model on the meta device (no weights to run) or with ``PIPECOMPILE_VERIFY=off`` in the
    environment (as ``--no-verify``: the test suite's compiles, whose tests compare with eager
    themselves)."""
    if is_meta_model(model) or os.environ.get("PIPECOMPILE_VERIFY") == "off":
        return None
    return Example(model, split_microbatches(inputs, compiled.program.microbatches)[0])


@dataclass(frozen=True)
class StageFiles:
    """Stage ``stage.index`` as written: its source, class, weights file (None: the stage's
    tensors come from elsewhere and are copied from ``lowered``) and its traced graph."""

    stage: Stage
    source: str
    class_name: str
    weights: Path | None
    lowered: fx.GraphModule
    random: bool


def prove_stages(
    graph: StageGraph, files: Sequence[StageFiles], example: Example, tail: str | None = None
) -> str:
    """Check the emitted stages against the eager model and their traced graphs; return a
    one-line summary. ``tail``: the source of the batch-coupled tail (tail.py), run on the
    last stage's outputs (on the one micro-batch, the model's outputs for it).

    Raises:
        VerifyError: naming the stage, the node, its module path and both values.
    """
    stages = [_build(f, example.model.training) for f in files]
    random = any(f.random for f in files)
    if not random:
        run = _chain(graph, stages, example.inputs, _built_tail(tail))
        worst = _against_eager(files, run, example)
        if worst is None:
            return "the emitted stages equal the eager model on the example micro-batch"
        # the chain's training forward moved their batch norms' statistics and counters
        stages = [_build(f, example.model.training) for f in files]
    values = {n: example.inputs[n] for n in graph.model_inputs}
    for f, stage in zip(files, stages):  # each on what the traced stages before it give
        outputs = _against_graph(f, stage, [values[n] for n in f.stage.inputs])
        values.update(zip(f.stage.outputs, outputs))
    if random:
        return "each emitted stage equals its traced graph (random ops: not compared to eager)"
    name, found = worst  # type: ignore[misc]
    raise VerifyError(
        f"the traced model does not compute what the eager model does: {name} differs "
        f"({found}), though every stage file equals its traced graph. This is a pipecompile "
        "bug in tracing or splitting: please report it with the model file (--no-verify "
        "writes the directory anyway)"
    )


@dataclass
class _Run:
    stages: list[nn.Module]
    outputs: list[torch.Tensor]


def _build(f: StageFiles, training: bool) -> nn.Module:
    """Stage ``f`` from its source and weights, as a run builds it."""
    namespace: dict[str, Any] = {"__name__": f"pipecompile_proof_stage_{f.stage.index}"}
    try:
        exec(compile(f.source, f"stage_{f.stage.index}.py", "exec"), namespace)  # noqa: S102
        cls = namespace[f.class_name]
        if f.weights is not None:
            stage = build_loaded(cls, load_file(str(f.weights)))
        else:
            stage = cls()
            stage.load_state_dict(f.lowered.state_dict(), strict=True)
    except Exception as err:
        raise VerifyError(
            f"stage {f.stage.index}'s emitted file does not build: {type(err).__name__}: {err}. "
            "This is a pipecompile bug: please report it with the model file"
        ) from err
    return stage.train(training)


def _chain(
    graph: StageGraph,
    stages: list[nn.Module],
    inputs: dict[str, torch.Tensor],
    tail: nn.Module | None = None,
) -> _Run:
    values = {n: inputs[n] for n in graph.model_inputs}
    for j, (stage, entry) in enumerate(zip(stages, graph.stages)):
        torch.manual_seed(SEED + j)
        outs = stage(*(values[n] for n in entry.inputs))
        values.update(zip(entry.outputs, outs))
    outputs = [values[n] for n in graph.model_outputs]
    if tail is not None:
        outputs = [o for o in tail(*outputs) if isinstance(o, torch.Tensor)]
    return _Run(stages, outputs)


def _built_tail(source: str | None) -> nn.Module | None:
    """The tail from its emitted source, as a run builds it."""
    if source is None:
        return None
    namespace: dict[str, Any] = {"__name__": "pipecompile_proof_tail"}
    try:
        exec(compile(source, "tail.py", "exec"), namespace)  # noqa: S102
        return namespace["Tail"]()
    except Exception as err:
        raise VerifyError(
            f"the emitted tail.py does not build: {type(err).__name__}: {err}. This is a "
            "pipecompile bug: please report it with the model file"
        ) from err


def _against_eager(
    files: Sequence[StageFiles], run: _Run, example: Example
) -> tuple[str, Agreement] | None:
    """The worst disagreement of the chained stages' outputs and gradients with the eager
    model's, or None when all agree. The float64 run that sets the noise floors is made only
    when some value is further from the eager model's than rounding on its last bits."""
    want, want_grads = _eager(example, torch.get_default_dtype())
    _backward(run.outputs)
    have = _stage_grads(files, run.stages)
    pairs = [(f"model output {k}", o, w) for k, (o, w) in enumerate(zip(run.outputs, want))]
    pairs += [(f"the gradient of {n}", have.get(n), g) for n, g in want_grads.items()]
    if len(run.outputs) == len(want) and all(
        h is not None and within_rounding(h, w) for _, h, w in pairs
    ):
        return None
    twins: list[torch.Tensor | None] = [None] * len(pairs)
    try:
        exact, exact_grads = _eager(example, torch.float64)
        twins = [*exact, *(exact_grads.get(n) for n in want_grads)]
    except Exception:  # a model fixed to its dtype: a fixed tolerance (noise_floor.FIXED)
        pass
    worst: tuple[str, Agreement] | None = None
    for (name, result, reference), twin in zip(pairs, twins):
        found = Agreement(float("inf"), 0.0, 0.0)
        if result is not None:
            found = agreement(result, reference, twin)
        if not found.ok and (worst is None or not found.ratio <= worst[1].ratio):
            worst = (name, found)
    return worst


def _same(have: torch.Tensor | None, want: torch.Tensor) -> bool:
    return have is not None and have.shape == want.shape and bool(torch.equal(have, want))


def _eager(
    example: Example, dtype: torch.dtype
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """The eager model's outputs and gradients (``dtype``: float64 for the twin run), on
    copies of its tensors: the user's model, its buffers and gradients are left as they are,
    and nothing of it needs to be deep-copyable."""
    model = example.model
    widen = dtype != torch.get_default_dtype()

    def fresh(t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        return (t.to(dtype) if widen and t.is_floating_point() else t).clone()

    def leaf(p: torch.Tensor) -> torch.Tensor:  # read, never written: its memory is shared
        wide = p.detach().to(dtype) if widen and p.is_floating_point() else p.detach()
        return wide.requires_grad_(p.requires_grad)

    params = {n: leaf(p) for n, p in model.named_parameters()}
    buffers = {n: fresh(b) for n, b in model.named_buffers()}
    inputs = {k: fresh(v) if v.is_floating_point() else v for k, v in example.inputs.items()}
    torch.manual_seed(SEED)
    with tracing():  # a @pipecompile.pipeline model runs its own forward, not its pipeline
        returned = functional_call(model, {**params, **buffers}, (), inputs, tie_weights=True)
    outputs = [o for o in pytree.tree_leaves(returned) if isinstance(o, torch.Tensor)]
    _backward(outputs)
    return outputs, {n: p.grad for n, p in params.items() if p.grad is not None}


def _in_dtype(
    module: nn.Module, inputs: dict[str, torch.Tensor], dtype: torch.dtype
) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    if dtype == torch.get_default_dtype():
        return module, dict(inputs)
    moved = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    return module.to(dtype), moved


def _backward(outputs: Sequence[torch.Tensor]) -> None:
    """Backward from ``outputs`` with fixed random cotangents (the same for every run)."""
    generator = torch.Generator().manual_seed(SEED)
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    for o in outputs:
        if not o.is_floating_point():
            continue
        cotangent = torch.randn(o.shape, generator=generator, dtype=torch.float64)
        if o.requires_grad:
            pairs.append((o, cotangent.to(o.dtype)))
    if pairs:
        torch.autograd.backward([o for o, _ in pairs], [c for _, c in pairs])


def _stage_grads(files: Sequence[StageFiles], stages: list[nn.Module]) -> dict[str, torch.Tensor]:
    """Each original parameter's gradient, summed over the stages holding it (a tied one). A
    stage holding one parameter under two names (a module's weight, and the same tensor kept
    for reading its dtype) counts its gradient once."""
    grads: dict[str, torch.Tensor] = {}
    for f, stage in zip(files, stages):
        counted: set[tuple[int, str]] = set()
        for name, p in stage.named_parameters(remove_duplicate=False):
            if p.grad is None:
                continue
            for original in f.stage.params.get(name, ()):
                if (id(p), original) in counted:
                    continue
                counted.add((id(p), original))
                grads[original] = grads[original] + p.grad if original in grads else p.grad
    return grads


def _against_graph(
    f: StageFiles, stage: nn.Module, inputs: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Run stage ``f`` alone, as emitted and as traced, on ``inputs`` with the same random
    numbers, forward and backward; raise at the first node whose value differs, or naming
    the gradient that does. Returns the traced stage's outputs."""
    reference = _light_copy(f.lowered).train(stage.training)
    have = _stage_step(stage, inputs)
    want = _stage_step(reference, inputs)
    outputs = [v for k, v in want.items() if k.startswith("output ")]
    if all(_same(h, w) for h, w in zip(have.values(), want.values())):
        return outputs
    wide, wide_inputs = _in_dtype(copy.deepcopy(reference), dict(enumerate(inputs)), torch.float64)
    try:
        exact: dict[str, torch.Tensor] = _stage_step(wide, list(wide_inputs.values()))
    except Exception:  # a stage fixed to its dtype: a fixed tolerance (noise_floor.FIXED)
        exact, wide = {}, None
    emitted = fx.GraphModule(stage, copy.deepcopy(f.lowered.graph))
    _first_node(f, emitted, reference, wide, inputs, list(wide_inputs.values()))
    for name, value in have.items():
        found = agreement(value, want[name], exact.get(name))
        if not found.ok:
            raise VerifyError(
                f"stage {f.stage.index}'s emitted code does not compute what the traced model "
                f"does: {name} differs ({found}). This is a pipecompile bug: please report it "
                "with the model file (--no-verify writes the directory anyway)"
            )
    return outputs


def _light_copy(module: nn.Module) -> nn.Module:
    """``module`` copied for a run of its own: each parameter a new leaf on the same memory
    (a forward and backward only read it; the gradients go to the copy), each buffer a copy
    of its own (a training forward writes batch norms' running statistics)."""
    memo: dict[int, Any] = {}
    for sub in module.modules():
        for p in sub._parameters.values():
            if p is not None and id(p) not in memo:
                memo[id(p)] = nn.Parameter(p.detach(), requires_grad=p.requires_grad)
        for b in sub._buffers.values():
            if b is not None and id(b) not in memo:
                memo[id(b)] = b.detach().clone()
    return copy.deepcopy(module, memo)


def _stage_step(module: nn.Module, inputs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """A stage's outputs, and the gradients of its inputs and parameters for fixed random
    cotangents, by name."""
    args = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    module.zero_grad(set_to_none=True)
    torch.manual_seed(SEED)
    outs = module(*args)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    _backward(outs)
    found = {f"output {k}": o.detach() for k, o in enumerate(outs)}
    found |= {
        f"the gradient of input {k}": x.grad for k, x in enumerate(args) if x.grad is not None
    }
    params = module.named_parameters()
    return found | {f"the gradient of {n}": p.grad for n, p in params if p.grad is not None}


def _first_node(
    f: StageFiles,
    emitted: fx.GraphModule,
    reference: fx.GraphModule,
    wide: nn.Module | None,
    inputs: list[torch.Tensor],
    wide_inputs: list[torch.Tensor],
) -> None:
    """Raise at the first node of stage ``f`` whose forward value differs beyond its noise."""
    have = _node_values(emitted, inputs)
    want = _node_values(reference, inputs)
    twin = _node_values(wide, wide_inputs) if wide is not None else {}  # type: ignore[arg-type]
    for node in f.lowered.graph.nodes:
        found_twins = twin.get(node.name) or [None] * len(want.get(node.name, ()))
        values = zip(have.get(node.name, ()), want.get(node.name, ()), found_twins)
        for k, (h, w, e) in enumerate(values):
            found = agreement(h, w, e)
            if not found.ok:
                raise VerifyError(_node_message(f, node, k, found, h, w))


def _node_values(module: fx.GraphModule, inputs: list[torch.Tensor]) -> dict[str, list[Any]]:
    """Every node's tensors (an output's in order) by node name when ``module`` runs on
    ``inputs``."""
    recorder = _Recorder(module)
    torch.manual_seed(SEED)
    with torch.no_grad():
        recorder.run(*inputs)
    return recorder.found


class _Recorder(fx.Interpreter):
    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module)
        self.found: dict[str, list[Any]] = {}

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        if n.op not in ("placeholder", "output"):
            leaves = pytree.tree_leaves(value)
            self.found[n.name] = [t.detach() for t in leaves if isinstance(t, torch.Tensor)]
        return value


def _node_message(
    f: StageFiles, node: fx.Node, k: int, found: Agreement, have: torch.Tensor, want: torch.Tensor
) -> str:
    part = f" (its tensor {k})" if k else ""
    return (
        f"stage {f.stage.index}'s emitted code does not compute what the traced model does: "
        f"node {node.name}{part}, {_what(node)}, module path {_module_path(node)}: {found}; "
        f"traced {_sample(want)}, emitted {_sample(have)}. This is a pipecompile bug: please "
        "report it with the model file (--no-verify writes the directory anyway)"
    )


def _what(node: fx.Node) -> str:
    if node.op == "call_module":
        return f"call_module {node.target}"
    name = getattr(node.target, "__name__", str(node.target))
    return f"{node.op} {name}"


def _module_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if stack:
        return str(list(stack.values())[-1][0]) or "(the model itself)"
    return str(node.target) if node.op == "call_module" else "(the model itself)"


def _sample(t: torch.Tensor) -> str:
    flat = t.detach().flatten()[:4].tolist()
    shown = ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in flat)
    return f"{tuple(t.shape)} [{shown}{', ...' if t.numel() > 4 else ''}]"
