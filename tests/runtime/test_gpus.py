"""Which device `run --nproc` puts its ranks on: a GPU each only where there are enough."""

import pytest

from pipecompile.errors import PipecompileError
from pipecompile.runtime.job.gpus import device_kind
from pipecompile.surfaces.cli import main


@pytest.mark.parametrize(
    ("choice", "ranks", "gpus", "kind"),
    [("cpu", 2, 8, "cpu"), ("auto", 2, 2, "cuda"), ("auto", 2, 1, "cpu"), ("auto", 1, 0, "cpu"),
     ("cuda", 1, 1, "cuda"), ("cuda", 4, 8, "cuda")],
)  # fmt: skip
def test_the_kind_follows_the_gpus_per_rank(choice, ranks, gpus, kind):
    assert device_kind(choice, ranks, gpus) == kind


def test_cuda_with_fewer_gpus_than_ranks_names_both_counts():
    with pytest.raises(PipecompileError, match="4 ranks and torch sees 1 GPU:"):
        device_kind("cuda", 4, 1)
    with pytest.raises(PipecompileError, match="sees no CUDA device"):
        device_kind("cuda", 1, 0)


def test_run_refuses_too_few_gpus_before_any_rank_starts(compiled_examples, capfd, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    directory = str(compiled_examples[("mlp", 2)])
    assert main(["run", directory, "--nproc", "2", "--device", "cuda"]) == 2
    assert "this machine has 2 ranks and torch sees 1 GPU" in capfd.readouterr().err
