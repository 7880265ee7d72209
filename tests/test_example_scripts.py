"""Every file in examples/ runs as a script, and the decorated one also compiles as a model
file and checks against its own (eager) forward.

The scripts run as ``python examples/X.py`` would, through tests/run_as_scripts.py: one process
imports torch and forks a child per script, so torch is imported once, not once per script. It
runs in the background from the moment the session's tests are known (tests/tools/background.py).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES, ROOT
from tests.tools.background import RUNS

SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))
ARGS = {"char_lm.py": ["6"]}  # 6 training steps, not the demo's 120: the same code path


SCRIPTS_JOB = "examples as scripts"  # its key in the background runs


def scripts_command() -> list[str]:
    """The command that runs every example as a script into a folder of its own (its last
    argument is the results file)."""
    folder = Path(tempfile.mkdtemp(prefix="pipecompile-scripts-"))
    jobs = [(str(EXAMPLES / name), ARGS.get(name, [])) for name in SCRIPTS]
    (folder / "jobs.json").write_text(json.dumps(jobs))
    runner = ROOT / "tests" / "run_as_scripts.py"
    return [sys.executable, str(runner), str(folder / "jobs.json"), str(folder / "results.json")]


@pytest.fixture(scope="module")
def script_runs() -> dict[str, dict]:
    """Each example run as a script: its exit status, stdout and stderr. Started in the
    background when the session's tests are known (tests/conftest.py), else here."""
    done = RUNS.result(SCRIPTS_JOB, scripts_command())
    assert done.returncode == 0, done.stderr[-2000:]
    results = Path(done.args[-1])
    found = json.loads(results.read_text())
    shutil.rmtree(results.parent, ignore_errors=True)
    return {name: found[str(EXAMPLES / name)] for name in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs_as_a_script(script, script_runs):
    result = script_runs[script]
    assert result["status"] == 0, result["stderr"][-2000:]
    assert result["stdout"].strip()


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
