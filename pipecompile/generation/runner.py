"""``CompiledPipeline.generate`` and `pipecompile generate`: prompts in, each sequence's
tokens out, locally or with one rank per stage (``nproc``), streaming each new token to
``on_token`` as it comes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from pipecompile.generation.families import GenerateError
from pipecompile.generation.local import generate_here
from pipecompile.generation.plan import decode_stages
from pipecompile.generation.sampler import Sampling
from pipecompile.generation.session import (
    check_prompts,
    load_weights,
    model_of,
    plan_of,
    tensor_aliases,
    train_state_weights,
    vocab_size,
)
from pipecompile.ir.manifest import Manifest, read_manifest

__all__ = ["Request", "as_output", "run_generation", "sampling_of"]


@dataclass(frozen=True)
class Request:
    """One call's prompts and decoding options."""

    prompts: list[list[int]]
    max_new_tokens: int
    sampling: Sampling = Sampling()
    eos: int | None = None
    nproc: int | None = None
    train_state: Path | None = None
    timeout: float = 600.0  # --nproc: seconds rank 0 waits for the last stage's tokens


def run_generation(
    directory: Path,
    request: Request,
    *,
    weights: Callable[[], dict[str, torch.Tensor]] | None = None,
    model: nn.Module | None = None,
    on_token: Callable[[int, int], None] | None = None,
    on_start: Callable[[], None] | None = None,
) -> dict[int, list[int]]:
    """Each prompt's new tokens by its number. ``weights``: the model's weights by its
    names (a pipeline's current ones), else the directory's stage files are read, unless
    ``request.train_state`` gives others; ``model``: the model's modules where the directory
    records no file (compiled from Python).

    Raises:
        GenerateError: the directory has no generation plan, or a prompt or option does not
            fit it (named).
    """
    manifest = read_manifest(directory)
    plan = plan_of(directory, manifest)
    if not request.timeout > 0:
        raise GenerateError(f"--timeout {request.timeout:g}: give a positive number of seconds")
    if request.nproc is not None and request.nproc != plan.stages:
        raise GenerateError(
            f"--nproc {request.nproc}: generation runs one rank per stage, and {directory} "
            f"has {plan.stages} stage(s): give --nproc {plan.stages}, or drop it to run them "
            "all in this process"
        )
    if request.nproc is not None and request.nproc > 1:
        from pipecompile.generation.rank_model import skeleton
        from pipecompile.generation.ranks import generate_on_ranks

        meta = skeleton(directory, manifest)  # this rank's stage gets memory on the ranks
        check_prompts(plan, request.prompts, request.max_new_tokens, vocab_size(meta), request.eos)
        return generate_on_ranks(
            directory, manifest, meta, plan, request, weights, on_token, on_start
        )
    built = model_of(directory, manifest, model)
    check_prompts(plan, request.prompts, request.max_new_tokens, vocab_size(built), request.eos)
    if request.train_state is not None:
        load_weights(built, train_state_weights(request.train_state), str(request.train_state))
    else:
        load_weights(built, _weights_here(directory, manifest, built, weights), str(directory))
    return generate_here(
        decode_stages(built, plan),
        request.prompts,
        request.max_new_tokens,
        request.sampling,
        eos=request.eos,
        on_token=on_token,
        on_start=on_start,
    )


def _weights_here(
    directory: Path,
    manifest: Manifest,
    model: nn.Module,
    weights: Callable[[], dict[str, torch.Tensor]] | None,
) -> dict[str, torch.Tensor]:
    if weights is not None:
        return weights()
    from pipecompile.generation.rank_model import WeightSource

    return WeightSource("directory", directory, manifest).read(tensor_aliases(model))


def as_output(
    prompts: list[list[int]], new: dict[int, list[int]], pad: int
) -> torch.Tensor | list[torch.Tensor]:
    """As Hugging Face's ``generate`` returns them: one (B, P + T) LongTensor when every
    prompt has the same length (a sequence that stopped early padded with ``pad``), else one
    1-D tensor per sequence."""
    rows = [p + new[k] for k, p in enumerate(prompts)]
    if len({len(p) for p in prompts}) > 1:
        return [torch.tensor(r, dtype=torch.long) for r in rows]
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long)


def sampling_of(
    temperature: float | None, top_k: int | None, top_p: float | None, seed: int | None
) -> Sampling:
    """Greedy unless a temperature, top-k or top-p is given (top-k or top-p alone sample at
    temperature 1).

    Raises:
        GenerateError: a temperature below 0, top-k below 1, top-p outside (0, 1].
    """
    if temperature is not None and temperature < 0:
        raise GenerateError(f"--temperature {temperature}: give 0 (greedy) or more")
    if top_k is not None and top_k < 1:
        raise GenerateError(f"--top-k {top_k}: give 1 or more")
    if top_p is not None and not 0 < top_p <= 1:
        raise GenerateError(f"--top-p {top_p}: give a probability in (0, 1]")
    sampled = top_k is not None or top_p is not None
    t = temperature if temperature is not None else (1.0 if sampled else 0.0)
    return Sampling(t, top_k, top_p, seed or 0)
