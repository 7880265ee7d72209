"""ONNX export: every example's stages exported, chained in onnxruntime, equal to eager.

The ONNX graphs are inference graphs: stages are exported in eval mode, so the reference is
the original model in eval mode (BatchNorm uses its running statistics) on one micro-batch.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch.utils import _pytree as pytree

from pipecompile.errors import EmitError, RuntimeFailure
from pipecompile.interop.onnx_chain import run_onnx_chain
from pipecompile.interop.onnx_export import OnnxExportError, export_onnx
from pipecompile.ir.graph.microbatch import split_microbatches
from pipecompile.surfaces.cli import main
from tests.conftest import (
    EXAMPLE_NAMES,
    EXAMPLES,
    SAMPLED_OUT,
    example_spec,
    write_model_file,
)

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

STAGES = 2
MICROBATCHES = 2  # as the compiled_examples fixture compiles them

UNSUPPORTED = """
import torch
from torch import nn


class Bessel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x):
        return torch.special.i0(self.fc2(self.fc1(x)))  # no ONNX form


def build_model():
    return Bessel()


def example_inputs():
    return (torch.randn(4, 8),)
"""


def _copy(compiled_examples: dict[tuple[str, int], Path], name: str, tmp_path: Path) -> Path:
    """A private copy of the shared compiled directory, so exporting never changes it."""
    return Path(shutil.copytree(compiled_examples[(name, STAGES)], tmp_path / name))


def _manifest(directory: Path) -> dict:
    return json.loads((directory / "manifest.json").read_text())


# Three models cover the chain's paths (a CNN, a tied GPT, an exported Hugging Face model);
# the other examples are sampled out for time.
CHAINED = {"resnet", "gpt", "hf_llama"}


@pytest.mark.parametrize(
    "name", [n if n in CHAINED else pytest.param(n, marks=SAMPLED_OUT) for n in EXAMPLE_NAMES]
)
def test_onnx_chain_equals_eager(compiled_examples, tmp_path, name):
    directory = _copy(compiled_examples, name, tmp_path)
    paths = export_onnx(directory)
    manifest = _manifest(directory)
    assert [p.name for p in paths] == [f"stage_{j}.onnx" for j in range(STAGES)]
    for entry, path in zip(manifest["stages"], paths):
        assert entry["onnx"] == path.name
        graph = onnx.load(str(path)).graph
        assert [v.name for v in graph.input] == entry["inputs"]
        assert [v.name for v in graph.output] == entry["outputs"]

    spec = example_spec(name)
    micro = split_microbatches(spec.inputs, MICROBATCHES)[0]
    spec.model.eval()
    with torch.no_grad():
        want = pytree.tree_leaves(spec.model(**micro))
    got = run_onnx_chain(directory, micro)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.from_numpy(g), w, atol=1e-4, rtol=1e-4)


def test_compile_with_onnx_from_the_cli(tmp_path, capsys):
    out = tmp_path / "o"
    assert main([str(EXAMPLES / "mlp.py"), "--stages", "2", "-o", str(out), "--onnx"]) == 0
    err = capsys.readouterr().err
    assert "onnx stage_0.onnx" in err and "wrote stage_0.onnx, stage_1.onnx" in err
    assert [s["onnx"] for s in _manifest(out)["stages"]] == ["stage_0.onnx", "stage_1.onnx"]
    assert main(["onnx", str(out), "-q"]) == 0  # exporting again replaces the files
    assert capsys.readouterr().err == ""
    assert sorted(p.name for p in out.glob("*.onnx")) == ["stage_0.onnx", "stage_1.onnx"]


def test_unsupported_op_fails_and_leaves_the_stages_intact(tmp_path, capsys):
    model = write_model_file(tmp_path, UNSUPPORTED)
    out = tmp_path / "o"
    assert main([str(model), "--stages", "2", "-q", "-o", str(out), "--onnx"]) == 2
    err = capsys.readouterr().err
    assert "cannot be exported to ONNX" in err and "prims.bessel_i0" in err
    assert "Traceback" not in err
    assert not list(out.glob("*.onnx")) and not list(out.glob(".onnx-tmp-*"))
    assert all("onnx" not in s for s in _manifest(out)["stages"])
    assert sorted(p.name for p in out.glob("stage_*.py")) == ["stage_0.py", "stage_1.py"]
    with pytest.raises(OnnxExportError, match=r"stage \d \(.*stage_\d\.py\) .*bessel_i0"):
        export_onnx(out)
    assert issubclass(OnnxExportError, EmitError)


def test_old_manifest_without_input_values(compiled_examples, tmp_path, capsys):
    directory = _copy(compiled_examples, "mlp", tmp_path)
    manifest = _manifest(directory)
    del manifest["input_values"]
    (directory / "manifest.json").write_text(json.dumps(manifest))
    assert main(["onnx", str(directory)]) == 2
    err = capsys.readouterr().err
    assert "no input_values" in err and "recompile" in err


def test_chain_errors(compiled_examples, tmp_path):
    directory = _copy(compiled_examples, "mlp", tmp_path)
    x = split_microbatches(example_spec("mlp").inputs, MICROBATCHES)[0]["x"]
    with pytest.raises(EmitError, match="stage 0 .* has no ONNX file; export it"):
        run_onnx_chain(directory, {"x": x})
    export_onnx(directory)
    with pytest.raises(RuntimeFailure, match=r"model inputs \['x'\] are missing"):
        run_onnx_chain(directory, {})
    with pytest.raises(RuntimeFailure, match=r"stage 0 \(stage_0.onnx\) failed in onnxruntime"):
        run_onnx_chain(directory, {"x": torch.zeros(3, 7)})


RESIDUAL = """
import torch
from torch import nn


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.c = nn.Linear(16, 4)

    def forward(self, x):
        h = x + torch.relu(self.a(x))
        h = h + torch.relu(self.b(h))
        return self.c(h)


def build_model():
    return Residual()


def example_inputs():
    return (torch.randn(8, 16),)
"""


def test_a_boundary_value_named_like_an_exporter_node(tmp_path):
    """Stage 1 takes the value `add`, which the exporter also names its own add node."""
    model = write_model_file(tmp_path, RESIDUAL)
    out = tmp_path / "o"
    assert main([str(model), "--stages", "2", "-q", "-o", str(out), "--onnx"]) == 0
    assert _manifest(out)["stages"][1]["inputs"] == ["add"]
    import importlib.util

    spec = importlib.util.spec_from_file_location("residual", model)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net = module.build_model()
    net.load_state_dict(
        {k: v for s in range(2) for k, v in _stage_state(out, s).items()}, strict=True
    )
    x = torch.randn(8, 16)
    got = run_onnx_chain(out, {"x": x})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got[0]), net(x), atol=1e-5, rtol=1e-5)


def _stage_state(directory: Path, j: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    entry = _manifest(directory)["stages"][j]
    state = load_file(str(directory / entry["weights"]))
    return {entry["params"][name][0]: t for name, t in state.items()}


def test_exports_share_one_translation_registry():
    from torch.onnx._internal.exporter import _registration

    from pipecompile.interop.onnx_registry import shared_registry

    before = _registration.ONNXRegistry.__dict__["from_torchlib"]
    with shared_registry():  # as torch.onnx.export calls it: on an instance, then again
        first = _registration.ONNXRegistry().from_torchlib(opset_version=18)
        again = _registration.ONNXRegistry.from_torchlib(opset_version=18)
    assert first is again and len(first.functions) > 100
    assert _registration.ONNXRegistry.__dict__["from_torchlib"] is before  # left as it was
