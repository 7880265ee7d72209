"""Shared fixtures: the example models compiled once per session into a temporary directory."""

from __future__ import annotations

import atexit
import functools
import importlib.util
import inspect
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
import torch

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.model.model_configs import model_configs
from pipecompile.model.model_file import ModelSpec, load_model_file

# One intra-op thread for this process and every command it starts (the ranks of a launch
# take their own share): the suite keeps both of CI's cores busy (these tests on one, the
# background runs of tests/tools/background.py on the other), and torch's threads wait for
# each other at every op, so a second thread on a busy core slows an op down instead of
# speeding it up (a fuzz test took 11 s with two threads beside a busy core, 4.3 s with one).
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# The plan search's calibration of this machine: measured once per test session by the tests
# that turn it on, kept outside the user's ~/.cache (rank and CLI subprocesses inherit it).
if "PIPECOMPILE_CACHE" not in os.environ:
    os.environ["PIPECOMPILE_CACHE"] = tempfile.mkdtemp(prefix="pipecompile-test-cache-")
    atexit.register(shutil.rmtree, os.environ["PIPECOMPILE_CACHE"], True)
# A search prices plans with the flags' model unless a test calibrates (tests/planner/).
os.environ.setdefault("PIPECOMPILE_CALIBRATION", "off")
# The proof that ends every compile runs where a test asks for it (tests/codegen/test_prove.py,
# the zoo and proof_cost tools' quick runs): the suite's other tests compare with eager anyway.
os.environ.setdefault("PIPECOMPILE_VERIFY", "off")

# PIPECOMPILE_ALL_CASES=1 also runs the cases a default run samples out (marked SAMPLED_OUT),
# which keep the default run within its time: each repeats a path another case covers.
ALL_CASES = os.environ.get("PIPECOMPILE_ALL_CASES") == "1"
SAMPLED_OUT = pytest.mark.skipif(
    not ALL_CASES, reason="sampled out of the default run; PIPECOMPILE_ALL_CASES=1 runs it"
)
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
EXAMPLE_NAMES = ["mlp", "resnet", "gpt", "hf_gpt2", "hf_bert", "hf_llama", "two_towers"]
STAGE_COUNTS = [1, 2, 3, 4]


def load_tool(path: Path) -> ModuleType:
    """A tools/ script imported as the module named after its file (its dataclasses look
    their module up by that name in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


@functools.cache
def catalogue_tool() -> ModuleType:
    """tools/qa/bad_inputs.py (and its catalogue), loaded once for every test that reads it."""
    return load_tool(ROOT / "tools" / "qa" / "bad_inputs.py")


@pytest.fixture(scope="session")
def catalogue_workspace(tmp_path_factory: pytest.TempPathFactory) -> object:
    """The catalogue's bases and cases, each prepared once for every test that runs it."""
    return catalogue_tool().Workspace(tmp_path_factory.mktemp("catalogue").resolve())


def example_spec(name: str) -> ModelSpec:
    return load_model_file(str(EXAMPLES / f"{name}.py"))


def named_inputs(model: torch.nn.Module, raw: object) -> dict[str, torch.Tensor]:
    if isinstance(raw, dict):
        return raw
    return dict(zip(inspect.signature(model.forward).parameters, raw))  # type: ignore[arg-type]


def compile_example(name: str, stages: int, root: Path, spec: ModelSpec | None = None) -> Path:
    """``root/<name>_<stages>``: the example (``spec`` when given, loaded once for several
    stage counts) compiled into ``stages`` stages, 2 micro-batches."""
    spec = spec or example_spec(name)
    compiled = compile_model(spec.model, spec.inputs, stages=stages, microbatches=2)
    target = root / f"{name}_{stages}"
    emit(compiled, target, model=ModelRef(spec.path, spec.name, name, model_configs(spec.model)))
    return target


EXAMPLES_JOB = "compiled examples"  # its key in the background runs


@functools.cache
def _compiled_root() -> Path:
    """Where the job writes the compiled examples: made on first use, removed at exit."""
    root = Path(tempfile.mkdtemp(prefix="pipecompile-examples-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def examples_command() -> list[str]:
    """The background job that compiles the ``compiled_examples`` directories."""
    return [sys.executable, str(ROOT / "tests" / "compile_examples.py"), str(_compiled_root())]


@pytest.fixture(scope="session")
def compiled_examples() -> dict[tuple[str, int], Path]:
    """(example, stages) -> emitted directory, 2 micro-batches each: 28 compiles, made by a
    background job from the session's start (tests/compile_examples.py), beside the first
    tests rather than before the first test that needs them."""
    from tests.tools.background import RUNS

    done = RUNS.result(EXAMPLES_JOB, examples_command())
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stdout + done.stderr
    root = _compiled_root()
    return {(n, s): root / f"{n}_{s}" for n in EXAMPLE_NAMES for s in STAGE_COUNTS}


TINY_LM = '''"""A small language model: a tied embedding, dropout {dropout}."""
import torch
from torch import nn

VOCAB, WIDTH, TOKENS, DROPOUT = 32, 16, 8, {dropout}


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.h = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Dropout(DROPOUT))
            for _ in range(4)
        )
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids):
        x = self.wte(ids)
        for block in self.h:
            x = x + block(x)
        return self.lm_head(x)


def build_model():
    torch.manual_seed(0)
    return TinyLM()


def loss_fn(logits, target):
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))
'''  # a model file's start: the tests add their data hooks


def write_model_file(tmp_path: Path, source: str, name: str = "model.py") -> Path:
    path = tmp_path / name
    path.write_text(source)
    return path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules with tests of the compiled examples run after the others (and before
    tests/tools/, collected last): their directories come from a background job started with
    the session (``compiled_examples``), which is done by then."""
    uses = {i.module for i in items if "compiled_examples" in getattr(i, "fixturenames", ())}
    late = [i for i in items if getattr(i, "module", None) in uses]
    if not late:
        return
    rest = [i for i in items if getattr(i, "module", None) not in uses]
    tools = next((k for k, i in enumerate(rest) if i.nodeid.startswith("tests/tools/")), None)
    at = len(rest) if tools is None else tools
    items[:] = [*rest[:at], *late, *rest[at:]]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the selected tools' quick runs, and the examples run as scripts, in the background
    (tests/tools/background.py)."""
    if session.config.option.collectonly:
        return
    from tests.tools.background import RUNS

    quick = [
        item.callspec.params["script"]
        for item in session.items
        if getattr(item, "originalname", None) == "test_quick_mode_runs"
    ]
    alone = all(item.nodeid.startswith("tests/tools/") for item in session.items)
    jobs = {}
    if any("compiled_examples" in getattr(item, "fixturenames", ()) for item in session.items):
        jobs[EXAMPLES_JOB] = examples_command()
    if any(item.nodeid.startswith("tests/test_example_scripts.py::") for item in session.items):
        from tests.test_example_scripts import SCRIPTS_JOB, scripts_command

        jobs[SCRIPTS_JOB] = scripts_command()
    if any(item.nodeid.startswith("tests/test_bad_inputs.py::") for item in session.items):
        from tests.test_bad_inputs import SUBSET_JOB, subset_command

        jobs[SUBSET_JOB] = subset_command()
    RUNS.start(quick, at_once=2 if alone else 1, jobs=jobs)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The background runs' times beside the slowest tests (what a session's time is made of)."""
    from tests.tools.background import RUNS

    line = RUNS.summary()
    if line:
        terminalreporter.write_line(line)


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.tools.background import RUNS

    RUNS.stop()
