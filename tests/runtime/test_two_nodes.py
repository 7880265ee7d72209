"""Two nodes on one machine: two torch launchers (``--nnodes 2``, c10d rendezvous on
127.0.0.1), each starting one rank, run a 2-stage pipeline with a stage on each node (the
activations and gradients cross between the launchers' ranks) and train the losses of the same
pipeline run in one process. The commands are the ones docs/DISTRIBUTED.md shows."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node(out: Path, port: int, metrics: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
            "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes",
            "-m", "pipecompile.runtime.distributed.worker", str(out), *TRAIN,
            "--metrics", str(metrics)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)  # fmt: skip


TRAIN = ["--steps", "3", "--seed", "0", "--lr", "0.01", "-q"]


def _losses(path: Path) -> list[float]:
    return [
        r["loss"] for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "train"
    ]


def test_two_launchers_with_a_stage_each_equal_one_process(tmp_path):
    model = tmp_path / "mlp.py"
    shutil.copy(EXAMPLES / "mlp.py", model)
    out = tmp_path / "out"
    assert main([str(model), "--stages", "2", "--microbatches", "4", "-q", "-o", str(out)]) == 0
    port, metrics = _free_port(), tmp_path / "nodes.jsonl"
    nodes = [_node(out, port, metrics), _node(out, port, metrics)]
    try:
        results = [node.communicate(timeout=240) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, 9)
    assert [node.returncode for node in nodes] == [0, 0], results
    one = tmp_path / "one.jsonl"
    assert main(["run", str(out), *TRAIN, "--metrics", str(one)]) == 0
    expected = _losses(one)
    assert len(expected) == 3
    assert _losses(metrics) == pytest.approx(expected, rel=1e-6, abs=0)
