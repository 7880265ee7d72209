"""The character-level GPT of char_lm.py, trained on windows of varying length, unpadded.

Each mini-batch of ``train_batches()`` has a length of its own, drawn uniformly from 16 to 128
characters (seeded: every pass gives the same batches). ``dynamic_shapes()`` says that the
batch size and the length of ``idx`` vary, so the stages are traced with both as symbols and
run every batch at its own length; under ``--nproc`` every rank sizes each message from the
batch's length, which the ranks agree on with the batch itself. No batch is padded::

    pipecompile examples/char_lm_varlen.py --stages 2 --microbatches 4 -o out/char_lm_varlen
    pipecompile run out/char_lm_varlen --epochs 1 --nproc 2

``padded_train_batches()`` gives the same windows padded to 128 with ignored targets (-100,
which the loss skips): what a pipeline of fixed shapes has to train on instead
(tools/bench/shapes.py compares the two). Run as a script, it trains eagerly for a few steps:
``python examples/char_lm_varlen.py [STEPS]``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import torch
from char_lm import BATCH_SIZE, TRAIN_SEED, build_char_gpt, loss_fn, split
from torch import nn

__all__ = [
    "build_model",
    "build_model_without_dropout",
    "train_batches",
    "padded_train_batches",
    "eval_batches",
    "example_inputs",
    "example_targets",
    "loss_fn",
    "dynamic_shapes",
]

SHORTEST, LONGEST = 16, 128  # window lengths, uniform
TRAIN_BATCHES = 100
EVAL_BATCHES = 4
EVAL_SEED = 4321
IGNORED = -100  # cross_entropy's ignore_index: a padded target
DEMO_STEPS = 3


def build_model() -> nn.Module:
    """char_lm's GPT with positions for the longest window."""
    return build_char_gpt(block_size=LONGEST)


def build_model_without_dropout() -> nn.Module:
    return build_char_gpt(block_size=LONGEST, dropout=0.0)


class VaryingBatches:
    """``count`` mini-batches ``((idx,), (next_idx,))`` of ``batch_size`` random windows of
    ``data``, each batch of its own length in [SHORTEST, LONGEST] (padded to ``pad_to`` with
    ignored targets when given). Seeded afresh on every iteration."""

    def __init__(
        self, data: torch.Tensor, count: int, seed: int, pad_to: int | None = None
    ) -> None:
        self.data, self.count, self.seed, self.pad_to = data, count, seed, pad_to

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[tuple[tuple[torch.Tensor], tuple[torch.Tensor]]]:
        g = torch.Generator().manual_seed(self.seed)
        for _ in range(self.count):
            length = int(torch.randint(SHORTEST, LONGEST + 1, (1,), generator=g))
            starts = torch.randint(0, len(self.data) - length - 1, (BATCH_SIZE, 1), generator=g)
            chunk = self.data[starts + torch.arange(length + 1)]
            idx, target = chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()
            if self.pad_to is not None and length < self.pad_to:
                pad = self.pad_to - length
                idx = nn.functional.pad(idx, (0, pad), value=0)
                target = nn.functional.pad(target, (0, pad), value=IGNORED)
            yield (idx,), (target,)


def train_batches() -> VaryingBatches:
    return VaryingBatches(split("train"), TRAIN_BATCHES, TRAIN_SEED)


def padded_train_batches() -> VaryingBatches:
    """The same batches as ``train_batches()``, each padded to LONGEST."""
    return VaryingBatches(split("train"), TRAIN_BATCHES, TRAIN_SEED, pad_to=LONGEST)


def eval_batches() -> VaryingBatches:
    return VaryingBatches(split("eval"), EVAL_BATCHES, EVAL_SEED)


def example_inputs() -> tuple[torch.Tensor, ...]:
    """A batch of the longest windows: ``(idx,)``, int64 (16, 128)."""
    return (split("train")[: BATCH_SIZE * LONGEST].reshape(BATCH_SIZE, LONGEST),)


def example_targets() -> tuple[torch.Tensor, ...]:
    return (split("train")[1 : BATCH_SIZE * LONGEST + 1].reshape(BATCH_SIZE, LONGEST),)


def dynamic_shapes() -> dict[str, dict[int, object]]:
    """The batch size and the length of ``idx`` vary from batch to batch; the length is at
    most LONGEST, the positions the model has (a longer batch is refused by name)."""
    return {"idx": {0: "batch", 1: ("seq", LONGEST)}}


def main(steps: int = DEMO_STEPS) -> None:
    """Train eagerly on the first ``steps`` batches, printing each one's length and loss."""
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, (inputs, targets) in zip(range(steps), train_batches()):
        loss = loss_fn(model(*inputs), *targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"step {step + 1}  length {inputs[0].shape[1]:3d}  loss {loss.item():.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else DEMO_STEPS)
