"""The model file's data under `run --nproc`: the ranks that read it must get the same batches
(a fingerprint compared at each batch), what its hooks print is shown per rank, a hook that
blocks is bounded by --timeout, and each rank's line is a line of its own. Two launches in
all (2 ranks, a tiny MLP); the rest is checked without starting ranks."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from pipecompile.errors import PipecompileError
from pipecompile.model.data_hooks import Batch, BatchSource
from pipecompile.runtime.distributed import launch as launch_module
from pipecompile.runtime.distributed.rank_output import PrefixedLines, user_output
from pipecompile.runtime.distributed.watchdog import Watchdog
from pipecompile.runtime.training.batch_agreement import agree_on_batch, fingerprint
from pipecompile.surfaces.cli import main
from tests.conftest import write_model_file

MODEL = """
import random
import sys
import time
import torch
import torch.nn.functional as F
from torch import nn


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _batch(g):
    return (torch.randn(4, 4, generator=g),), torch.randn(4, 2, generator=g)


def example_inputs():
    return _batch(torch.Generator().manual_seed(0))[0]


def loss_fn(out, target):
    return F.mse_loss(out, target)


def train_batches():
    print("loading the data")
    print("a warning of the hook", file=sys.stderr)
    same = _batch(torch.Generator().manual_seed(0))
    BODY
"""
# random's seed comes from the OS: another on each rank
UNSEEDED = (
    "return [same, *[_batch(torch.Generator().manual_seed(random.randrange(2**62)))\n"
    "                    for _ in range(3)]]"
)
BLOCKING = "yield same\n    time.sleep(1000)\n    yield same"


def _compiled(tmp_path: Path, body: str) -> Path:
    path = write_model_file(tmp_path, MODEL.replace("BODY", body), "hooks.py")
    out = tmp_path / "out"
    assert main([str(path), "--stages", "2", "--microbatches", "2", "-q", "-o", str(out)]) == 0
    return out


def _rank_lines(err: str) -> dict[int, str]:
    lines = [ln for ln in err.splitlines() if ln.startswith("pipecompile: rank ")]
    return {int(ln.split()[2].rstrip(":")): ln for ln in lines}


def test_unseeded_shuffle_stops_every_rank_and_the_hooks_prints_are_shown(tmp_path, capfd):
    out = _compiled(tmp_path, UNSEEDED)
    assert main(["run", str(out), "--steps", "3", "--nproc", "2", "-q"]) == 2
    got = capfd.readouterr()
    for rank in (0, 1):
        assert f"rank {rank}: loading the data" in got.out.splitlines(), got.out
        assert f"rank {rank}: a warning of the hook" in got.err.splitlines(), got.err
    lines = _rank_lines(got.err)
    assert sorted(lines) == [0, 1], got.err
    for line in lines.values():
        assert line.count("pipecompile:") == 1
        assert (
            "train_batches() of hooks.py gave rank 0 and rank 1 different batches at batch 1"
            in line
        )
        assert "seed its shuffling" in line


def test_a_blocking_hook_is_bounded_by_the_timeout(tmp_path, capfd):
    out = _compiled(tmp_path, BLOCKING)
    start = time.monotonic()
    assert main(["run", str(out), "--steps", "3", "--nproc", "2", "-q", "--timeout", "3"]) == 2
    assert time.monotonic() - start < 120  # generous: never a hang
    lines = _rank_lines(capfd.readouterr().err)
    assert sorted(lines) == [0, 1], lines
    for line in lines.values():
        assert "train_batches() of hooks.py, batch 1 did not return within --timeout 3 s" in line


# -- without ranks ------------------------------------------------------------------------------


def _batch(x: torch.Tensor, y: torch.Tensor) -> Batch:
    return Batch({"x": x}, (y,))


def test_the_fingerprint_sees_order_shape_and_dtype():
    x, y = torch.randn(8, 3), torch.randint(0, 5, (8,))
    assert fingerprint(_batch(x, y)) == fingerprint(_batch(x.clone(), y.clone()))
    assert fingerprint(_batch(x.flip(0), y.flip(0))) != fingerprint(_batch(x, y))
    assert fingerprint(_batch(x[:4], y[:4])) != fingerprint(_batch(x, y))
    assert fingerprint(_batch(x.double(), y)) != fingerprint(_batch(x, y))
    assert fingerprint(_batch(x.bfloat16(), y.bool())) == fingerprint(
        _batch(x.bfloat16(), y.bool())
    )
    assert 0 <= fingerprint(_batch(x, y)) < 2**48


class _Gathered:
    def __init__(self, values: list[float]) -> None:
        self.values = values

    def gather(self, values: list[float]) -> list[list[float]]:
        return [[v] for v in self.values]


def test_agreement_ignores_ranks_without_data_and_names_the_batch():
    batch = _batch(torch.ones(2, 2), torch.ones(2))
    source = BatchSource(lambda: iter([batch]), 1, "train_batches() of m.py")
    same = fingerprint(batch)
    agree_on_batch(batch, source, 0, 1, _Gathered([same, float("nan"), same]))
    agree_on_batch(None, None, 0, 1, _Gathered([same, float("nan"), same + 1]))  # a middle rank
    with pytest.raises(PipecompileError, match="rank 0 and rank 2 different batches at batch 4 "
                       "of epoch 2"):  # fmt: skip
        agree_on_batch(batch, source, 4, 2, _Gathered([same, float("nan"), same + 1]))


def test_hook_output_is_prefixed_line_by_line():
    target = io.StringIO()
    stream = PrefixedLines(target, "rank 1: ")
    stream.write("one\ntw")
    stream.write("o\nthree")
    stream.close()
    assert target.getvalue() == "rank 1: one\nrank 1: two\nrank 1: three\n"
    with user_output(3):
        print("shown")  # to the real stdout, prefixed; checked by capfd in the launches above


def test_two_ranks_lines_that_share_a_line_are_split(capsys):
    merged = "pipecompile: rank 1: error: A pipecompile: rank 0: stopping at instruction 0F0: B\n"
    launch_module._outcome(2, 1, merged, [{"rank": 0, "status": 3}, {"rank": 1, "status": 2}])
    assert capsys.readouterr().err.splitlines() == [
        "pipecompile: rank 1: error: A ",
        "pipecompile: rank 0: stopping at instruction 0F0: B",
    ]


def test_the_watchdog_names_a_rank_stuck_in_the_hook():
    store = dist.HashStore()
    stuck = Watchdog(store, 1, 2, timeout=3)
    waiting = Watchdog(store, 0, 2, timeout=3)
    stuck.reading("train_batches() of m.py, batch 2")
    stuck.publish_now()
    waiting.at("0RECV_F0")
    expected = "rank 1: train_batches() of m.py, batch 2 did not return within --timeout 3 s"
    assert waiting._no_progress().startswith(expected)
    assert stuck._no_progress().startswith(expected)
