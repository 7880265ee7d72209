"""Hand-written GPT-style decoder-only transformer example for pipecompile."""

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

BATCH_SIZE = 8
SEQ_LEN = 16


@dataclass
class GPTConfig:
    """Hyper-parameters of the GPT model."""

    vocab_size: int = 128
    block_size: int = 32
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 64
    bias: bool = True
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention using scaled_dot_product_attention."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_drop = nn.Dropout(config.dropout)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, cache: Any = None, layer: int = 0
    ) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # a decoding step: this layer's keys and values so far, masked per position
            k, v = cache.update(k, v, layer)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.c_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward network with GELU."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, config: GPTConfig) -> None:
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


class GPT(nn.Module):
    """GPT language model with the LM head tied to the token embedding."""

    def __init__(self, config: GPTConfig) -> None:
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
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

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
        B, T = idx.size()
        pos = position_ids if position_ids is not None else torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for i, block in enumerate(self.h):
            x = block(x, attention_mask, cache, i)
        x = self.ln_f(x)
        return self.lm_head(x)


def build_gpt(**overrides: Any) -> nn.Module:
    """Build a GPT from ``GPTConfig`` defaults updated with ``overrides``."""
    config = dataclasses.replace(GPTConfig(), **overrides)
    torch.manual_seed(0)
    model = GPT(config)
    model.train()
    return model


def build_model() -> nn.Module:
    """Build the default small GPT, in training mode."""
    return build_gpt()


def build_dropout_model() -> nn.Module:
    """The same GPT with dropout 0.1 (embeddings and both residual branches), as GPT-2 has:
    `pipecompile examples/gpt.py:build_dropout_model --stages 2`."""
    return build_gpt(dropout=0.1)


def _token_stream() -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, GPTConfig.vocab_size, (BATCH_SIZE, SEQ_LEN + 1), generator=g)


def example_inputs() -> tuple[torch.Tensor, ...]:
    """Return deterministic (8, 16) int64 token ids."""
    return (_token_stream()[:, :-1].contiguous(),)


def example_targets() -> tuple[torch.Tensor, ...]:
    """Return deterministic (8, 16) int64 next-token ids."""
    return (_token_stream()[:, 1:].contiguous(),)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Token-level cross-entropy, mean-reduced over batch and sequence."""
    return F.cross_entropy(
        output.reshape(-1, output.size(-1)), target.reshape(-1), reduction="mean"
    )


if __name__ == "__main__":
    _model = build_model()
    print(loss_fn(_model(*example_inputs()), *example_targets()).item())
