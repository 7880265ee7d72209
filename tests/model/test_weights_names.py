"""--weights by name: pretrained weights whose names differ from the model's by one prefix are
read as ``from_pretrained`` reads them, and every model tensor is either loaded or named in an
error (``--allow-missing`` initialises the ones they lack, listed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

import pipecompile
from pipecompile.errors import WeightsError
from pipecompile.model.pretrained_names import NameMap, coverage, match_names
from pipecompile.surfaces.cli import main

CONFIG = GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)  # fmt: skip
MODEL_FILE = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel

CONFIG = GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)


def build_model():
    return GPT2LMHeadModel(CONFIG)


def example_inputs():
    return (torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0)),)
"""


def _save(state: dict[str, torch.Tensor], path: Path) -> Path:
    save_file({k: v.detach().clone() for k, v in state.items()}, str(path))
    return path


def _names(model: nn.Module) -> list[str]:
    return list(model.state_dict())


def _uniform(model: nn.Module) -> nn.Module:
    for p in model.parameters():  # values unlike any seed's initialisation
        nn.init.uniform_(p, -0.1, 0.1)
    return model


# -- names ------------------------------------------------------------------------------------


def test_base_model_prefix_is_added_or_removed_as_from_pretrained_does():
    head, base = GPT2LMHeadModel(CONFIG), GPT2Model(CONFIG)
    assert match_names(head, _names(base)) == NameMap(added="transformer.")
    assert match_names(base, _names(head)) == NameMap(removed="transformer.")
    assert match_names(head, _names(head)) == NameMap()
    held = coverage(head, _names(base), NameMap(added="transformer."))
    assert held.missing == () and held.total == len(_names(base))  # lm_head tied to wte: once
    assert str(NameMap(added="transformer.")) == "prefix 'transformer.' added"


def test_a_model_without_base_model_prefix_tries_one_leading_component():
    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
            self.register_buffer("scratch", torch.zeros(2), persistent=False)

    wrapped, plain = Wrapped(), nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    assert match_names(wrapped, _names(plain)) == NameMap(added="net.")
    assert match_names(plain, ["model." + n for n in _names(plain)]) == NameMap(removed="model.")
    held = coverage(wrapped, _names(plain), NameMap(added="net."))
    assert held.total == 4 and held.loaded == 4  # the non-persistent buffer is not asked for


def test_another_models_checkpoint_is_left_as_it_is():
    head = GPT2LMHeadModel(CONFIG)
    other = ["bert.embeddings.word_embeddings.weight", "bert.pooler.dense.weight"]
    assert match_names(head, other) == NameMap()
    held = coverage(head, other, NameMap())
    assert held.loaded == 0 and held.missing[0] == "transformer.wte.weight"


# -- compile ----------------------------------------------------------------------------------


def test_api_reads_a_base_checkpoint_into_the_model_with_a_head(tmp_path):
    base = _uniform(GPT2Model(CONFIG))
    path = _save(base.state_dict(), tmp_path / "base.safetensors")
    reference = GPT2LMHeadModel(CONFIG).eval()
    reference.transformer.load_state_dict(base.state_dict())
    ids = torch.randint(0, 32, (2, 8))

    with pytest.warns(UserWarning, match="lack the model's prefix 'transformer.'"):
        pipe = pipecompile.compile(GPT2LMHeadModel(CONFIG).eval(), (ids,), stages=2, weights=path)
    weights = pipe.manifest.weights
    assert weights.prefix == {"added": "transformer."}
    assert (weights.loaded, weights.model_tensors) == (len(base.state_dict()),) * 2
    torch.testing.assert_close(pipe(ids).logits, reference(ids).logits)


def test_api_refuses_a_missing_tensor_unless_allowed(tmp_path):
    model = GPT2LMHeadModel(CONFIG)
    state = model.state_dict()
    state.pop("transformer.ln_f.bias")
    path = _save(state, tmp_path / "partial.safetensors")
    ids = torch.randint(0, 32, (2, 8))
    with pytest.raises(WeightsError, match="lacks 1 of the model's .*: transformer.ln_f.bias"):
        pipecompile.compile(model, (ids,), stages=2, weights=path)
    with pytest.warns(UserWarning, match="initialised instead: transformer.ln_f.bias"):
        pipe = pipecompile.compile(model, (ids,), stages=2, weights=path, allow_missing=True)
    assert pipe.manifest.weights.missing == ("transformer.ln_f.bias",)


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny_gpt2.py"
    path.write_text(MODEL_FILE)
    return path


def _compile(capfd, model: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    capfd.readouterr()
    code = main([str(model), "--stages", "2", "-o", str(out), *extra])
    got = capfd.readouterr()
    return code, got.out, got.err


def test_cli_names_what_is_missing_and_allow_missing_lists_it(model_file, tmp_path, capfd):
    state = _uniform(GPT2LMHeadModel(CONFIG)).state_dict()
    gone = ["transformer.h.0.mlp.c_fc.bias", "transformer.ln_f.weight"]
    for name in gone:
        state.pop(name)
    path = _save(state, tmp_path / "partial.safetensors")
    out = tmp_path / "out"

    code, _, err = _compile(capfd, model_file, out, "--weights", str(path), "-q")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"lacks 2 of the model's {len(state) + 1} tensors: {', '.join(gone)}" in err
    assert "--allow-missing" in err and not out.exists()

    code, summary, err = _compile(capfd, model_file, out, "--weights", str(path), "--allow-missing")
    assert code == 0, err
    assert f"note: --allow-missing: 2 of the model's {len(state) + 1} tensors" in err
    assert f"initialised instead: {', '.join(gone)}" in err
    assert f"weights: {len(state) - 1} of {len(state) + 1} tensors from partial" in summary
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["weights"]["missing"] == gone

    code, _, err = _compile(capfd, model_file, tmp_path / "o2", "--allow-missing")
    assert code == 2 and "--allow-missing applies to --weights" in err


def test_cli_says_a_prefix_was_removed_and_refuses_another_models_checkpoint(
    model_file, tmp_path, capfd
):
    head = {f"transformer.{k}": v for k, v in GPT2LMHeadModel(CONFIG).state_dict().items()}
    path = _save(head, tmp_path / "double.safetensors")  # names carrying an extra prefix
    code, summary, err = _compile(capfd, model_file, tmp_path / "out", "--weights", str(path))
    assert code == 0, err
    assert "carry the extra prefix 'transformer.'" in err
    assert "(prefix 'transformer.' removed)" in summary

    other = _save({"bert.pooler.dense.weight": torch.zeros(2, 2)}, tmp_path / "bert.safetensors")
    code, _, err = _compile(capfd, model_file, tmp_path / "o2", "--weights", str(other))
    assert code == 2 and "it holds none of them, e.g. bert.pooler.dense.weight" in err
