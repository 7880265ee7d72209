"""``CompiledPipeline.generate`` and `pipecompile generate`: prompts in, each sequence's
tokens out, locally or with one rank per stage (``nproc``), streaming each new token to
``on_token`` as it comes."""

from __future__ import annotations

from collections.abc import Callable

import torch

from pipecompile.generation.job import GenerateJob
from pipecompile.generation.local import generate_here
from pipecompile.generation.places import stage_device
from pipecompile.generation.rank_model import WeightSource, rank_stage
from pipecompile.generation.session import check_prompts

__all__ = ["as_output", "run_generation"]


def run_generation(
    job: GenerateJob,
    *,
    weights: Callable[[], dict[str, torch.Tensor]] | None = None,
    on_token: Callable[[int, int], None] | None = None,
    on_start: Callable[[], None] | None = None,
) -> dict[int, list[int]]:
    """Each prompt's new tokens by its number, for ``job`` (built and checked by
    ``GenerateJob.build``). ``weights``: the model's weights by its names (a pipeline's
    current ones), else the directory's stage files are read, unless ``job.train_state``
    gives others. The decoding stages are the directory's files: the model is not built.

    Raises:
        GenerateError: a prompt does not fit the plan (named).
    """
    directory, manifest, plan = job.directory, job.manifest, job.plan
    check_prompts(plan, job.prompts, job.max_new_tokens, plan.vocab, job.eos)
    if job.nproc is not None and job.nproc > 1:
        from pipecompile.generation.ranks import generate_on_ranks

        return generate_on_ranks(directory, manifest, plan, job, weights, on_token, on_start)
    from pipecompile.runtime.process.threads import IdleCores, use_threads

    source = _source(job, weights)
    stages = [
        rank_stage(directory, plan, k, source, stage_device(job.device, k))
        for k in range(plan.stages)
    ]
    before = torch.get_num_threads()
    use_threads(job.threads)  # given: that count; else the idle cores, measured between turns
    idle = IdleCores()
    try:
        return generate_here(
            stages,
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


def _source(
    job: GenerateJob, weights: Callable[[], dict[str, torch.Tensor]] | None
) -> WeightSource:
    """Where the stages' tensors come from: a run's train state, the pipeline's current
    weights, or the directory's stage files."""
    if job.train_state is not None:
        return WeightSource("train_state", job.train_state)
    if weights is not None:
        return WeightSource("memory", job.directory, tensors=weights())
    return WeightSource("directory", job.directory, job.manifest)


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
