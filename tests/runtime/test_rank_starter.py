"""The ranks of `run --nproc` are forked by one starter process that imported torch once:
they run with their own threads (a fork after OpenMP ran would hang there), each in a session
of its own, and the command's own process never forks."""

from __future__ import annotations

import os

from pipecompile.runtime.distributed.launch import launch
from tests.conftest import EXAMPLES
from tests.runtime.test_distributed import MLP_2, compile_to


def test_ranks_are_forked_by_one_starter_and_run_with_threads(tmp_path):
    out = compile_to(tmp_path, str(EXAMPLES / "mlp.py"), *MLP_2)
    records: list[dict] = []
    assert launch(2, [out, "--steps", "2", "--threads", "2", "-q"], keep=records) == 0
    parents = {r["parent"] for r in records}
    assert len(records) == 2 and len(parents) == 1 and os.getpid() not in parents
    assert all(r["pid"] != r["parent"] and r["session"] == r["pid"] for r in records)
