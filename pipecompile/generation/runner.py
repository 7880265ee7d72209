"""``CompiledPipeline.generate`` and `pipecompile generate`: prompts in, each sequence's
tokens out, locally or with one rank per stage (``nproc``), streaming each new token to
``on_token`` as it comes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from pipecompile.generation.job import GenerateJob
from pipecompile.generation.local import generate_here
from pipecompile.generation.plan import check_fits, decode_stages
from pipecompile.generation.session import (
    check_prompts,
    copy_weights,
    model_of,
    tensor_aliases,
    train_state_weights,
    vocab_size,
)
from pipecompile.ir.records.manifest import Manifest

__all__ = ["as_output", "run_generation"]


def run_generation(
    job: GenerateJob,
    *,
    weights: Callable[[], dict[str, torch.Tensor]] | None = None,
    model: nn.Module | None = None,
    on_token: Callable[[int, int], None] | None = None,
    on_start: Callable[[], None] | None = None,
) -> dict[int, list[int]]:
    """Each prompt's new tokens by its number, for ``job`` (built and checked by
    ``GenerateJob.build``). ``weights``: the model's weights by its names (a pipeline's
    current ones), else the directory's stage files are read, unless ``job.train_state``
    gives others; ``model``: the model's modules where the directory records no file
    (compiled from Python).

    Raises:
        GenerateError: a prompt does not fit the plan (named).
    """
    directory, manifest, plan = job.directory, job.manifest, job.plan
    if job.nproc is not None and job.nproc > 1:
        from pipecompile.generation.rank_model import skeleton
        from pipecompile.generation.ranks import generate_on_ranks

        meta = skeleton(directory, manifest)  # this rank's stage gets memory on the ranks
        check_fits(meta, plan)
        check_prompts(plan, job.prompts, job.max_new_tokens, vocab_size(meta), job.eos)
        return generate_on_ranks(directory, manifest, meta, plan, job, weights, on_token, on_start)
    from pipecompile.runtime.process.threads import IdleCores, use_threads

    built = model_of(directory, manifest, model)
    check_fits(built, plan)  # before its weights: a changed model is named as such
    check_prompts(plan, job.prompts, job.max_new_tokens, vocab_size(built), job.eos)
    if job.train_state is not None:
        copy_weights(built, train_state_weights(job.train_state), str(job.train_state))
    else:
        copy_weights(built, _weights_here(directory, manifest, built, weights), str(directory))
    before = torch.get_num_threads()
    use_threads(job.threads)  # given: that count; else the idle cores, measured between turns
    idle = IdleCores()
    try:
        return generate_here(
            decode_stages(built, plan),
            job.prompts,
            job.max_new_tokens,
            job.sampling,
            eos=job.eos,
            on_token=on_token,
            on_start=on_start,
            between_turns=idle.between_steps,
        )
    finally:
        idle.restore()
        torch.set_num_threads(before)


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
