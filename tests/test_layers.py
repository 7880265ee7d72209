"""The layers of the package and the one direction of their imports, checked on the source.

Every module's layer is the first package under ``pipecompile`` it lives in (the root modules
are the user surfaces); its imports, read with ``ast`` (also those inside functions), may only
reach the layers its own is allowed to use. A new module is checked as soon as it exists.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"pipecompile": ROOT / "pipecompile", "pipecompile.passes": ROOT / "passes"}

# layer -> the layers it may import (besides itself); `errors` is the shared base.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "files": {"errors"},
    "ir": {"files", "errors"},
    # the declarations of options, read by the compiler, the runtime and the surfaces alike
    "options": {"ir", "files", "errors"},
    "model": {"ir", "errors"},
    # the partition problem and its searches, the costs a balance weighs
    "balance": {"ir", "errors"},
    "frontend": {"ir", "model", "errors"},
    # the registry's facts in messages; where --balance time keeps its profiles
    "passes": {"balance", "schedules", "ir", "files", "errors"},
    "schedules": {"ir", "errors"},
    "planner": {
        "balance",
        "frontend",
        "passes",
        "schedules",
        "model",
        "runtime",
        "ir",
        "options",
        "files",
        "errors",
    },
    "compiler": {
        "planner",
        "frontend",
        "passes",
        "balance",
        "schedules",
        "model",
        "ir",
        "options",
        "errors",
    },
    "codegen": {"ir", "model", "files", "errors", "version"},
    "runtime": {"schedules", "ir", "model", "files", "options", "errors"},  # the registry's facts
    "reports": {"runtime", "schedules", "ir", "files", "options", "errors"},
    "interop": {"runtime", "ir", "files", "errors"},
    # decoding traces the model's step with a KV cache (as the front end traces), splits it
    # with the balancer's exact partition, runs the files it wrote, reads a run's weights
    "generation": {
        "frontend",
        "balance",
        "runtime",
        "model",
        "ir",
        "files",
        "options",
        "errors",
    },
}
# the surfaces (command line, API, decorator, the jobs they build) stand on every layer
ALLOWED["surfaces"] = set(ALLOWED) | {"version"}
ROOT_MODULES_AT_MOST = 12  # the top of the package shows its rooms, not loose modules
FORBIDDEN_FOR_RUNTIME = {"compiler", "passes", "frontend", "codegen", "reports", "interop"}


def _modules() -> dict[str, Path]:
    found = {}
    for package, directory in SOURCES.items():
        for path in directory.rglob("*.py"):
            parts = path.relative_to(directory).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def layer(module: str) -> str:
    """``pipecompile.ir.programs.program`` -> ``ir``; ``pipecompile.surfaces.cli`` -> ``surfaces``;
    the
    package itself (its version) -> ``version``; another root module -> ``root``."""
    parts = module.split(".")
    if module == "pipecompile":
        return "version"
    return parts[1] if len(parts) > 2 or parts[1] in ALLOWED else "root"


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every pipecompile import in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name.split(".")[0] == "pipecompile"]


MODULES = _modules()


LAYERED = sorted(m for m in MODULES if layer(m) not in ("root", "version"))


def test_the_top_of_the_package_holds_its_rooms():
    """Root modules (``__main__`` and the entry points) stay few; every other module lives in
    the room of its layer, and a root module other than those is a surface in the open."""
    top = sorted(p.name for p in (ROOT / "pipecompile").glob("*.py"))
    assert len(top) <= ROOT_MODULES_AT_MOST, top
    loose = [m for m in MODULES if layer(m) == "root" and m != "pipecompile.__main__"]
    assert loose == [], f"{loose}: put each in the room of its layer (a surface in surfaces/)"


def test_below_the_surfaces_no_function_takes_parsed_arguments():
    """The surfaces parse the command line; what they hand down is a typed value (a job, an
    options dataclass), never the parser's namespace."""
    for module, path in MODULES.items():
        if layer(module) == "surfaces":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs):
                    text = ast.unparse(arg.annotation) if arg.annotation else ""
                    assert "Namespace" not in text, f"{path}:{node.lineno} {node.name}({arg.arg})"


def test_the_compiler_imports_nothing_from_the_runtime():
    """The compiler declares its flags with the options' declarations, not the runtime's."""
    compiler = [m for m in MODULES if layer(m) == "compiler"]
    assert compiler
    for module in compiler:
        for line, name in imports(MODULES[module]):
            assert layer(name) != "runtime", f"{MODULES[module]}:{line} imports {name}"


@pytest.mark.parametrize("module", LAYERED)
def test_imports_point_down(module):
    own = layer(module)
    for line, name in imports(MODULES[module]):
        used = layer(name)
        assert used in ALLOWED[own] | {own}, (
            f"{MODULES[module].relative_to(ROOT)}:{line} imports {name} ({used} layer); "
            f"the {own} layer may use only {sorted(ALLOWED[own])}"
        )


def test_the_runtime_never_imports_the_compiler_a_pass_or_the_front_end():
    runtime = [m for m in MODULES if layer(m) == "runtime"]
    assert len(runtime) > 10
    for module in runtime:
        for line, name in imports(MODULES[module]):
            assert layer(name) not in FORBIDDEN_FOR_RUNTIME, f"{module}:{line} imports {name}"


# The rooms of the runtime -> the rooms each may import; "core" is runtime/'s own modules.
RUNTIME_ROOMS: dict[str, set[str]] = {
    "process": set(),  # the cores, signals, notes and faults of a process
    "state": {"process"},  # a step's precision, random streams, weight versions, figures
    "core": {"process", "state"},
    "training": {"core", "process", "state"},
    "check": {"core", "process", "state"},
    # a job checked before it runs: its refusals read the loop's options and its placement
    "job": {"core", "training", "process", "state"},
    "distributed": {"core", "training", "check", "job", "process", "state"},
}
RUNTIME_TOP_AT_MOST = 12  # files at the top of runtime/ (its core): the rest in rooms


def room(module: str) -> str:
    """``pipecompile.runtime.training.loop`` -> ``training``; ``...runtime.load`` -> ``core``."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 else "core"


def test_every_runtime_module_is_in_a_known_room_with_a_docstring():
    rooms = {room(m) for m in MODULES if layer(m) == "runtime" and m != "pipecompile.runtime"}
    assert rooms == set(RUNTIME_ROOMS)
    for name in RUNTIME_ROOMS:
        package = ROOT / "pipecompile" / "runtime" / ("" if name == "core" else name)
        assert ast.get_docstring(ast.parse((package / "__init__.py").read_text())), package


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer(m) == "runtime"))
def test_runtime_rooms_import_only_their_own_and_the_rooms_below(module):
    own = room(module)
    for line, name in imports(MODULES[module]):
        if layer(name) != "runtime" or name == "pipecompile.runtime":
            continue
        assert room(name) in RUNTIME_ROOMS[own] | {own}, (
            f"{MODULES[module].relative_to(ROOT)}:{line} imports {name} (the {room(name)} room); "
            f"the {own} room may use only {sorted(RUNTIME_ROOMS[own])}"
        )


def test_a_rank_loads_without_the_compiler():
    """Importing the worker (what every rank runs) loads no compiler, pass or front end."""
    code = (
        "import sys, pipecompile.runtime.distributed.worker, pipecompile.runtime.pipeline\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'pipecompile' "
        f"and m.split('.')[1:2] and m.split('.')[1] in {sorted(FORBIDDEN_FOR_RUNTIME)!r})\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_passes_holds_the_passes_one_a_file() -> None:
    """passes/ holds the compiler's passes, one a file; their helpers live in balance/."""
    from pipecompile.compiler.pass_names import PASSES

    found = {p.stem for p in (ROOT / "passes").glob("*.py")} - {"__init__"}
    assert found == set(PASSES) - {"schedule", "trace", "cut_tail"}  # the driver's, the front end's


def test_the_runtime_top_holds_at_most_twelve_files() -> None:
    top = [p for p in (ROOT / "pipecompile" / "runtime").glob("*.py") if p.name != "__init__.py"]
    assert len(top) <= RUNTIME_TOP_AT_MOST, sorted(p.name for p in top)
