"""The small Hugging Face Llama of hf_llama.py, built on the meta device: shapes, no weights.

It compiles without allocating a weight; each stage gets its weights where it runs, from
pretrained weights (``--weights``) or by the model's own initialisation (docs/USAGE.md)::

    pipecompile examples/llama_meta.py --stages 2 -o out/llama_meta
    pipecompile run out/llama_meta --check
"""

import torch
from hf_llama import build_llama, example_inputs, example_targets, loss_fn  # noqa: F401
from torch import nn


def build_model() -> nn.Module:
    """LlamaForCausalLM (2 layers, hidden 64) on the meta device."""
    with torch.device("meta"):
        return build_llama()


if __name__ == "__main__":
    _model = build_model()
    print(
        f"{sum(p.numel() for p in _model.parameters()):,} parameters on",
        _model.lm_head.weight.device,
    )
