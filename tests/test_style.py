"""The tree stays ruff-clean (lint and format), as the style guide asks."""

from __future__ import annotations

import ast
import shutil
import subprocess

import pytest

from tests.conftest import ROOT


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]])
def test_ruff(command):
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' installs it)")
    result = subprocess.run([ruff, *command], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


FMT_SKIP_BUDGET = 20  # formatting is the formatter's, bar the hand-laid tables (the pass table)


def test_the_package_keeps_under_the_fmt_skip_budget():
    files = [*(ROOT / "pipecompile").rglob("*.py"), *(ROOT / "passes").rglob("*.py")]
    where = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in files
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if line.rstrip().endswith("# fmt: skip")
    ]
    assert len(where) < FMT_SKIP_BUDGET, "\n".join(where)


LONGEST_FUNCTION = 80  # lines, its docstring included


def test_no_function_in_the_package_is_longer_than_a_screen():
    files = [*(ROOT / "pipecompile").rglob("*.py"), *(ROOT / "passes").rglob("*.py")]
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)"
        for path in files
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (lines := node.end_lineno - node.lineno + 1) > LONGEST_FUNCTION
    ]
    assert not long, "\n".join(long)


def test_the_fuzzers_modules_import_without_a_circle():
    """Each module of tools/qa/fuzzing imports only modules below it (type-only imports too)."""
    folder = ROOT / "tools" / "qa" / "fuzzing"
    graph = {}
    for path in folder.glob("*.py"):
        tree = ast.parse(path.read_text())
        graph[path.stem] = {
            node.module.split(".")[1]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fuzzing.")
        }
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " -> ".join((*path, name))
        if name not in done:
            for used in graph.get(name, ()):
                visit(used, (*path, name))
            done.add(name)

    for name in graph:
        visit(name, ())
