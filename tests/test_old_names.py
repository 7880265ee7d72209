"""The old spellings of renamed options still work and give what the new ones give:
``--checkpoint`` for ``--recompute`` (compile) and ``--train-state`` (export), the
``checkpoint=`` keyword for ``recompute=``, and ``--print-after insert_checkpoints``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import pipecompile
from pipecompile.compiler import compile_model
from pipecompile.errors import PipecompileError
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES

MLP = str(EXAMPLES / "mlp.py")


def _compile(out: Path, *options: str) -> Path:
    args = [MLP, "--stages", "2", "--microbatches", "2", "-q", "-o", str(out), *options]
    assert main(args) == 0
    return out


def test_compile_checkpoint_flag_is_recompute(tmp_path):
    new = _compile(tmp_path / "new", "--recompute", "except_last")
    old = _compile(tmp_path / "old", "--checkpoint", "except_last")
    program = (new / "program.txt").read_text()
    assert "FC" in program
    assert (old / "program.txt").read_text() == program


def _small_model() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return model, torch.randn(4, 4)


def test_checkpoint_keyword_is_recompute(tmp_path):
    model, x = _small_model()
    options = {"stages": 2, "microbatches": 2}
    new = pipecompile.compile(model, x, recompute="always", directory=tmp_path / "n", **options)
    old = pipecompile.compile(model, x, checkpoint="always", directory=tmp_path / "o", **options)
    assert str(old.program) == str(new.program)
    assert any(x.op == "FC" for _, _, x in new.program.instructions())
    inputs = {"input": x}
    same = compile_model(model, inputs, stages=2, microbatches=2, checkpoint="always")
    assert str(same.program) == str(new.program)


def test_both_keywords_must_agree():
    model, x = _small_model()
    with pytest.raises(PipecompileError, match="checkpoint is the old name of recompute"):
        compile_model(
            model, {"input": x}, stages=2, microbatches=2, recompute="always",
            checkpoint="except_last",
        )  # fmt: skip


def test_print_after_old_pass_name(tmp_path, capsys):
    _compile(tmp_path / "o", "--print-after", "insert_checkpoints")
    assert "--- IR after insert_recompute ---" in capsys.readouterr().out


def test_export_checkpoint_flag_is_train_state(tmp_path):
    out = _compile(tmp_path / "out")
    saved = tmp_path / "saved"
    assert main(["run", str(out), "-q", "--steps", "1", "--save", str(saved)]) == 0
    weights = {}
    for flag in ("--train-state", "--checkpoint"):
        target = tmp_path / f"{flag.strip('-')}.safetensors"
        assert main(["export", str(out), flag, str(saved), "-o", str(target)]) == 0
        weights[flag] = load_file(str(target))
    emitted = tmp_path / "emitted.safetensors"
    assert main(["export", str(out), "-o", str(emitted)]) == 0
    new, old = weights["--train-state"], weights["--checkpoint"]
    assert new.keys() == old.keys() and all(torch.equal(new[k], old[k]) for k in new)
    assert any(not torch.equal(new[k], t) for k, t in load_file(str(emitted)).items())
