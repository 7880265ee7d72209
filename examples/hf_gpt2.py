"""Hugging Face GPT2LMHeadModel (random weights) example for pipecompile."""

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

transformers.logging.set_verbosity_error()

BATCH_SIZE = 8
SEQ_LEN = 16
VOCAB_SIZE = 128


def build_gpt2(
    n_layer: int = 4,
    n_embd: int = 64,
    n_head: int = 4,
    vocab_size: int = VOCAB_SIZE,
    n_positions: int = 64,
) -> nn.Module:
    """Build a randomly initialised GPT2LMHeadModel, in training mode."""
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        summary_first_dropout=0.0,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    model.train()
    return model


def build_model() -> nn.Module:
    """Build the default small GPT-2 (4 layers, n_embd 64, vocab 128)."""
    return build_gpt2()


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
