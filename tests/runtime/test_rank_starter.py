"""The ranks of `run --nproc` are forked by a starter process that imported torch once and
serves every launch of this process: they run with their own threads (a fork after OpenMP ran
would hang there), each in a session of its own, and the command's own process never forks."""

from __future__ import annotations

import ast
import os
import re
import signal

import pytest

from pipecompile.runtime.distributed.local_ranks import IMPORT_TIME, _start_up
from tests.conftest import EXAMPLES, ROOT
from tests.runtime.test_distributed import MLP_2, compile_to, launch_job


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return compile_to(tmp_path_factory.mktemp("starter"), str(EXAMPLES / "mlp.py"), *MLP_2)


def _launch(out: str, *extra: str) -> list[dict]:
    records: list[dict] = []
    assert launch_job(2, [out, "--steps", "2", "-q", *extra], keep=records) == 0
    assert len(records) == 2
    return records


def test_ranks_are_forked_by_one_starter_kept_for_later_launches(mlp):
    first = _launch(mlp, "--threads", "2")
    parents = {r["parent"] for r in first}
    assert len(parents) == 1 and os.getpid() not in parents
    assert all(r["pid"] != r["parent"] and r["session"] == r["pid"] for r in first)
    second = _launch(mlp)
    assert {r["parent"] for r in second} == parents  # the same starter
    assert {r["pid"] for r in second}.isdisjoint(r["pid"] for r in first)
    (starter,) = parents
    os.kill(starter, signal.SIGKILL)  # a dead starter is replaced by the next launch
    os.waitpid(starter, 0)  # this process started it
    assert {r["parent"] for r in _launch(mlp)} != parents


def test_a_starter_serves_launches_whose_start_up_variables_agree():
    base = {"PATH": "/bin", "PYTHONPATH": "/a", "OMP_NUM_THREADS": "2", "HOME": "/h"}
    same = {**base, "PYTEST_CURRENT_TEST": "t (call)", "OMP_NUM_THREADS": "1",
            "PIPECOMPILE_STATUS_DIR": "/tmp/x", "HOME": "/other"}  # fmt: skip
    assert _start_up(same) == _start_up(base) == {"PYTHONPATH": "/a"}
    for name in ("PYTHONPATH", "PYTHONHASHSEED", "OMP_PROC_BIND", "TORCH_LOGS",
                 "PIPECOMPILE_RECEIVE_AHEAD", "LD_PRELOAD"):  # fmt: skip
        assert _start_up({**base, name: "changed"}) != _start_up(base), name
    for name in ("PIPECOMPILE_FAULT", "PIPECOMPILE_CACHE", "PIPECOMPILE_DEBUG"):  # read by a rank
        assert _start_up({**base, name: "changed"}) == _start_up(base), name


def test_every_variable_pipecompile_reads_on_import_keys_the_starter():
    """A module-level read of a PIPECOMPILE_ variable (outside any function) happens when the
    starter imports the worker, before it forks: each one must be in IMPORT_TIME."""
    read = re.compile(r"""environ(?:\.get\(|\[)\s*["'](PIPECOMPILE_\w+)""")
    found = set()
    for path in [*(ROOT / "pipecompile").rglob("*.py"), *(ROOT / "passes").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        top += [n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body
                if not isinstance(n, ast.FunctionDef)]  # fmt: skip
        for node in top:
            found |= set(read.findall(ast.unparse(node)))
    assert "PIPECOMPILE_RECEIVE_AHEAD" in found  # the scan sees the one there is
    assert found <= set(IMPORT_TIME), found - set(IMPORT_TIME)
