"""Model files for the plan benchmarks (plan.py, predicted.py): examples/gpt.py, hf_llama.py
and resnet.py at given sizes, on fixed random data, written as a user's model file that
`pipecompile MODEL` reads (``build_model``, ``example_inputs``, ``example_targets``,
``loss_fn``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from common import EXAMPLES

__all__ = ["gpt_body", "llama_body", "resnet_body", "write_model_file"]


def gpt_body(layers: int, width: int, heads: int, batch: int, seq: int, vocab: int) -> str:
    """examples/gpt.py's GPT at these sizes, on random tokens."""
    return f"""
    import gpt
    BATCH, SEQ, VOCAB = {batch}, {seq}, {vocab}
    def build_model():
        return gpt.build_gpt(n_layer={layers}, n_embd={width}, n_head={heads}, block_size=SEQ,
                             vocab_size=VOCAB)
    def _ids():
        return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(0))
    def example_inputs():
        return (_ids()[:, :-1].contiguous(),)
    def example_targets():
        return (_ids()[:, 1:].contiguous(),)
    loss_fn = gpt.loss_fn
    """


def llama_body(layers: int, hidden: int, intermediate: int, batch: int, seq: int) -> str:
    """examples/hf_llama.py's Llama (4 heads, 2 key-value heads, 256 tokens) at these sizes,
    on random tokens."""
    return f"""
    import hf_llama
    BATCH, SEQ, VOCAB = {batch}, {seq}, 256
    def build_model():
        return hf_llama.build_llama(num_hidden_layers={layers}, hidden_size={hidden},
                                    num_attention_heads=4, num_key_value_heads=2,
                                    intermediate_size={intermediate}, vocab_size=VOCAB)
    def _ids():
        return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(0))
    def example_inputs():
        return {{"input_ids": _ids()[:, :-1].contiguous()}}
    def example_targets():
        return (_ids()[:, 1:].contiguous(),)
    loss_fn = hf_llama.loss_fn
    """


def resnet_body(depth_per_group: int, width: int, batch: int) -> str:
    """examples/resnet.py's ResNet at these sizes, on random 32 x 32 images of 10 classes."""
    return f"""
    import resnet
    BATCH = {batch}
    def build_model():
        return resnet.build_resnet(depth_per_group={depth_per_group}, width={width})
    def example_inputs():
        return (torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(0)),)
    def example_targets():
        return (torch.randint(0, 10, (BATCH,), generator=torch.Generator().manual_seed(1)),)
    loss_fn = resnet.loss_fn
    """


def write_model_file(path: Path, body: str) -> Path:
    """``body`` as a model file at ``path`` that finds the examples and imports torch."""
    head = f"import sys\nsys.path.insert(0, {str(EXAMPLES)!r})\nimport torch\n"
    path.write_text(head + textwrap.dedent(body))
    return path
