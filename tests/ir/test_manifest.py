"""The manifest record: it reads and writes manifest.json byte for byte, refuses another
format naming the file, and an emitted directory loads through it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.errors import EmitError, ManifestVersionError
from pipecompile.files.names import MANIFEST
from pipecompile.ir.records.manifest import FORMAT, Manifest, read_manifest, write_manifest
from pipecompile.runtime.load import load_stages
from pipecompile.runtime.pipeline import Pipeline
from tests.conftest import example_spec, named_inputs

# The optional keys an emitted mlp lacks: the pretrained weights (--weights), exported ONNX files,
# a Hugging Face model's configs.
CHECKPOINT_WEIGHTS = {
    "source": "checkpoint", "init": "init.json", "seed": 0,
    "shards": ["model.safetensors"], "checkpoint": "../ck", "loaded": 9, "model_tensors": 10,
    "prefix": {"added": "transformer."}, "missing": ["fc5.bias"],
}  # fmt: skip


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = example_spec("mlp")
    compiled = compile_model(spec.model, spec.inputs, stages=2, microbatches=2)
    out = tmp_path_factory.mktemp("manifest") / "mlp"
    return emit(compiled, out, model=ModelRef(spec.path, spec.name, "mlp"))


def test_an_emitted_manifest_round_trips_byte_for_byte(mlp):
    text = (mlp / MANIFEST).read_text()
    raw = json.loads(text)
    manifest = Manifest.from_json(raw)
    assert manifest.to_json() == raw
    assert list(manifest.to_json()) == list(raw)  # the keys in the order of docs/FORMAT.md
    assert json.dumps(manifest.to_json(), indent=2) + "\n" == text


def test_optional_keys_round_trip(mlp):
    raw = json.loads((mlp / MANIFEST).read_text())
    raw["weights"] = CHECKPOINT_WEIGHTS
    raw["model"]["configs"] = {"config.json": "model_config.json"}  # a Hugging Face model's
    for j, stage in enumerate(raw["stages"]):
        stage |= {"weights": None, "from_checkpoint": {"fc1.weight": "fc1.weight"},
                  "onnx": f"stage_{j}.onnx"}  # fmt: skip
    assert Manifest.from_json(raw).to_json() == raw


def test_an_older_manifest_without_the_later_keys_still_reads(mlp):
    raw = json.loads((mlp / MANIFEST).read_text())
    for key in ("input_values", "replicas", "balance", "weights"):
        del raw[key]
    for stage in raw["stages"]:
        for key in ("activation_bytes", "layers", "random_ops"):
            del stage[key]
    manifest = Manifest.from_json(raw)
    assert manifest.replica_counts == (1, 1) and manifest.balance is None
    assert manifest.to_json() == raw


def test_a_newer_format_is_refused_naming_the_file(mlp, tmp_path):
    raw = json.loads((mlp / MANIFEST).read_text())
    raw["format"], raw["pipecompile_version"] = "pipecompile/2", "9.0.0"
    (tmp_path / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(ManifestVersionError, match=r"manifest\.json has format 'pipecompile/2' "
                       r"\(written by pipecompile 9\.0\.0\); this pipecompile reads "
                       r"pipecompile/1: recompile the model with this pipecompile"):  # fmt: skip
        read_manifest(tmp_path)
    assert issubclass(ManifestVersionError, EmitError)  # caught as a bad emitted directory


def test_a_malformed_manifest_is_refused_naming_the_file(mlp, tmp_path):
    raw = json.loads((mlp / MANIFEST).read_text())
    del raw["stages"][0]["inputs"]
    (tmp_path / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(EmitError, match=rf"{tmp_path}/manifest\.json is malformed .*recompile"):
        read_manifest(tmp_path)


def test_written_manifest_reads_back_the_same(mlp, tmp_path):
    manifest = read_manifest(mlp)
    assert manifest.format == FORMAT
    write_manifest(tmp_path, manifest)
    assert (tmp_path / MANIFEST).read_bytes() == (mlp / MANIFEST).read_bytes()
    assert read_manifest(tmp_path) == manifest


def test_an_emitted_directory_loads_and_runs(mlp):
    manifest = read_manifest(mlp)
    assert [s.file for s in manifest.stages] == ["stage_0.py", "stage_1.py"]
    assert len(load_stages(mlp, manifest)) == 2
    pipe = Pipeline.load(mlp)
    spec = example_spec("mlp")
    inputs = named_inputs(spec.model, spec.inputs)
    torch.testing.assert_close(pipe(inputs), spec.model(**inputs))
