"""One meaning per public name: every public class and function of the package is defined in one
module (a reader, and a search, lands on the one meant), and "generate" names decoding only
(the schedules build compute programs: ``schedules.compute_program``)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("pipecompile", "passes")
ENTRY_POINTS = {"main"}  # each program's entry point is its module's ``main``
DECODING = (
    "pipecompile/generation/",
    "pipecompile/ir/records/generation_plan.py",
    "pipecompile/options/generate.py",  # decoding's options, declared as run's are
    "pipecompile/surfaces/",
)


def _defined() -> dict[str, list[str]]:
    """Each public module-level class or function name, with the modules defining it."""
    found: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in tree.body:
                kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
                if isinstance(node, kinds) and not node.name.startswith("_"):
                    found[node.name].append(str(path.relative_to(ROOT)))
    return found


def test_every_public_name_is_defined_once() -> None:
    twice = {
        name: where
        for name, where in _defined().items()
        if len(where) > 1 and name not in ENTRY_POINTS
    }
    assert not twice, f"defined in several modules: {twice}"


def test_generate_names_decoding_only() -> None:
    elsewhere = {
        name: where
        for name, where in _defined().items()
        if "generate" in name.lower() and any(not w.startswith(DECODING) for w in where)
    }
    assert not elsewhere, f"'generate' outside decoding: {elsewhere}"


def test_the_check_finds_a_name_defined_twice(tmp_path: Path) -> None:
    """The walk sees module-level definitions (the test above can fail)."""
    found = _defined()
    assert "compute_program" in found and found["compute_program"] == [
        "pipecompile/schedules/__init__.py"
    ]
    assert len(found["main"]) > 1  # the entry points, allowed


def test_only_the_schedules_name_a_schedule() -> None:
    """A schedule is its own module and the registry: no other package file names one (the
    rest reads the registry's facts: its families, its default, a program's own name)."""
    import re

    from pipecompile.schedules import REGISTRY

    names = sorted(REGISTRY, key=len, reverse=True)
    named = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, names)) + r")(?![\w-])")
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            if where.startswith("pipecompile/schedules/"):
                continue
            lines = enumerate(path.read_text().splitlines(), 1)
            found += [f"{where}:{n}" for n, line in lines if named.search(line)]
    assert not found, found
