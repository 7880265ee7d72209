"""Each process of a run takes its share of the cores (``--threads N`` sets it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipecompile.cli import main
from pipecompile.runtime import threads
from tests.conftest import EXAMPLES


@pytest.fixture
def restored():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_fair_share_divides_the_cores_and_never_falls_to_zero(monkeypatch):
    monkeypatch.setattr(threads, "cores", lambda: 16)
    assert [threads.fair_share(k) for k in (1, 2, 3, 4, 32)] == [16, 8, 5, 4, 1]
    monkeypatch.setattr(threads, "cores", lambda: 2)
    assert threads.fair_share(4) == 1


def test_use_threads_sets_the_given_count_or_the_share(monkeypatch, restored):
    monkeypatch.setattr(threads, "cores", lambda: 4)
    assert threads.use_threads(None, 2) == 2
    assert threads.use_threads(3, 2) == 3  # given beats the share
    assert threads.use_threads(None, None) == 3  # one process, nothing given: untouched


def test_run_threads_sets_the_local_runs_threads(tmp_path: Path, restored):
    out = tmp_path / "out"
    assert main([str(EXAMPLES / "mlp.py"), "--stages", "2", "-q", "-o", str(out)]) == 0
    torch.set_num_threads(2)
    assert main(["run", str(out), "--steps", "1", "-q", "--threads", "1"]) == 0
    assert torch.get_num_threads() == 1
