"""Small decoders of each family generation knows, built from configs with random weights, and
the bundled GPT example compiled with ``--generate`` once for the modules that use it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipecompile.surfaces.cli import main

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 97


def tiny_decoder(family: str) -> torch.nn.Module:
    """A random-weight causal LM: ``gpt2``, ``llama`` (grouped-query attention), ``qwen2``
    (biased projections), ``mixtral`` (mixture of experts) or any other Hugging Face model
    type (``falcon``, ``gpt_neox``, ...), small enough to compile in a second or two."""
    import transformers as tf

    torch.manual_seed(0)
    if family == "gpt2":
        config = tf.GPT2Config(
            n_layer=3, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=64,
            bos_token_id=0, eos_token_id=None,
        )  # fmt: skip
        model = tf.GPT2LMHeadModel(config)
    else:
        common = dict(
            num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
            bos_token_id=0, eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
        if family == "llama":
            model = tf.LlamaForCausalLM(tf.LlamaConfig(**common))
        elif family == "qwen2":
            model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**common))
        elif family == "mixtral":
            config = tf.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)
            model = tf.MixtralForCausalLM(config)
        else:  # any other architecture, from its config's own defaults and these sizes
            config = tf.AutoConfig.for_model(family, **common)
            model = tf.AutoModelForCausalLM.from_config(config)
    model.config.use_cache = False
    return model.eval()


@pytest.fixture(scope="session")
def gpt_generate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/gpt.py in two stages, with --generate at two lanes of two rows."""
    out = tmp_path_factory.mktemp("generate") / "gpt"
    argv = [str(ROOT / "examples" / "gpt.py"), "--stages", "2", "--generate"]
    assert main([*argv, "--lanes", "2", "--lane-rows", "2", "-o", str(out), "-q"]) == 0
    return out
