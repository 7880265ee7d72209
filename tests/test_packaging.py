"""The wheel holds every package: pyproject's package list equals the folders with an __init__.py.

An editable install finds any folder, so a subpackage missing from the list only breaks a
regular ``pip install .``, where its imports fail at run time.
"""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _on_disk() -> set[str]:
    found = set()
    for top, prefix in (("pipecompile", "pipecompile"), ("passes", "pipecompile.passes")):
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / top).parts
            found.add(".".join((prefix, *parts)))
    return found


def test_every_folder_of_modules_is_a_package() -> None:
    """A folder of modules without an __init__.py is a namespace package, which the wheel's
    package list would leave out unnoticed."""
    for top in ("pipecompile", "passes"):
        for module in (ROOT / top).rglob("*.py"):
            assert (module.parent / "__init__.py").is_file(), f"{module.parent} has no __init__.py"


def test_every_package_folder_is_declared_for_the_wheel() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(setuptools["packages"])
    assert _on_disk() - declared == set(), "add these to [tool.setuptools] packages"
    assert declared - _on_disk() == set(), "these are declared but have no __init__.py"
    assert setuptools["package-dir"] == {"pipecompile.passes": "passes"}


def test_ci_runs_exactly_the_readmes_test_command() -> None:
    """CI calls the README's second command (the tests) as it stands, so the two cannot drift."""
    readme = (ROOT / "README.md").read_text()
    blocks = [b.split("```", 1)[0].strip() for b in readme.split("```bash\n")[1:]]
    test_command = next(b for b in blocks if b.endswith("python -m pytest -q"))
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln and ln[0] != "#"]
    assert ci[-1] == test_command
    assert "-c constraints.txt" in test_command  # the CPU torch, never a CUDA build
