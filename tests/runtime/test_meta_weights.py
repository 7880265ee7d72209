"""Models without weights (built on the meta device) and pretrained weights: each stage's
tensors come into being where the stage runs, from pretrained weights read by original name or by
the model's own initialisation, and no rank builds the whole model."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import pipecompile
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES

META_GPT2 = f"""
import sys
from pathlib import Path

sys.path.insert(0, {str(EXAMPLES)!r})
import torch
import hf_gpt2
from hf_gpt2 import example_inputs, example_targets, loss_fn

MARKER = Path(__file__).with_suffix(".built")


def build_model():
    with MARKER.open("a") as f:  # counts the calls: ranks must not build the model
        f.write("x")
    with torch.device({{device!r}}):
        return hf_gpt2.build_model()
"""


def _model_file(tmp: Path, device: str = "meta", name: str = "model.py") -> Path:
    path = tmp / name
    path.write_text(META_GPT2.format(device=device))
    return path


def _compile(model: Path, out: Path, *extra: str, stages: int = 2) -> None:
    # weights are the subject: the batch as traced (torch.export's symbolic batch costs ~1.5 s)
    argv = [str(model), "--stages", str(stages), "--microbatches", "2", "-q", "-o", str(out),
            "--dynamic", "none"]  # fmt: skip
    assert main([*argv, *extra]) == 0


def _hf_checkpoint(tmp: Path) -> tuple[Path, torch.nn.Module]:
    """The example GPT-2 with its own values, saved by Hugging Face in 3 shards."""
    sys.path.insert(0, str(EXAMPLES))
    import hf_gpt2

    model = hf_gpt2.build_gpt2()
    for p in model.parameters():  # values unlike any seed's initialisation
        torch.nn.init.uniform_(p, -0.1, 0.1)
    model.save_pretrained(tmp / "ck", max_shard_size="300KB")
    return tmp / "ck", model


@pytest.fixture(scope="module")
def ck(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """3-shard Hugging Face pretrained weights (tests that damage them take a copy)."""
    return _hf_checkpoint(tmp_path_factory.mktemp("ck"))


@pytest.fixture(scope="module")
def meta_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The meta GPT-2's model file and its compile into 2 stages (seed 0, no weights)."""
    root = tmp_path_factory.mktemp("meta")
    model = _model_file(root)
    _compile(model, root / "out")
    return model, root / "out"


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory, ck) -> Path:  # type: ignore[no-untyped-def]
    """The meta GPT-2 compiled into 4 stages with --weights ck."""
    root = tmp_path_factory.mktemp("weights")
    _compile(_model_file(root), root / "out", "--weights", str(ck[0]), stages=4)
    return root / "out"


def _copy(ck: tuple[Path, torch.nn.Module], tmp: Path) -> Path:
    shutil.copytree(ck[0], tmp / "ck")
    return tmp / "ck"


def test_meta_model_compiles_without_values_and_checks(meta_dir, tmp_path, capfd):
    model, out = meta_dir
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["weights"] == {"source": "init", "init": "init.json", "seed": 0}
    assert all(s["weights"] is None and s["from_init"] for s in manifest["stages"])
    assert not list(out.glob("stage_*.safetensors"))
    recipe = json.loads((out / "init.json").read_text())
    assert recipe["methods"] == ["reset_parameters", "GPT2LMHeadModel._init_weights"]

    (model.with_suffix(".built")).unlink()
    assert main(["run", str(out), "--steps", "2", "-q"]) == 0
    assert main(["run", str(out), "--steps", "1", "--nproc", "2", "-q"]) == 0
    assert not model.with_suffix(".built").exists()  # no rank built the whole model
    assert main(["run", str(out), "--check"]) == 0
    assert "check passed" in capfd.readouterr().out
    assert model.with_suffix(".built").exists()  # the eager reference of --check


def test_initialisation_is_the_same_for_every_stage_count(meta_dir, tmp_path):
    model = _model_file(tmp_path)
    states = [Pipeline.load(meta_dir[1]).state_dict()]  # 2 stages, seed 0
    for stages, seed in ((3, 0), (2, 1)):
        out = tmp_path / f"s{stages}-{seed}"
        _compile(model, out, "--init-seed", str(seed), stages=stages)
        states.append(Pipeline.load(out).state_dict())
    assert states[0].keys() == states[1].keys() == states[2].keys()
    for name in states[0]:
        assert torch.equal(states[0][name], states[1][name]), name
    differ = [n for n in states[0] if not torch.equal(states[0][n], states[2][n])]
    assert "transformer.wte.weight" in differ  # another seed, other random weights
    # the distributions are the model's own: GPT-2's normal(0, 0.02) and LayerNorm ones
    wte, ln = states[0]["transformer.wte.weight"], states[0]["transformer.h.0.ln_1.weight"]
    assert abs(float(wte.std()) - 0.02) < 0.002 and torch.equal(ln, torch.ones_like(ln))


def test_meta_llama_rotary_buffers_and_check(tmp_path, capfd):
    out = tmp_path / "out"
    assert main([str(EXAMPLES / "llama_meta.py"), "--stages", "3", "-q", "-o", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["weights"]["init_constants"] == "init_constants.safetensors"
    assert main(["run", str(out), "--check"]) == 0
    assert "check passed" in capfd.readouterr().out


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_sharded_checkpoint_gives_the_pretrained_logits(device, ck, weights_dir, tmp_path):
    from transformers import GPT2LMHeadModel

    checkpoint, saved = ck
    assert len(list(checkpoint.glob("model-*.safetensors"))) == 3
    out = weights_dir
    if device == "cpu":  # a real model: its own values are replaced by the pretrained ones
        out = tmp_path / "out"
        _compile(_model_file(tmp_path, device), out, "--weights", str(checkpoint), stages=4)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["weights"]["source"] == "checkpoint"
    assert len(manifest["weights"]["shards"]) == 3

    pipe = pipecompile.load(out)
    reference = GPT2LMHeadModel.from_pretrained(checkpoint).eval()
    ids = torch.randint(0, 128, (8, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = reference(ids, use_cache=False).logits
        got = pipe(input_ids=ids).logits
    assert torch.equal(got, want)
    state = pipe.state_dict()
    for name, tensor in saved.state_dict().items():
        assert torch.equal(state[name], tensor), name


def test_api_compile_with_weights_and_save(ck, tmp_path):
    sys.path.insert(0, str(EXAMPLES))
    import hf_gpt2

    checkpoint, saved = ck
    with torch.device("meta"):
        model = hf_gpt2.build_model()
    pipe = pipecompile.compile(model, hf_gpt2.example_inputs(), stages=2, microbatches=2,
                               weights=checkpoint)  # fmt: skip
    pipe.save(tmp_path / "saved")
    manifest = json.loads((tmp_path / "saved" / "manifest.json").read_text())
    assert manifest["weights"] == {"source": "stage_files"}
    again = pipecompile.load(tmp_path / "saved").state_dict()
    for name, tensor in saved.state_dict().items():
        assert torch.equal(again[name], tensor), name


# -- bad input: one clear line, nothing written ------------------------------------------------


def _refused(argv: list[str], capfd, pattern: str) -> str:
    capfd.readouterr()  # what came before (Hugging Face's progress bars)
    assert main(argv) == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
    assert pattern in err, err
    return err


def test_bad_checkpoints_are_named(ck, tmp_path, capfd):
    checkpoint = _copy(ck, tmp_path)
    model = _model_file(tmp_path)
    out = tmp_path / "out"
    base = [str(model), "--stages", "2", "-q", "-o", str(out), "--weights"]

    _refused([*base, str(tmp_path / "nowhere")], capfd, "nowhere does not exist")
    shard = sorted(checkpoint.glob("model-*.safetensors"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    _refused([*base, str(checkpoint)], capfd, f"{shard} is not a readable safetensors file")
    shard.unlink()
    _refused([*base, str(checkpoint)], capfd, f"names {shard.name}, which is missing")
    other = tmp_path / "other.safetensors"
    save_file({"transformer.wte.weight": torch.zeros(7, 64)}, str(other))
    _refused([*base, str(other)], capfd, "transformer.wte.weight is [7, 64] in")
    assert not out.exists()  # nothing written by any refused compile


def test_missing_tensors_and_dtype_notes(ck, tmp_path, capfd):
    saved = ck[1]
    state = {k: v.to(torch.bfloat16) for k, v in saved.state_dict().items()}
    state.pop("transformer.h.1.mlp.c_fc.bias")
    state["extra.unused"] = torch.zeros(2)
    save_file(state, str(tmp_path / "partial.safetensors"))
    model = _model_file(tmp_path)
    base = [str(model), "--stages", "2", "-q", "-o", str(tmp_path / "out")]
    partial = ["--weights", str(tmp_path / "partial.safetensors")]
    _refused([*base, *partial], capfd, "lacks 1 of the model's 52 tensors: transformer.h.1.mlp")
    capfd.readouterr()
    assert main([*base, *partial, "--allow-missing"]) == 0
    err = capfd.readouterr().err
    converted = "converted to the model's dtype when loaded (e.g. transformer.wte.weight: "
    assert converted + "bfloat16 -> float32)" in err
    assert "1 tensors of" in err and "not loaded (e.g. extra.unused)" in err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    inits = {n for s in manifest["stages"] for n in s.get("from_init", {}).values()}
    assert inits == {"transformer.h.1.mlp.c_fc.bias"}  # the one the pretrained weights lack


def test_meta_tensor_without_initialisation_is_refused(tmp_path, capfd):
    model = tmp_path / "bare.py"
    model.write_text(
        "import torch\nfrom torch import nn\n\n\nclass Bare(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.lin = nn.Linear(4, 4)\n        self.scale = nn.Parameter(torch.ones(4))\n\n"
        "    def forward(self, x):\n        return self.lin(x) * self.scale\n\n\n"
        "def build_model():\n    with torch.device('meta'):\n        return Bare()\n\n\n"
        "def example_inputs():\n    return (torch.randn(4, 4),)\n"
    )
    out = tmp_path / "out"
    _refused([str(model), "--stages", "2", "-q", "-o", str(out)], capfd,
             "scale (stage 1) is on the meta device with no values")  # fmt: skip
    assert not out.exists()
    hook = "\n\ndef init_weights(module):\n    if hasattr(module, 'scale'):\n" \
           "        torch.nn.init.ones_(module.scale)\n"  # fmt: skip
    model.write_text(model.read_text() + hook)
    assert main([str(model), "--stages", "2", "-q", "-o", str(out)]) == 0
    assert torch.equal(Pipeline.load(out).state_dict()["scale"], torch.ones(4))


def test_export_to_a_sharded_directory_round_trips(ck, weights_dir, tmp_path, capfd):
    from transformers import GPT2LMHeadModel

    saved = ck[1]
    target = tmp_path / "exported"
    argv = ["export", str(weights_dir), "-o", str(target), "--shard-size", "300KB"]
    # a fresh interpreter: the output type (a transformers ModelOutput) must be found by name
    done = subprocess.run([sys.executable, "-m", "pipecompile", *argv], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "wrote 53 tensors in 4 shards to" in done.stdout  # tied: under both names
    index = json.loads((target / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [
        f"model-0000{k}-of-00004.safetensors" for k in (1, 2, 3, 4)
    ]
    assert sorted(p.name for p in target.glob("model-*")) == sorted(
        set(index["weight_map"].values())
    )
    assert (target / "config.json").is_file()  # from the --weights directory
    back = GPT2LMHeadModel.from_pretrained(target)
    for name, tensor in saved.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    # and back into pipecompile: the export is pretrained weights like any other
    _compile(_model_file(tmp_path), tmp_path / "again", "--weights", str(target))
    again = Pipeline.load(tmp_path / "again").state_dict()
    assert all(torch.equal(again[n], t) for n, t in saved.state_dict().items())

    (target / "NOTES.md").write_text("mine")
    _refused(argv, capfd, "holds NOTES.md, which an export did not write")
    assert main([*argv, "--force"]) == 0 and (target / "NOTES.md").read_text() == "mine"


def test_a_checkpoint_moved_after_compiling_is_named_at_run_time(ck, tmp_path, capfd):
    checkpoint = _copy(ck, tmp_path)
    _compile(_model_file(tmp_path), tmp_path / "out", "--weights", str(checkpoint))
    checkpoint.rename(tmp_path / "moved")
    err = _refused(["run", str(tmp_path / "out"), "--steps", "1"], capfd, "was compiled to read")
    assert "../ck" in err and "does not exist" in err
