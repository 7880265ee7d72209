"""Two nodes on one machine: two torch launchers (``--nnodes 2``, c10d rendezvous on
127.0.0.1), each starting half the ranks, give the same ``--check`` result as one node: equal
to the local backend bit for bit, as one node's run is in test_distributed.py (which asserts
the same ``max |diff| 0.000e+00``). The commands are the ones docs/DISTRIBUTED.md shows."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from pipecompile.cli import main
from tests.conftest import EXAMPLES


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node(out: Path, port: int) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
            "--nproc-per-node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes",
            "-m", "pipecompile.runtime.distributed.worker", str(out), "--check"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)  # fmt: skip


def _comparison(text: str) -> str:
    found = re.search(r"distributed \(4 ranks\) vs local backend: .*", text)
    assert found, text
    return found.group(0)


def test_two_launchers_of_two_ranks_equal_one_node(tmp_path):
    model = tmp_path / "mlp.py"
    shutil.copy(EXAMPLES / "mlp.py", model)
    out = tmp_path / "out"
    assert main([str(model), "--stages", "4", "--microbatches", "4", "-q", "-o", str(out)]) == 0
    port = _free_port()
    nodes = [_node(out, port), _node(out, port)]
    try:
        results = [node.communicate(timeout=240) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, 9)
    assert [node.returncode for node in nodes] == [0, 0], results
    text = "".join(stdout for stdout, _ in results)
    assert text.count("check passed") == 1, text  # rank 0 reports, on whichever node it is
    differences = re.findall(r"\d\.\d+e[+-]\d+", _comparison(text))  # gradient, loss, outputs
    assert differences and set(differences) == {"0.000e+00"}, text
