"""Every file in examples/ runs as a script, and the decorated one also compiles as a model
file and checks against its own (eager) forward."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipecompile.cli import main
from tests.conftest import EXAMPLES, ROOT

SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs_as_a_script(script):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, cwd=ROOT,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip()


def test_the_decorated_training_loop_learns():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import train_with_decorator
    finally:
        sys.path.remove(str(EXAMPLES))
    losses = train_with_decorator.train(steps=15)
    assert losses[-1] < 0.5 * losses[0]


def test_a_decorated_model_file_compiles_and_checks_against_its_own_forward(tmp_path, capsys):
    out = str(tmp_path / "o")
    model = str(EXAMPLES / "train_with_decorator.py")
    assert main([model, "--stages", "3", "--microbatches", "4", "-q", "-o", out]) == 0
    assert main(["run", out, "--check"]) == 0
    assert "check passed" in capsys.readouterr().out
