"""What `pipecompile MODEL --generate` adds to a compiled directory: the model's prefill and
decode steps traced with a KV cache (``step_trace``), balanced on the decode step's costs
(``step_costs``), split at block boundaries (``step_split``) and written as
``prefill_stage_<j>.py`` and ``decode_stage_<j>.py`` beside the training stages, with the
``generate`` record of the manifest (docs/FORMAT.md) that `show` prints.

The written stages are proved before the directory is put in place: the example's first
sequence is prefilled through them and decoded a few tokens further, and every logit must
equal the eager model's (``prove_generation``)."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from pipecompile.errors import VerifyError
from pipecompile.files.names import GENERATE_CONSTANTS as CONSTANTS
from pipecompile.generation.step_costs import atom_costs, decode_bounds, stage_flops
from pipecompile.generation.step_split import StepStage, split_step
from pipecompile.generation.step_trace import (
    GenerateError,
    StepCall,
    float_dtype,
    layer_shapes,
    trace_step,
)
from pipecompile.ir.records.generation_plan import DTYPES, GenerationPlan, StepStageRecord

__all__ = [
    "GenerationOutput",
    "TracedSteps",
    "trace_generation",
    "plan_generation",
    "prove_generation",
    "block_list",
]

KINDS = ("decode", "prefill")


@dataclass
class GenerationOutput:
    """The plan, each step's stages (``split``, by kind), the source of each file it adds
    (by name: written by the compile, ``codegen.stage_source.step_source``) and the
    constants file's tensors (by stage tensor name)."""

    plan: GenerationPlan
    split: dict[str, list[StepStage]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    constants: dict[str, torch.Tensor] = field(default_factory=dict)

    def files(self) -> dict[str, str | bytes]:
        """Every file to write, by name: the stages' sources, the constants' safetensors."""
        out: dict[str, str | bytes] = dict(self.sources)
        if self.constants:
            from safetensors.torch import save

            out[CONSTANTS] = save({k: v.contiguous() for k, v in self.constants.items()})
        return out


def block_list(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The model's decoder blocks: its ``nn.ModuleList`` holding the most parameters.

    Raises:
        GenerateError: the model has none.
    """
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not lists:
        raise GenerateError(
            f"{type(model).__name__} has no list of blocks (an nn.ModuleList): --generate "
            "splits a causal LM's decoder blocks into stages; compile without --generate"
        )
    return max(lists, key=lambda nm: sum(p.numel() for p in nm[1].parameters()))


def _position_limit(model: nn.Module) -> int | None:
    """The most positions the model's config says it embeds (None: it says nothing)."""
    config = getattr(model, "config", None)
    for word in ("max_position_embeddings", "n_positions", "block_size"):
        value = getattr(config, word, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _training_blocks(
    path: str, count: int, stage_params: list[list[str]]
) -> tuple[tuple[int, int], ...]:
    """Each training stage's blocks: block i where the stages keep most of its parameters
    (never before the previous block's stage)."""
    owner: list[int] = []
    for i in range(count):
        prefix = f"{path}.{i}."
        held = [sum(n.startswith(prefix) for n in names) for names in stage_params]
        best = max(range(len(held)), key=lambda s: (held[s], -s)) if any(held) else 0
        owner.append(max(best, owner[-1] if owner else 0))
    bounds = []
    for s in range(len(stage_params)):
        mine = [i for i, o in enumerate(owner) if o == s]
        start = mine[0] if mine else (bounds[-1][1] if bounds else 0)
        bounds.append((start, mine[-1] + 1 if mine else start))
    return tuple(bounds)


@dataclass
class TracedSteps:
    """The model's prefill and decode steps, traced (``trace_generation``): its block list's
    path, each layer's cache shape, the cache's length and
    rows, the two graphs and each one's atom costs; ``seconds`` it took."""

    path: str
    shapes: list[tuple[int, int]]
    max_length: int
    rows: int
    traced: dict[str, torch.fx.GraphModule]
    costs: dict[str, list[int]]
    seconds: float = 0.0

    @property
    def prefix(self) -> str:
        return f"model.{self.path}."


def trace_generation(
    model: nn.Module, *, max_length: int | None, rows: int | None, prompt_tokens: int = 16
) -> TracedSteps:
    """``model``'s prefill and decode steps traced with a KV cache, before the training
    compile (a model that cannot take a step is refused at once).

    Raises:
        GenerateError: the model's step cannot be traced with a KV cache (the reason and the
            line), or ``max_length`` is past the positions it embeds.
    """
    start = time.perf_counter()
    call = StepCall.of(model)
    path, blocks = block_list(model)
    limit = _position_limit(model)
    if max_length is None:
        max_length = min(limit or 2048, 2048)
    elif limit is not None and max_length > limit:
        raise GenerateError(
            f"--max-length {max_length} is past the {limit} positions {type(model).__name__} "
            f"embeds (its config): give --max-length {limit} or less"
        )
    rows = rows or 1
    shapes = layer_shapes(model, call, len(blocks))
    if len(shapes) != len(blocks):
        raise GenerateError(
            f"{type(model).__name__} caches {len(shapes)} layers, but its block list {path} "
            f"holds {len(blocks)} blocks: --generate places each block's cache on its stage; "
            "compile without --generate"
        )
    traced = {
        k: trace_step(model, call, shapes, kind=k, rows=rows, max_length=max_length) for k in KINDS
    }
    steps = TracedSteps(path, shapes, max_length, rows, traced, costs={})
    tokens = max(2, min(prompt_tokens, max_length))
    steps.costs = {
        k: atom_costs(traced[k], steps.prefix, shapes, tokens=t, max_length=max_length)
        for k, t in (("decode", 1), ("prefill", tokens))
    }
    steps.seconds = time.perf_counter() - start
    return steps


def plan_generation(
    model: nn.Module,
    steps: TracedSteps,
    stage_params: list[list[str]],
    *,
    lanes: int | None,
) -> GenerationOutput:
    """The decoding stages of ``model``'s traced ``steps``, as many as the training stages
    (which hold ``stage_params``, each stage's parameters by the model's names).

    Raises:
        GenerateError: the model has fewer blocks and head than stages, or a stage would
            hand on a value that is no tensor.
    """
    shapes, max_length, rows = steps.shapes, steps.max_length, steps.rows
    lanes = lanes or len(stage_params)
    prefix, traced, costs = steps.prefix, steps.traced, steps.costs
    path = steps.path
    bounds = decode_bounds(costs["decode"], len(stage_params))
    names = set(model.state_dict())
    split = {
        k: split_step(traced[k], prefix=prefix, bounds=bounds, model_names=names, kind=k)
        for k in KINDS
    }
    dtype = str(float_dtype(model)).removeprefix("torch.")
    training = _training_blocks(path, len(shapes), stage_params)
    out = GenerationOutput(
        GenerationPlan(
            model=type(model).__name__,
            max_length=max_length,
            lanes=lanes,
            rows=rows,
            dtype=dtype if dtype in DTYPES else "float32",
            vocab=_vocab(traced["decode"]),
            layers=tuple(shapes),
            stages_=_records(model, split, bounds, costs),
            training_blocks=training,
            training_flops=tuple(stage_flops(costs["decode"], training)),
        )
    )
    out.split = split
    out.constants = {
        n: t for k in KINDS for s in split[k] for n, t in s.constants.items() if not t.is_meta
    }
    return out


def _vocab(traced: torch.fx.GraphModule) -> int:
    """The logits' width: the vocabulary."""
    out = next(n for n in traced.graph.nodes if n.op == "output")
    (logits,) = out.all_input_nodes
    return int(logits.meta["val"].shape[-1])


def _records(
    model: nn.Module,
    split: dict[str, list[StepStage]],
    bounds: tuple[tuple[int, int], ...],
    costs: dict[str, list[int]],
) -> tuple[StepStageRecord, ...]:
    from pipecompile.generation.session import tensor_aliases

    aliases = tensor_aliases(model)
    flops = {k: stage_flops(costs[k], bounds) for k in KINDS}
    out = []
    for j, b in enumerate(bounds):
        params: dict[str, tuple[str, ...]] = {}
        constants: dict[str, str] = {}
        for k in KINDS:
            s = split[k][j]
            params.update({a: tuple(aliases.get(n, [n])) for a, n in s.params.items()})
            constants.update(s.constant_names)
        out.append(
            StepStageRecord(
                blocks=b,
                sends={k: len(split[k][j].outputs) for k in KINDS},
                params=params,
                constants=dict(sorted(constants.items())),
                decode_flops=flops["decode"][j],
                prefill_flops=flops["prefill"][j],
            )
        )
    return tuple(out)


def prove_generation(model: nn.Module, out: GenerationOutput, ids: torch.Tensor) -> None:
    """Prefill the first row of ``ids`` but its last 2 tokens through the stages as written
    (``out.sources``), decode those 2, and compare every step's logits with the eager
    model's.

    Raises:
        VerifyError: a logit differs by more than 1e-5 (relative to the largest) and by more
            than the rounding of the eager logits allows (``ir.noise_floor``, against the
            model in float64).
    """
    from pipecompile.generation.lanes import Lanes
    from pipecompile.generation.stages import DecodeStage, stage_modules_from

    plan = out.plan
    was_training = model.training
    model.eval()
    tensors = {**_model_tensors(model, plan), **out.constants}
    stages = [
        DecodeStage(plan, k, stage_modules_from(out.sources.__getitem__, plan, k, tensors))
        for k in range(plan.stages)
    ]
    row = [int(t) for t in ids.reshape(-1, ids.shape[-1])[0][: plan.max_length]]
    if len(row) < 3:
        return
    book = Lanes([row[:-2]], plan.lanes, plan.rows, 3)
    forced = iter(row[-2:])
    try:
        for step in range(3):
            turn = book.turn(0)
            assert turn is not None
            xs = turn.ids
            for stage in stages:
                xs = stage.run(0, turn.calls, xs)
            known = len(row) - 2 + step
            with torch.no_grad():
                eager = model(torch.tensor([row[:known]]))
            logits = eager.logits if hasattr(eager, "logits") else eager
            want = logits[0, -1].float()
            _check_logits(model, plan, xs[0][0], want, row[:known], step)
            book.give(turn, [next(forced, 0)])
    finally:
        model.train(was_training)


def _model_tensors(model: nn.Module, plan: GenerationPlan) -> dict[str, torch.Tensor]:
    """Each stage tensor's value in ``model``, by the stage's name for it."""
    state = model.state_dict(keep_vars=True)
    return {
        attr: state[names[0]].detach()
        for s in plan.stages_
        for attr, names in s.params.items()
        if names[0] in state
    }


def _check_logits(
    model: nn.Module,
    plan: GenerationPlan,
    got: torch.Tensor,
    want: torch.Tensor,
    tokens: list[int],
    step: int,
) -> None:
    """Within 1e-5 of the largest logit, or else within the noise floor of the eager logits
    (a model with large activations rounds more): measured against a float64 copy, made only
    when the first test fails (it doubles the model's memory)."""
    from pipecompile.ir.graph.noise_floor import agreement

    scale = max(1.0, float(want.abs().max()))
    if float((got - want).abs().max()) <= 1e-5 * scale:
        return
    exact = None
    if all(p.dtype == torch.float32 for p in model.parameters()):
        twin = copy.deepcopy(model).double().eval()
        with torch.no_grad():
            out = twin(torch.tensor([tokens]))
        exact = (out.logits if hasattr(out, "logits") else out)[0, -1]
        del twin
    found = agreement(got, want, exact)
    if not found.ok:
        raise VerifyError(
            f"--generate: the traced {plan.model} decoding stages' logits differ from the "
            f"eager model's at position {len(tokens) - 1} (step {step}): {found}; its step with "
            "a KV cache does not compute what its forward does (a cache that ignores "
            "positions?); compile without --generate"
        )
