"""Generation from a compiled directory: its plan, a train state's weights by the model's
names, a model's tensors under all their names, and the prompts checked against the plan
before any stage runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipecompile.generation.step_trace import GenerateError
from pipecompile.ir.records.generation_plan import GenerationPlan
from pipecompile.ir.records.manifest import Manifest

__all__ = [
    "as_prompts",
    "check_prompts",
    "plan_of",
    "train_state_weights",
]


def plan_of(directory: Path, manifest: Manifest) -> GenerationPlan:
    """The directory's generation plan.

    Raises:
        GenerateError: it was compiled without ``--generate``.
    """
    if not manifest.generate:
        raise GenerateError(
            f"{directory} was compiled without --generate, so it has no KV cache or decode "
            f"program: recompile with --generate (`pipecompile MODEL --stages N --generate "
            f"-o {directory}`)"
        )
    try:
        return GenerationPlan.from_json(manifest.generate)
    except (KeyError, TypeError, ValueError) as err:
        raise GenerateError(
            f"{directory}/manifest.json: its generate record is damaged ({type(err).__name__}: "
            f"{err}); recompile with --generate (`pipecompile MODEL --stages N --generate -o "
            f"{directory}`)"
        ) from None


def tensor_aliases(model: nn.Module) -> dict[str, list[str]]:
    """Each state entry's names: a tied weight has several."""
    by_tensor: dict[int, list[str]] = {}
    tensors = [*model.named_parameters(remove_duplicate=False)]
    tensors += [*model.named_buffers(remove_duplicate=False)]
    for name, t in tensors:
        by_tensor.setdefault(id(t), []).append(name)
    return {name: names for names in by_tensor.values() for name in names}


def train_state_weights(root: Path, names: set[str] | None = None) -> dict[str, torch.Tensor]:
    """The weights of the newest step saved under ``root`` (or of the step ``root`` is),
    by the model's names (only those of ``names`` where given, read alone)."""
    from pipecompile.runtime.training.model_keyed import read_model_keyed
    from pipecompile.runtime.training.train_state import latest_step_dir

    keys = None if names is None else {f"model.{n}" for n in names}
    entries = read_model_keyed(latest_step_dir(root), keys)
    return {
        k.removeprefix("model."): v
        for k, v in entries.items()
        if k.startswith("model.") and isinstance(v, torch.Tensor)
    }


def check_prompts(
    plan: GenerationPlan,
    prompts: list[list[int]],
    max_new_tokens: int,
    vocab: int,
    eos: tuple[int, ...],
) -> None:
    """Refuse what the plan cannot run, naming the prompt and the limit.

    Raises:
        GenerateError: no prompts, an empty prompt, a token id outside the vocabulary, a
            prompt or prompt plus new tokens longer than the cache, an EOS id outside it.
    """
    L = plan.max_length
    if not prompts:
        raise GenerateError("no prompts given: pass --prompt-ids IDS or --prompts FILE")
    if max_new_tokens < 0:
        raise GenerateError(f"--max-new-tokens {max_new_tokens}: give 0 or more")
    bad_eos = next((e for e in eos if not 0 <= e < vocab), None)
    if bad_eos is not None:
        raise GenerateError(
            f"--eos {bad_eos} is not a token of the model's vocabulary of {vocab} (0..{vocab - 1})"
        )
    for k, p in enumerate(prompts):
        if not p:
            raise GenerateError(f"prompt {k} is empty: give it at least one token")
        bad = next((t for t in p if not 0 <= t < vocab), None)
        if bad is not None:
            raise GenerateError(
                f"prompt {k} holds token id {bad}, outside the model's vocabulary of {vocab} "
                f"(0..{vocab - 1})"
            )
        if len(p) >= L:
            raise GenerateError(
                f"prompt {k} has {len(p)} tokens, but the KV cache holds {L} positions "
                f"(--max-length {L} at compile): shorten it, or recompile with a larger "
                "--max-length"
            )
        if len(p) + max_new_tokens > L:
            raise GenerateError(
                f"--max-new-tokens {max_new_tokens} is past --max-length {L}: prompt {k} has "
                f"{len(p)} tokens, so at most {L - len(p)} new ones fit; ask for fewer or "
                "recompile with a larger --max-length"
            )


def as_prompts(input_ids: Any) -> list[list[int]]:
    """A (B, P) LongTensor, a 1-D one, or a list of token id lists/tensors."""
    if isinstance(input_ids, torch.Tensor):
        rows = input_ids.view(1, -1) if input_ids.dim() == 1 else input_ids
        if rows.dim() != 2 or rows.dtype not in (torch.int64, torch.int32):
            raise GenerateError(
                f"input_ids must be token ids of shape (batch, length), got a "
                f"{str(rows.dtype).removeprefix('torch.')} tensor of shape {tuple(input_ids.shape)}"
            )
        return [[int(t) for t in row] for row in rows]
    return [[int(t) for t in p] for p in input_ids]
