"""What `pipecompile MODEL --generate` adds to a compiled directory: which blocks each decode
stage runs (the training stages' own, so every stage keeps its weights), each stage's KV cache
(shape and bytes), and the prefill and decode programs, recorded under the manifest's
``generate`` key (docs/FORMAT.md) and printed by `show`.

The plan is proved before it is written: the example's first sequence is prefilled through
the decode stages and decoded a few tokens further, and every logit must equal the eager
model's (``prove_generation``)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from pipecompile.errors import VerifyError
from pipecompile.generation.families import Family, GenerateError, decoder_family
from pipecompile.generation.stages import DecodeStage
from pipecompile.ir.records.generation_plan import DTYPES, GenerationPlan

__all__ = ["GenerationPlan", "plan_generation", "decode_stages", "prove_generation"]


def _position_limit(family: Family) -> int | None:
    """The most positions the model embeds (learned position tables), None: no table."""
    config = getattr(family.model, "config", None)
    if family.name == "nanogpt":
        return int(family.model.wpe.weight.shape[0])
    if family.name == "gpt2":
        return int(config.n_positions)
    return getattr(config, "max_position_embeddings", None)


def _stage_blocks(family: Family, stage_params: list[list[str]]) -> tuple[tuple[int, int], ...]:
    """Each stage's blocks: block i goes where the training stages keep most of its
    parameters (never before the previous block's stage)."""
    count = len(stage_params)
    owner: list[int] = []
    for i in range(len(family.blocks)):
        prefix = family.block_prefix(i)
        held = [sum(n.startswith(prefix) for n in names) for names in stage_params]
        best = max(range(count), key=lambda s: (held[s], -s)) if any(held) else 0
        owner.append(max(best, owner[-1] if owner else 0))
    bounds = []
    for s in range(count):
        mine = [i for i, o in enumerate(owner) if o == s]
        start = mine[0] if mine else (bounds[-1][1] if bounds else 0)
        bounds.append((start, mine[-1] + 1 if mine else start))
    return tuple(bounds)


def plan_generation(
    model: nn.Module,
    stage_params: list[list[str]],
    *,
    max_length: int | None,
    lanes: int | None,
    rows: int | None,
) -> GenerationPlan:
    """The plan for ``model`` compiled into stages holding ``stage_params`` (each stage's
    parameters by the model's names).

    Raises:
        GenerateError: the model is no decoder pipecompile generates with, or
            ``max_length`` is past the positions it embeds.
    """
    family = decoder_family(model)
    limit = _position_limit(family)
    if max_length is None:
        max_length = min(limit or 2048, 2048)
    elif limit is not None and family.name != "llama" and max_length > limit:
        raise GenerateError(
            f"--max-length {max_length} is past the {limit} positions "
            f"{type(model).__name__} embeds: give --max-length {limit} or less"
        )
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    name = str(dtype).removeprefix("torch.")
    heads, size = family.kv_shape()
    return GenerationPlan(
        family=family.name,
        max_length=max_length,
        lanes=lanes or len(stage_params),
        rows=rows or 1,
        dtype=name if name in DTYPES else "float32",
        blocks=_stage_blocks(family, stage_params),
        kv_heads=heads,
        head_size=size,
    )


def check_fits(model: nn.Module, plan: GenerationPlan) -> Any:
    """``model``'s decoder family, where ``plan`` was made for this model.

    Raises:
        GenerateError: naming what differs (the model file changed since the compile, and
            ``--allow-stale`` took it): its family, block count or key/value shape.
    """
    family = decoder_family(model)
    changed = _changed(family, plan)
    if changed:
        raise GenerateError(
            f"the model built now is not the one compiled: {changed}; its generation plan no "
            "longer fits it: recompile with --generate"
        )
    return family


def _changed(family: Any, plan: GenerationPlan) -> str:
    """What differs between the model built now and the one the plan was made for (empty:
    nothing its decoding depends on)."""
    now = (family.name, len(family.blocks), *family.kv_shape())
    then = (plan.family, plan.blocks[-1][1], plan.kv_heads, plan.head_size)
    words = ("decoder", "blocks", "key/value heads", "head size")
    return ", ".join(f"{w} {b} (compiled with {a})" for w, a, b in zip(words, then, now) if a != b)


def decode_stages(
    model: nn.Module, plan: GenerationPlan, which: list[int] | None = None
) -> list[DecodeStage]:
    """The decode stages ``which`` (default all) of ``plan`` on ``model`` (in eval mode)."""
    model.eval()
    family = check_fits(model, plan)
    return [
        DecodeStage(
            family,
            k,
            plan.stages,
            range(*plan.blocks[k]),
            lanes=plan.lanes,
            rows=plan.rows,
            max_length=plan.max_length,
            dtype=DTYPES[plan.dtype],
        )
        for k in (range(plan.stages) if which is None else which)
    ]


def prove_generation(model: nn.Module, plan: GenerationPlan, ids: torch.Tensor) -> None:
    """Prefill the first row of ``ids`` but its last 2 tokens, decode those 2, and compare
    every step's logits with the eager model's on the same tokens.

    Raises:
        VerifyError: a logit differs by more than 1e-5 (relative to the largest) and by more
            than the rounding of the eager logits allows (``ir.noise_floor``, against the
            model in float64).
    """
    from pipecompile.generation.lanes import Lanes

    was_training = model.training
    stages = decode_stages(model, plan)
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
            f"--generate: the {plan.family} decode path's logits differ from the eager "
            f"model's at position {len(tokens) - 1} (step {step}): {found}; "
            f"{type(model).__name__} does not compute what its family does; compile without "
            "--generate"
        )
