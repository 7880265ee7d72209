"""Character-level GPT trained on the Python standard library's own source files.

A small decoder-only transformer (with dropout) that learns to write Python one character at a
time. The corpus is made on the fly from ~25 files next to ``os.py`` (no downloads): their text
is concatenated, each character mapped to its ASCII code (anything else becomes ``?``), and the
last 10% held out for evaluation. ``train_batches()`` and ``eval_batches()`` give deterministic
mini-batches of random windows, every one of the example batch's shape.

Compile into two stages and train one epoch of ``train_batches()``::

    pipecompile examples/char_lm.py --stages 2 --microbatches 4 -o out/char_lm
    pipecompile run out/char_lm --epochs 1 --warmup-steps 20 --clip-grad-norm 1

``run --check`` compares one pipelined step with the eager model, which only matches without
dropout (the pipeline draws its own masks), so check the dropout-free twin::

    pipecompile examples/char_lm.py:build_model_without_dropout --stages 2 -o out/char_lm_nodrop
    pipecompile run out/char_lm_nodrop --check

Compile it with ``--generate`` too, train, and let the trained model write Python from a
prompt (``encode_text`` and ``decode_tokens`` below turn text into tokens and back)::

    pipecompile examples/char_lm.py --stages 2 --microbatches 4 --generate -o out/char_lm
    pipecompile run out/char_lm --epochs 4 --save out/char_lm_state
    pipecompile generate out/char_lm --train-state out/char_lm_state --prompt "def " \\
        --max-new-tokens 60 --temperature 0.7 --top-k 20

Or train it eagerly and watch the loss fall from 4.8 to ~2.4 in the default 120 steps, or
lower in more: ``python examples/char_lm.py [STEPS]``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

BATCH_SIZE = 16
BLOCK_SIZE = 64
VOCAB_SIZE = 128  # ASCII
TRAIN_BATCHES = 200  # one epoch
EVAL_BATCHES = 8
EVAL_FRACTION = 0.1
TRAIN_SEED = 1234
EVAL_SEED = 4321
LR = 1e-3
WARMUP_STEPS = 20
CLIP_GRAD_NORM = 1.0
DEMO_STEPS = 120  # kept short: tests/test_example_scripts.py runs every example as a script

# A fixed list, in a fixed order, so the corpus is the same on every run of this Python.
STDLIB_FILES = (
    "abc.py",
    "argparse.py",
    "bisect.py",
    "calendar.py",
    "collections/__init__.py",
    "colorsys.py",
    "contextlib.py",
    "copy.py",
    "dataclasses.py",
    "difflib.py",
    "enum.py",
    "fnmatch.py",
    "fractions.py",
    "functools.py",
    "glob.py",
    "heapq.py",
    "keyword.py",
    "operator.py",
    "pprint.py",
    "queue.py",
    "random.py",
    "shlex.py",
    "statistics.py",
    "string.py",
    "textwrap.py",
)


@dataclass(frozen=True)
class CharGPTConfig:
    """Hyper-parameters of the character-level GPT."""

    vocab_size: int = VOCAB_SIZE
    block_size: int = BLOCK_SIZE
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.1


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention; dropout on its output (the residual branch)."""

    def __init__(self, config: CharGPTConfig) -> None:
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, cache: Any = None, layer: int = 0
    ) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)
        else:  # a decoding step: this layer's keys and values so far, masked per position
            k, v = cache.update(k, v, layer)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward network with GELU; dropout on its output."""

    def __init__(self, config: CharGPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, config: CharGPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, cache: Any = None, layer: int = 0
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask, cache, layer)
        return x + self.mlp(self.ln_2(x))


class CharGPT(nn.Module):
    """GPT language model over ASCII characters, the LM head tied to the token embedding."""

    def __init__(self, config: CharGPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self,
        idx: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
    ) -> torch.Tensor:
        """Logits of every position; with ``cache`` (pipecompile's --generate) one decoding
        step: each row's tokens at ``position_ids``, attending through the additive
        ``attention_mask`` to the keys and values ``cache.update`` returns."""
        T = idx.size(1)
        pos = position_ids if position_ids is not None else torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for i, block in enumerate(self.h):
            x = block(x, attention_mask, cache, i)
        return self.lm_head(self.ln_f(x))


def build_char_gpt(**overrides: Any) -> nn.Module:
    """Build a CharGPT from ``CharGPTConfig`` defaults updated with ``overrides``,
    deterministically, in training mode."""
    torch.manual_seed(0)
    model = CharGPT(dataclasses.replace(CharGPTConfig(), **overrides))
    model.train()
    return model


def build_model() -> nn.Module:
    """Build the default character-level GPT (dropout 0.1), in training mode."""
    return build_char_gpt()


def build_model_without_dropout() -> nn.Module:
    """The same model with dropout 0, for ``pipecompile run --check``: the pipeline draws its
    dropout masks per stage and micro-batch, so only a model without dropout can match the
    eager step exactly (docs/USAGE.md, "Semantics")."""
    return build_char_gpt(dropout=0.0)


_CORPUS: torch.Tensor | None = None  # read once per process


def corpus() -> torch.Tensor:
    """The whole corpus as an int64 tensor of ASCII codes (0..127), read once and cached.

    Raises:
        FileNotFoundError: if none of ``STDLIB_FILES`` exists next to ``os.py``.
    """
    global _CORPUS
    if _CORPUS is None:
        _CORPUS = _read_corpus(Path(os.__file__).parent)
    return _CORPUS


def _read_corpus(root: Path) -> torch.Tensor:
    paths = [root / name for name in STDLIB_FILES if (root / name).is_file()]
    if not paths:
        raise FileNotFoundError(
            f"none of the {len(STDLIB_FILES)} standard-library files this example trains on "
            f"(e.g. {STDLIB_FILES[0]}) is in {root}; run it with a Python that ships its sources"
        )
    text = "".join(p.read_text(encoding="utf-8", errors="replace") for p in paths)
    codes = text.encode("ascii", errors="replace")  # a non-ASCII character becomes b"?"
    return torch.frombuffer(bytearray(codes), dtype=torch.uint8).long()


def split(name: str) -> torch.Tensor:
    """The ``"train"`` split (first 90% of the corpus) or the ``"eval"`` split (last 10%)."""
    data = corpus()
    cut = int(len(data) * (1 - EVAL_FRACTION))
    return {"train": data[:cut], "eval": data[cut:]}[name]


Batch = tuple[tuple[torch.Tensor], tuple[torch.Tensor]]  # ((idx,), (next_idx,))


class CharBatches:
    """``count`` mini-batches ``((idx,), (next_idx,))`` of random windows of ``data``.

    The window offsets come from a generator seeded with ``seed`` afresh on every iteration,
    so each pass yields the same batches. Every batch is (``batch_size``, ``block_size``).
    """

    def __init__(
        self,
        data: torch.Tensor,
        count: int,
        seed: int,
        batch_size: int = BATCH_SIZE,
        block_size: int = BLOCK_SIZE,
    ) -> None:
        if len(data) <= block_size + 1:
            raise ValueError(f"{len(data)} characters is too few for windows of {block_size}")
        self.data, self.count, self.seed = data, count, seed
        self.batch_size, self.block_size = batch_size, block_size

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Batch]:
        g = torch.Generator().manual_seed(self.seed)
        window = torch.arange(self.block_size + 1)
        for _ in range(self.count):
            starts = torch.randint(
                0, len(self.data) - self.block_size, (self.batch_size, 1), generator=g
            )
            chunk = self.data[starts + window]  # (batch_size, block_size + 1)
            yield (chunk[:, :-1].contiguous(),), (chunk[:, 1:].contiguous(),)


def train_batches() -> CharBatches:
    """One epoch: ``TRAIN_BATCHES`` deterministic mini-batches of the training split."""
    return CharBatches(split("train"), TRAIN_BATCHES, TRAIN_SEED)


def eval_batches() -> CharBatches:
    """``EVAL_BATCHES`` deterministic mini-batches of the held-out split."""
    return CharBatches(split("eval"), EVAL_BATCHES, EVAL_SEED)


def encode_text(text: str) -> list[int]:
    """Text as this model's tokens: ASCII codes (anything else becomes ``?``), as the corpus."""
    return list(text.encode("ascii", errors="replace"))


def decode_tokens(tokens: list[int]) -> str:
    """Tokens back as text (`pipecompile generate` prints new tokens with it)."""
    return bytes(t if 0 <= t < VOCAB_SIZE else ord("?") for t in tokens).decode("ascii")


def example_inputs() -> tuple[torch.Tensor, ...]:
    """The first training batch's inputs: ``(idx,)``, int64 (16, 64)."""
    return next(iter(train_batches()))[0]


def example_targets() -> tuple[torch.Tensor, ...]:
    """The first training batch's targets: ``(next_idx,)``, int64 (16, 64)."""
    return next(iter(train_batches()))[1]


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the next character, mean-reduced over batch and positions."""
    return F.cross_entropy(output.reshape(-1, output.size(-1)), target.reshape(-1))


def evaluate(model: nn.Module) -> float:
    """Mean loss over ``eval_batches()``, dropout off."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        losses = [loss_fn(model(*x), *y).item() for x, y in eval_batches()]
    model.train(was_training)
    return sum(losses) / len(losses)


def train(steps: int = DEMO_STEPS, every: int = 20) -> list[float]:
    """Train eagerly for ``steps`` batches, printing the loss every ``every``; return the losses.

    AdamW at lr 1e-3 after a linear warm-up of ``WARMUP_STEPS``, gradients clipped to norm 1:
    what ``pipecompile run --warmup-steps 20 --clip-grad-norm 1`` does. (In 200 steps a constant
    3e-3 ends near 2.7, eval 2.87; the warm-up and the lower rate reach ~2.3, eval 2.50.)
    """
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    warmup = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / WARMUP_STEPS)
    )
    losses: list[float] = []
    start = time.perf_counter()
    while len(losses) < steps:
        for inputs, targets in train_batches():  # epoch after epoch
            loss = loss_fn(model(*inputs), *targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), CLIP_GRAD_NORM)
            optimizer.step()
            warmup.step()
            losses.append(loss.item())
            if len(losses) == 1 or len(losses) % every == 0:
                print(f"step {len(losses):4d}  loss {losses[-1]:.3f}", flush=True)
            if len(losses) == steps:
                break
    seconds = time.perf_counter() - start
    print(f"eval loss {evaluate(model):.3f}  ({steps} steps in {seconds:.1f}s)")
    return losses


if __name__ == "__main__":
    train(int(sys.argv[1]) if len(sys.argv) > 1 else DEMO_STEPS)
