"""`pipecompile export` of a Hugging Face model compiled without `--weights` writes the model's
own `config.json` (and `generation_config.json`) beside the weights: `from_pretrained` builds
the model's sizes and computes what the eager model does. (With `--weights`, the pretrained
directory's config is copied instead: tests/runtime/test_meta_weights.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from pipecompile.files.names import MODEL_CONFIGS
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.surfaces.cli import main
from tests.conftest import example_spec

INDEX = "model.safetensors.index.json"


def test_a_hugging_face_export_loads_with_from_pretrained(compiled_examples, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    directory = compiled_examples[("hf_gpt2", 2)]
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["model"]["configs"] == MODEL_CONFIGS
    target = tmp_path / "hf"
    assert main(["export", str(directory), "-o", str(target)]) == 0
    assert {"config.json", "generation_config.json"} <= {p.name for p in target.iterdir()}
    copied = json.loads((target / INDEX).read_text())["metadata"]["copied"]
    assert sorted(copied) == ["config.json", "generation_config.json"]  # export's own files
    assert main(["export", str(directory), "-o", str(target)]) == 0  # replaced, no --force

    back = AutoModelForCausalLM.from_pretrained(target).eval()
    assert type(back).__name__ == "GPT2LMHeadModel" and back.config.n_embd == 64
    emitted = Pipeline.load(directory).state_dict()
    for name, tensor in back.state_dict().items():
        assert torch.equal(tensor, emitted[name]), name
    spec = example_spec("hf_gpt2")
    eager = spec.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(back(**spec.inputs).logits, eager(**spec.inputs).logits)


def test_another_model_exports_no_config(compiled_examples, tmp_path):
    directory = compiled_examples[("mlp", 2)]
    assert "configs" not in json.loads((directory / "manifest.json").read_text())["model"]
    assert main(["export", str(directory), "-o", str(tmp_path / "mlp")]) == 0
    assert not (tmp_path / "mlp" / "config.json").exists()


def test_a_kept_config_gone_missing_is_named(compiled_examples, tmp_path, capsys):
    directory = shutil.copytree(compiled_examples[("hf_gpt2", 2)], tmp_path / "gpt2")
    (Path(directory) / MODEL_CONFIGS["config.json"]).unlink()
    assert main(["export", str(directory), "-o", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "model_config.json is missing (the model's config.json" in err
    assert "recompile the model" in err
