"""Generation ranks started by torchrun (`-m pipecompile.surfaces.generate_worker OUT ...`, the
same command on every node): two launchers on this machine meeting by c10d rendezvous, a stage
each, generate the tokens one process does; a refusal is the one `pipecompile generate` makes,
said once, before any process group forms; a rank killed mid-generation ends the job, named,
without a hang."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SAMPLED_OUT

PROMPTS = ["--prompt-ids", "5,17,3", "--prompt-ids", "40", "--prompt-ids", "9,9,9,9,2"]
WORKER = "pipecompile.surfaces.generate_worker"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(nodes: int, per_node: int, port: int, *args: str, env: dict | None = None):
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes),
            "--nproc-per-node", str(per_node), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "generate",
            "-m", WORKER, *args]  # fmt: skip
    full = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full, start_new_session=True)  # fmt: skip


def _finished(procs: list[subprocess.Popen], timeout: float = 180) -> list[tuple[int, str, str]]:
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


def _here(directory: Path, capsys) -> str:  # noqa: ANN001
    from pipecompile.surfaces.cli import main

    capsys.readouterr()
    assert main(["generate", str(directory), *PROMPTS, "--max-new-tokens", "7", "-q"]) == 0
    return capsys.readouterr().out


def test_two_launchers_generate_what_one_process_does(gpt_generate, capsys):
    port = _free_port()
    args = (str(gpt_generate), *PROMPTS, "--max-new-tokens", "7", "-q")
    done = _finished([_torchrun(2, 1, port, *args), _torchrun(2, 1, port, *args)])
    assert [code for code, _, _ in done] == [0, 0], done
    printed = [out for _, out, _ in done if out.strip()]
    assert printed == [_here(gpt_generate, capsys)]  # rank 0's node prints, once


# sampled out for time (PIPECOMPILE_ALL_CASES=1 runs them): the refusals the worker makes
# through generate's door (tests/test_doors.py and the catalogue make them at the others),
# and a killed rank under torchrun (the watchdog's line; `generate --nproc`'s killed and hung
# ranks are tests/generation/test_command.py's)
@pytest.mark.parametrize(
    "option",
    [
        pytest.param(["--top-k", "0"], id="top-k", marks=SAMPLED_OUT),
        pytest.param(["--nproc", "3"], id="nproc", marks=SAMPLED_OUT),
    ],
)
def test_a_refusal_is_the_commands_and_said_once(gpt_generate, capsys, option):
    from pipecompile.surfaces.cli import main

    capsys.readouterr()
    assert main(["generate", str(gpt_generate), *PROMPTS, *option]) == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    if option[0] == "--nproc":  # the launcher's world is the generation's
        said = "pipecompile: error: --nproc 3, but the launcher started 2 rank(s)"
    ((code, out, err),) = _finished([_torchrun(1, 2, _free_port(), str(gpt_generate), *PROMPTS,
                                               *option)])  # fmt: skip
    assert code != 0 and not re.search(r'File ".*/pipecompile/', err), err  # (torchrun's own)
    lines = [x for x in err.splitlines() if x.startswith("pipecompile:")]
    assert len(lines) == 1 and lines[0].startswith(said), err


@SAMPLED_OUT
def test_a_killed_rank_ends_the_job_named(gpt_generate):
    env = {"PIPECOMPILE_FAULT": "1:2:turn:kill"}
    args = (str(gpt_generate), *PROMPTS, "--max-new-tokens", "7", "--timeout", "60")
    ((code, out, err),) = _finished([_torchrun(1, 2, _free_port(), *args, env=env)], 120)
    assert code != 0
    said = [x for x in err.splitlines() if x.startswith("pipecompile: rank 0: stopping")]
    assert said and "rank 1 died" in said[0], err  # the watchdog's line (or the wire's)
