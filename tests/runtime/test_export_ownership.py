"""`pipecompile export` replaces only what an export wrote: a user's Hugging Face directory or
file is refused (`--force` or not), other files are kept beside, an own export is replaced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES

INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("export") / "mlp"
    assert main([str(EXAMPLES / "mlp.py"), "--stages", "2", "-q", "-o", str(target)]) == 0
    return target


def err_of(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def _hf_directory(path: Path) -> Path:
    """A user's pretrained checkpoint, as from_pretrained's save_pretrained writes it."""
    path.mkdir()
    for k in (1, 2):
        save_file({f"w{k}": torch.ones(3)}, str(path / f"model-0000{k}-of-00002.safetensors"),
                  metadata={"format": "pt"})  # fmt: skip
    index = {"metadata": {"total_size": 24}, "weight_map": {"w1": "model-00001-of-00002."
             "safetensors", "w2": "model-00002-of-00002.safetensors"}}  # fmt: skip
    (path / INDEX).write_text(json.dumps(index))
    (path / "config.json").write_text('{"model_type": "mine"}')
    return path


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_a_users_pretrained_directory_is_refused_with_or_without_force(out, tmp_path, capsys,
                                                                       force):  # fmt: skip
    hf = _hf_directory(tmp_path / "hf")
    before = _snapshot(hf)
    assert main(["export", str(out), "-o", str(hf), *force]) == 2
    err = capsys.readouterr().err
    assert "weights pipecompile did not write" in err and "choose another -o" in err
    assert "model-00001-of-00002.safetensors" in err and len(err.strip().splitlines()) == 1
    assert _snapshot(hf) == before


def test_a_foreign_index_alone_is_refused(out, tmp_path, capsys):
    target = tmp_path / "t"
    target.mkdir()
    (target / INDEX).write_text('{"weight_map": {}}')
    assert main(["export", str(out), "-o", str(target), "--force"]) == 2
    assert INDEX in capsys.readouterr().err
    assert (target / INDEX).read_text() == '{"weight_map": {}}'


def test_other_files_need_force_and_are_kept_and_noted(out, tmp_path, capsys):
    target = tmp_path / "t"
    target.mkdir()
    (target / "README.md").write_text("mine")
    (target / "config.json").write_text("{}")
    assert main(["export", str(out), "-o", str(target)]) == 2
    assert "holds README.md, config.json, which an export did not write" in err_of(capsys)
    assert main(["export", str(out), "-o", str(target), "--force"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("pipecompile: note: kept") and "README.md" in err
    assert (target / "README.md").read_text() == "mine" and (
        target / "config.json"
    ).read_text() == "{}"
    assert (target / "model-00001-of-00001.safetensors").is_file()


def test_an_own_export_is_replaced_without_force_and_marked(out, tmp_path):
    target = tmp_path / "t"
    assert main(["export", str(out), "-o", str(target), "--shard-size", "10KB"]) == 0
    many = sorted(p.name for p in target.glob("model-*"))
    assert len(many) > 1
    with safe_open(str(target / many[0]), "pt") as f:
        assert f.metadata()["written_by"] == "pipecompile export"
    assert json.loads((target / INDEX).read_text())["metadata"]["written_by"] == (
        "pipecompile export"
    )
    assert main(["export", str(out), "-o", str(target)]) == 0  # one shard now
    assert sorted(p.name for p in target.iterdir()) == ["model-00001-of-00001.safetensors", INDEX]


def test_a_file_export_replaces_only_its_own_file(out, tmp_path, capsys):
    mine = tmp_path / "mine.safetensors"
    save_file({"w": torch.ones(2)}, str(mine))
    before = mine.read_bytes()
    for force in ([], ["--force"]):
        assert main(["export", str(out), "-o", str(mine), *force]) == 2
        assert "pipecompile export did not write it" in capsys.readouterr().err
        assert mine.read_bytes() == before
    ours = tmp_path / "ours.safetensors"
    assert main(["export", str(out), "-o", str(ours)]) == 0
    assert main(["export", str(out), "-o", str(ours)]) == 0  # its own file: replaced


def test_an_unwritable_target_is_named_before_the_work(out, tmp_path, capsys):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("mine")
    assert main(["export", str(out), "-o", str(blocker / "x.safetensors")]) == 2
    assert "notes.txt is a file, not a directory" in capsys.readouterr().err
    assert main(["export", str(out), "-o", str(blocker / "hf")]) == 2
    assert "notes.txt is a file, not a directory" in capsys.readouterr().err


def test_the_checkpoint_a_compile_reads_is_never_exported_over(out, tmp_path, capsys):
    hf, tuned = tmp_path / "hf", tmp_path / "tuned"
    assert main(["export", str(out), "-o", str(hf)]) == 0  # ours, marked
    argv = [str(EXAMPLES / "mlp.py"), "--stages", "2", "-q", "-o", str(tuned), "--weights", str(hf)]
    assert main(argv) == 0
    before = _snapshot(hf)
    assert main(["export", str(tuned), "-o", str(hf)]) == 2
    assert f"{tuned} reads its weights from there" in capsys.readouterr().err
    assert _snapshot(hf) == before
