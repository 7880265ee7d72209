"""An emitted directory whose stage files or weights were edited or damaged: every failure to
load names the stage and the file and says how to recompile."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.errors import EmitError
from pipecompile.runtime.load import load_stages, read_manifest
from tests.conftest import example_spec

RECOMPILE = r"recompile \(`pipecompile .*mlp\.py --stages 2 --microbatches 2 -o "


@pytest.fixture(scope="module")
def emitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = example_spec("mlp")
    compiled = compile_model(spec.model, spec.inputs, stages=2, microbatches=2)
    return emit(compiled, tmp_path_factory.mktemp("load") / "out",
                model=ModelRef(spec.path, spec.name, "mlp"))  # fmt: skip


@pytest.fixture
def out(emitted: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "out"
    shutil.copytree(emitted, copy)
    return copy


def load(out: Path) -> None:
    load_stages(out, read_manifest(out))


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_an_untouched_directory_loads(out):
    load(out)


def test_syntax_error_names_the_file_and_line(out):
    edit(out / "stage_1.py", "def forward(self, act2):", "def forward(self, act2:")
    with pytest.raises(EmitError, match=r"stage 1: .*stage_1\.py does not import: line \d+: "
                       r"SyntaxError: .*fix the edit, or " + RECOMPILE):  # fmt: skip
        load(out)


def test_a_missing_import_names_the_line(out):
    edit(out / "stage_1.py", "import torch\n", "import torch\nimport torchvisionx\n")
    with pytest.raises(EmitError, match=r"stage_1\.py does not import: line 8: "
                       r"ModuleNotFoundError: No module named 'torchvisionx'"):  # fmt: skip
        load(out)


def test_a_renamed_class_is_named(out):
    edit(out / "stage_1.py", "class Stage1(", "class Renamed(")
    with pytest.raises(EmitError, match=r"stage_1\.py has no class 'Stage1' \(it defines "
                       r"Renamed\); undo the edit, or " + RECOMPILE):  # fmt: skip
        load(out)


def test_a_resized_layer_no_longer_fits_its_weights(out):
    edit(out / "stage_1.py", "in_features=64, out_features=10", "in_features=64, out_features=3")
    with pytest.raises(EmitError, match=r"stage 1: weights .*stage_1\.safetensors do not fit "
                       r"the stage module: fc5\.weight is \(10, 64\) there but \(3, 64\) in "
                       r"Stage1 \(and 1 more\)"):  # fmt: skip
        load(out)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:1000]), "are damaged or truncated"),
        (lambda p: p.write_bytes(b""), r"are empty \(0 bytes\)"),
        (lambda p: p.unlink(), "are missing"),
        (lambda p: p.write_bytes(b"not a safetensors file" * 10), "are damaged or truncated"),
        (lambda p: shutil.copyfile(p.with_name("stage_0.safetensors"), p),
         r"do not fit the stage module: they lack fc3\.bias, .* and hold fc1\.bias"),
    ],
    ids=["truncated", "empty", "deleted", "garbage", "another-stage"],
)  # fmt: skip
def test_damaged_weights_name_the_stage_and_file(out, damage, message):
    damage(out / "stage_1.safetensors")
    with pytest.raises(EmitError, match=rf"stage 1: weights .*stage_1\.safetensors {message}"):
        load(out)
