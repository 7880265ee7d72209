"""A Llama-2-7B-shaped LlamaForCausalLM on the meta device (hidden 4096, 32 layers, 32 heads,
intermediate 11008, vocabulary 32000: 6.7 billion parameters, 27 GB in fp32).

Nothing is allocated, so it compiles on a laptop; running it needs its stages' memory::

    pipecompile examples/llama7b_meta.py --stages 8 --microbatches 8 -o out/llama7b
"""

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

transformers.logging.set_verbosity_error()

BATCH_SIZE = 8
SEQ_LEN = 128
VOCAB_SIZE = 32000


def build_model() -> nn.Module:
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=4096, intermediate_size=11008,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
        max_position_embeddings=4096, attention_dropout=0.0, use_cache=False,
    )  # fmt: skip
    with torch.device("meta"):
        return LlamaForCausalLM(config).train()


def _tokens() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, VOCAB_SIZE, (BATCH_SIZE, SEQ_LEN + 1), generator=g)


def example_inputs() -> dict[str, torch.Tensor]:
    """Eight sequences of 128 tokens (8 micro-batches of 1 x 128)."""
    return {"input_ids": _tokens()[:, :-1].contiguous()}


def example_targets() -> tuple[torch.Tensor, ...]:
    return (_tokens()[:, 1:].contiguous(),)


def loss_fn(output: transformers.utils.ModelOutput, target: torch.Tensor) -> torch.Tensor:
    logits = output.logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))


if __name__ == "__main__":
    _model = build_model()
    print(
        f"{sum(p.numel() for p in _model.parameters()):,} parameters on",
        _model.lm_head.weight.device,
    )
