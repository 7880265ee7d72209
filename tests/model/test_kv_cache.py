"""A Hugging Face model built as people build it (``use_cache`` at its default) compiles: its
KV cache is left out of the traced output (a training step never reads it), said in a note,
and the model it was given keeps its cache; `run --check` compares it without the cache."""

from __future__ import annotations

import warnings

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import pipecompile
from pipecompile.model.kv_cache import caching_configs, drop_kv_cache, without_kv_cache
from pipecompile.surfaces.cli import main

MODEL_FILE = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel


def build_model():
    return GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=2,
                                      n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def example_inputs():
    return (torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(0)),)


def example_targets():
    return (torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(1)),)


def loss_fn(output, target):
    return torch.nn.functional.cross_entropy(output.logits.flatten(0, 1), target.flatten())
"""


def _model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    return GPT2LMHeadModel(config).eval()


def test_the_cache_is_off_only_while_it_is_asked_off():
    model = _model()
    assert model.config.use_cache is True and len(caching_configs(model)) == 1
    with without_kv_cache(model) as cached:
        assert cached and model.config.use_cache is False
    assert model.config.use_cache is True
    assert drop_kv_cache(model) and not caching_configs(model)
    with without_kv_cache(model) as cached:
        assert not cached


def test_a_model_with_its_cache_on_compiles_and_computes_its_logits():
    model = _model()
    ids = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipe = pipecompile.compile(model, (ids,), stages=2, microbatches=2)
    assert any("returns its KV cache" in str(w.message) for w in caught)
    assert model.config.use_cache is True  # the user's model as it was
    out = pipe(ids)
    logits = out.logits if hasattr(out, "logits") else out[0]
    torch.testing.assert_close(logits, model(ids).logits, atol=1e-5, rtol=1e-5)


def test_the_command_line_compiles_and_checks_it(tmp_path, capsys, monkeypatch):
    (tmp_path / "model.py").write_text(MODEL_FILE)
    monkeypatch.chdir(tmp_path)
    assert main(["model.py", "--stages", "2", "--microbatches", "2", "-o", "out"]) == 0
    assert "traced without it" in capsys.readouterr().err
    assert main(["run", "out", "--check", "-q"]) == 0
    assert "check passed" in capsys.readouterr().out
