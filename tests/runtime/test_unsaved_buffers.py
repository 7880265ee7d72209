"""A model's non-persistent buffers (a Hugging Face Llama's rotary ``inv_freq``) stay in the
stages but out of what pipecompile hands back as the model's state: ``pipe.state_dict()`` and
`export` hold what ``model.state_dict()`` holds, and ``model.load_state_dict`` takes them."""

from __future__ import annotations

import torch
import transformers as tf
from safetensors.torch import load_file

import pipecompile
from pipecompile.surfaces.cli import main


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = tf.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                            num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                            max_position_embeddings=32, use_cache=False)  # fmt: skip
    return tf.LlamaForCausalLM(config).eval()


def test_state_dict_and_export_hold_what_the_models_own_state_dict_holds(tmp_path):
    model = _llama()
    assert any("inv_freq" in n for n, _ in model.named_buffers())  # the case this is about
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    out = tmp_path / "out"
    pipe = pipecompile.compile(model, {"input_ids": ids}, stages=2, directory=out)
    assert pipe.manifest.model.unsaved_buffers  # recorded at the compile
    state = pipe.state_dict()
    assert set(state) == set(model.state_dict())
    fresh = _llama()
    fresh.load_state_dict(state)  # strict: no unexpected key
    torch.testing.assert_close(fresh(ids).logits, pipe(ids).logits, atol=1e-5, rtol=1e-5)
    target = tmp_path / "w.safetensors"
    assert main(["export", str(out), "-o", str(target)]) == 0
    fresh.load_state_dict(load_file(str(target)))
    assert set(load_file(str(target))) == set(model.state_dict())
