"""The command line end to end: compile, determinism, run, --check, --program, errors."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES, write_model_file


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_compile_is_deterministic_and_complete(tmp_path, capsys):
    args = [str(EXAMPLES / "gpt.py"), "--stages", "3", "--microbatches", "2", "-q"]
    assert main([*args, "-o", str(tmp_path / "a")]) == 0
    assert main([*args, "-o", str(tmp_path / "b")]) == 0
    first, second = _files(tmp_path / "a"), _files(tmp_path / "b")
    pictures = ["stages.dot", "schedule.dot"]  # and drawn where Graphviz is installed
    pictures += ["stages.svg", "schedule.svg"] if shutil.which("dot") else []
    assert sorted(first) == sorted(
        ["manifest.json", "program.txt", *pictures]
        + [f"stage_{j}.{e}" for j in range(3) for e in ("py", "safetensors")]
    )
    assert first == second
    assert main([*args, "-o", str(tmp_path / "a")]) == 0  # replacing our own output is fine
    assert _files(tmp_path / "a") == second


def test_stage_source_imports_only_torch(tmp_path):
    assert (
        main([str(EXAMPLES / "hf_gpt2.py"), "--stages", "2", "-q", "-o", str(tmp_path / "o")]) == 0
    )
    for source in (tmp_path / "o").glob("stage_*.py"):
        imports = [
            ln for ln in source.read_text().splitlines() if ln.startswith(("import", "from"))
        ]
        assert imports == ["import torch"], source


def test_summary_and_progress(tmp_path, capsys):
    assert main([str(EXAMPLES / "mlp.py"), "--stages", "2", "-o", str(tmp_path / "o")]) == 0
    captured = capsys.readouterr()
    assert "balance_stages" in captured.err and "emit" in captured.err
    assert "bottleneck" in captured.out and f"wrote {tmp_path / 'o'}" in captured.out


def test_run_trains_and_checks(tmp_path, capsys):
    out = str(tmp_path / "o")
    assert (
        main([str(EXAMPLES / "gpt.py"), "--stages", "2", "--microbatches", "4", "-q", "-o", out])
        == 0
    )
    assert main(["run", out, "--steps", "3"]) == 0
    losses = [float(line.split()[3]) for line in capsys.readouterr().out.splitlines()]
    assert len(losses) == 3 and losses[2] < losses[0]
    assert main(["run", out, "--check"]) == 0
    assert "check passed" in capsys.readouterr().out


def test_check_fails_on_a_mismatch(tmp_path, capsys):
    out = tmp_path / "o"
    assert main([str(EXAMPLES / "mlp.py"), "--stages", "2", "-q", "-o", str(out)]) == 0
    source = (out / "stage_1.py").read_text()
    (out / "stage_1.py").write_text(source.replace("return (", "return (0.5 + ", 1))
    assert main(["run", str(out), "--check"]) == 1
    assert "check FAILED" in capsys.readouterr().out


def test_run_a_hand_edited_program(tmp_path, capsys):
    out = tmp_path / "o"
    assert (
        main(
            [str(EXAMPLES / "mlp.py"), "--stages", "2", "--microbatches", "2", "-q", "-o", str(out)]
        )
        == 0
    )
    text = (out / "program.txt").read_text()
    # backward in forward order instead of reverse: still a valid GPipe program
    edited = text.replace(
        "  1RECV_F1\n  1F1\n  1B1\n  1SEND_B1\n  1B0\n  1SEND_B0",
        "  1RECV_F1\n  1F1\n  1B0\n  1SEND_B0\n  1B1\n  1SEND_B1",
    )
    assert edited != text
    (tmp_path / "edited.txt").write_text(edited)
    assert main(["run", str(out), "--program", str(tmp_path / "edited.txt"), "--check"]) == 0
    (tmp_path / "bad.txt").write_text(text.replace("  1B0\n", ""))
    assert main(["run", str(out), "--program", str(tmp_path / "bad.txt")]) == 2
    assert "1B0 appears 0 times, expected 1" in capsys.readouterr().err


def test_microbatches_must_divide_the_batch(tmp_path, capsys):
    assert (
        main(
            [
                str(EXAMPLES / "mlp.py"),
                "--stages",
                "2",
                "--microbatches",
                "3",
                "-o",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "input 'x' has shape (8, 32)" in err and "not divisible into 3 micro-batches" in err
    assert not (tmp_path / "o").exists()


def test_errors_are_one_line_without_traceback(tmp_path):
    path = write_model_file(tmp_path, "import torch\nx = 1\n")
    result = subprocess.run(
        [sys.executable, "-m", "pipecompile", str(path), "--stages", "2",
         "-o", str(tmp_path / "o")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2
    assert "error:" in result.stderr and "has no 'build_model'" in result.stderr
    assert "Traceback" not in result.stderr


UNTRACEABLE = """
import torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
    def forward(self, x):
        if self.fc(x).sum().item() > 0:
            return x
        return x.nonzero()
def build_model():
    return Net()
def example_inputs():
    return (torch.randn(8, 4),)
"""


def test_untraceable_model_from_the_cli(tmp_path, capsys):
    path = write_model_file(tmp_path, UNTRACEABLE)
    assert main([str(path), "--stages", "2", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "cannot trace Net" in err and "torch.fx:" in err and "torch.export:" in err


def test_existing_foreign_directory_is_left_intact(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main([str(EXAMPLES / "mlp.py"), "--stages", "2", "-o", str(out)]) == 2
    assert "is not a pipecompile output; it holds files pipecompile did not write (notes.txt)" in (
        capsys.readouterr().err
    )
    assert (out / "notes.txt").read_text() == "keep me" and len(list(out.iterdir())) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_print_after_a_pass(tmp_path, capsys):
    assert main([str(EXAMPLES / "mlp.py"), "--stages", "2", "-q", "--print-after", "split_stages",
                 "-o", str(tmp_path / "o")]) == 0  # fmt: skip
    assert "--- IR after split_stages ---" in capsys.readouterr().out
    assert (
        main(
            [
                str(EXAMPLES / "mlp.py"),
                "--stages",
                "2",
                "--print-after",
                "nope",
                "-o",
                str(tmp_path / "p"),
            ]
        )
        == 2
    )


@pytest.mark.parametrize("missing", ["example_targets", "loss_fn"])
def test_run_needs_targets_and_loss(tmp_path, capsys, missing):
    source = (EXAMPLES / "mlp.py").read_text().replace(f"def {missing}(", f"def _{missing}(")
    path = write_model_file(tmp_path, source, "mlp_partial.py")
    out = str(tmp_path / "o")
    assert main([str(path), "--stages", "2", "-q", "-o", out]) == 0
    assert main(["run", out]) == 2
    assert f"needs {missing}" in capsys.readouterr().err
