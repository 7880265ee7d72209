"""Hugging Face LlamaForCausalLM (random weights) example for pipecompile."""

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

transformers.logging.set_verbosity_error()

BATCH_SIZE = 8
SEQ_LEN = 16
VOCAB_SIZE = 128


def build_llama(
    num_hidden_layers: int = 2,
    hidden_size: int = 64,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    vocab_size: int = VOCAB_SIZE,
) -> nn.Module:
    """Build a randomly initialised LlamaForCausalLM, in training mode."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=64,
        attention_dropout=0.0,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.train()
    return model


def build_model() -> nn.Module:
    """Build the default small Llama (2 layers, hidden 64, GQA 4/2 heads)."""
    return build_llama()


def _token_stream() -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, VOCAB_SIZE, (BATCH_SIZE, SEQ_LEN + 1), generator=g)


def example_inputs() -> dict[str, torch.Tensor]:
    """Return ``{"input_ids": (8, 16) int64}``."""
    return {"input_ids": _token_stream()[:, :-1].contiguous()}


def example_targets() -> tuple[torch.Tensor, ...]:
    """Return deterministic (8, 16) int64 next-token ids."""
    return (_token_stream()[:, 1:].contiguous(),)


def loss_fn(output: transformers.utils.ModelOutput, target: torch.Tensor) -> torch.Tensor:
    """Token-level cross-entropy on ``output.logits``, mean-reduced."""
    logits = output.logits
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), target.reshape(-1), reduction="mean"
    )


if __name__ == "__main__":
    _model = build_model()
    print(loss_fn(_model(**example_inputs()), *example_targets()).item())
