"""A failure on a batch, told as the user needs it: the batch named first, and an id beyond
an embedding's rows said as such."""

from __future__ import annotations

import torch

from pipecompile.errors import InputError, MicrobatchError, PipecompileError
from pipecompile.model.data_hooks import Batch
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.training.feed import Feed

__all__ = ["in_batch", "out_of_range"]


def in_batch(
    err: PipecompileError, pipe: Pipeline, feed: Feed, batch: Batch, when: str
) -> PipecompileError:
    """``err``, raised by the pipeline on ``feed``'s last batch, with that batch named first
    (an id outside an embedding's range said as such); ``when``: the step, or the check."""
    source = feed.source
    if source is None:  # a rank without data: the ranks that read it name the batch
        return err
    hint = out_of_range(err, batch, pipe)
    if source.single and not hint and not isinstance(err, InputError | MicrobatchError):
        return type(err)(f"{when}: {err}")  # not the batch's fault: the example is no culprit
    where = source.batch_name(feed.in_epoch - 1)
    if feed.epoch > 1:
        where += f" of epoch {feed.epoch}"
    return type(err)(f"{where} ({when}): {hint or err}")


def out_of_range(err: BaseException, batch: Batch, pipe: Pipeline) -> str | None:
    """What torch's bare ``IndexError: index out of range in self`` (an embedding given an id
    beyond its rows) means for ``batch``: its integer inputs' ids against this process's
    embeddings; None for any other error."""
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, IndexError):
        cause = cause.__cause__
    if cause is None or "out of range" not in str(cause):
        return None
    ids = {
        n: t
        for n, t in batch.inputs.items()
        if t.numel() and not t.is_floating_point() and t.dtype != torch.bool
    }
    rows = _embeddings(pipe)
    if not ids or not rows:
        return None
    low, high = min(int(t.min()) for t in ids.values()), max(int(t.max()) for t in ids.values())
    held = ", ".join(
        f"input {n!r} holds ids {int(t.min())}..{int(t.max())}" for n, t in ids.items()
    )
    over = [f"{name!r} ({n} rows: ids 0..{n - 1})" for name, n in rows if n <= high]
    if low < 0:
        problem = "a negative id is outside every embedding's range"
    else:
        problem = f"beyond embedding {' or '.join(over or [f'{n!r} ({k} rows)' for n, k in rows])}"
    return (
        f"{held}: {problem}; fix the data, or the vocabulary size (and recompile) "
        f"[{type(cause).__name__}: {cause}]"
    )


def _embeddings(pipe: Pipeline) -> list[tuple[str, int]]:
    """(original name, rows) of every nn.Embedding of the stages in this process."""
    found = []
    for module, names in zip(pipe.modules, pipe.layout.params):
        if module is None:
            continue
        for path, sub in module.named_modules():
            if isinstance(sub, torch.nn.Embedding):
                original = names.get(f"{path}.weight", [f"{path}.weight"])[0]
                found.append((original.removesuffix(".weight"), sub.num_embeddings))
    return found
