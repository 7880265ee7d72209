"""tools/qa/zoo.py's own logic, without running any zoo: how a command's exit is classified,
that every model file it writes is Python, and its report. Its ``--quick`` run (three real
models through pipecompile) is tests/tools/test_quick.py's.
"""

from __future__ import annotations

import ast
import os
import sys

import pytest

from tests.conftest import ROOT, load_tool

TOOL = ROOT / "tools" / "qa" / "zoo.py"


zoo = load_tool(TOOL)

TRACE = """Traceback (most recent call last):
  File "x.py", line 1, in <module>
    f()
RuntimeError: shape mismatch
"""


@pytest.mark.parametrize(
    ("phase", "code", "output", "outcome", "reason"),
    [
        ("compile", 0, "", "ok", ""),
        ("check", 0, "check passed\n", "ok", ""),
        ("compile", 2, "pipecompile: error: no cut fits\n", "refused", "no cut fits"),
        ("check", 2, "pipecompile: error: stage 1 broke\n", "refused", "run: stage 1 broke"),
        ("compile", 1, TRACE, "traceback", "RuntimeError: shape mismatch"),
        (
            "compile",
            2,
            "pipecompile: error: cannot trace M:\n  torch.fx: A\n  torch.export: B\nMake it...\n",
            "refused",
            "cannot trace M: torch.fx: A torch.export: B",
        ),
        (
            "check",
            1,
            "  grads  max |diff| 1e-1\npipecompile: check failed\n",
            "wrong",
            "check failed; grads max |diff| 1e-1",
        ),  # fmt: skip
        (
            "compile",
            2,
            "pipecompile: error: pass x: E: y\nThis is a pipecompile bug; ...\n",
            "traceback",
            "pipecompile: error: pass x: E: y",
        ),  # fmt: skip
        ("compile", -9, "", "traceback", "exit signal 9: no output"),
        ("compile", None, "", "hang", "compile: ran past 5 s"),
    ],
)
def test_each_exit_is_classified(phase, code, output, outcome, reason) -> None:  # type: ignore[no-untyped-def]
    got = zoo.verdict(phase, zoo.Ran(code, output, 1.0), 5.0)
    assert got == (outcome, reason)


@pytest.mark.parametrize("name", ["timm", "hf"])
def test_every_model_file_is_python(name: str) -> None:
    module = zoo.ZOOS[name]
    for model in module.names("/nowhere"):
        source = module.model(model, "/nowhere").source
        tree = ast.parse(source)
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert {"build_model", "example_inputs", "example_targets", "loss_fn"} <= defined


def test_torchvision_model_files_name_the_zoo_folder() -> None:
    source = zoo.ZOOS["torchvision"].model("inception_v3", "/zoo/dir").source
    ast.parse(source)
    assert "sys.path.insert(0, '/zoo/dir')" in source and "aux_logits=False" in source


def test_report_counts_and_lists_what_is_not_ok() -> None:
    results = [
        zoo.Result("timm", "a", 2, "ok", peer_split=True, peer_equal=True, shape="graph"),
        zoo.Result("timm", "b", 2, "wrong", "grads differ", peer_split=True, peer_equal=False),
        zoo.Result("timm", "c", 2, "skipped", "eager: TypeError: x"),
        zoo.Result("hf", "d", 4, "refused", "no cut fits", generation="ok"),
        zoo.Result("hf", "e", 4, "ok", generation="refused", generation_reason="no cache"),
    ]
    text = zoo.report(results)
    assert "| timm | 2 | 2 | 1 | 0 | 0 | 1 | 0 | 1 | 50 | 1/2 | - | 2/2 | 1/2 |" in text
    assert "| hf | 4 | 2 | 1 | 1 | 0 | 0 | 0 | 0 | 50 | 0/2 | 1/2 | - | - |" in text
    assert "timm b [2 stages]: grads differ" in text
    assert "timm c [2 stages]: eager: TypeError: x" in text
    assert "hf e [4 stages] refused: no cache" in text  # decoding that is not equal, listed
    assert zoo.exit_status(results, quick=False, install_failed=False) == 1
    decoded_wrong = [zoo.Result("hf", "f", 2, "ok", generation="wrong")]
    assert zoo.exit_status(decoded_wrong, quick=False, install_failed=False) == 1


def test_a_command_runs_with_its_output_and_its_time_limit():
    """A full sweep's children are fresh interpreters (its --quick run forks them instead)."""
    env = dict(os.environ)
    said = zoo.run([sys.executable, "-c", "import sys; print('out'); sys.exit('err')"], 60, env)
    assert said.returncode == 1 and said.output.split() == ["out", "err"]
    late = zoo.run([sys.executable, "-c", "import time; time.sleep(60)"], 0.5, env)
    assert late.returncode is None and late.seconds < 30


def test_a_users_mistake_is_a_usage_error_naming_it(tmp_path, capsys) -> None:
    """A missing or foreign --report file and stage counts below 1 are refused at once, not a
    traceback or a sweep that counts every model refused."""
    bad = tmp_path / "bad.json"
    bad.write_text("[1")
    for argv, said in [
        (["--report", str(tmp_path / "missing.json")], "cannot read it"),
        (["--report", str(bad)], "not a --json file of this tool"),
        (["--stages", "0"], "'0' is not stage counts"),
        (["--jobs", "0"], "'0' is not a number above 0"),
    ]:
        with pytest.raises(SystemExit) as stop:
            zoo.parse(argv)
        assert stop.value.code == 2 and said in capsys.readouterr().err


def test_the_zoo_folder_defaults_to_the_users_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert zoo.default_zoo_dir() == tmp_path / "pipecompile" / "zoo"
    assert ROOT not in zoo.default_zoo_dir().parents
