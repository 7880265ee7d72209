"""Where the decoding stages run (`generate --device`): the kind chosen from the GPUs per rank
(ranks may share a GPU, unlike `run`'s), `--device cuda` refused alike at every door on a
machine without a GPU, and on a GPU (skipped without one) the same tokens as on the CPU, in
one process and with one rank per stage."""

from __future__ import annotations

import argparse

import pytest
import torch

import pipecompile
from pipecompile.generation.places import generation_device
from pipecompile.generation.step_trace import GenerateError
from pipecompile.surfaces.cli import main
from tests.generation.test_command import PROMPTS, _generate


@pytest.mark.parametrize(
    ("choice", "ranks", "gpus", "kind"),
    [(None, 1, 0, "cpu"), (None, 1, 1, "cuda"), ("auto", 2, 1, "cpu"), ("auto", 2, 2, "cuda"),
     ("cpu", 1, 8, "cpu"), ("cuda", 2, 1, "cuda"), ("cuda", 4, 8, "cuda")],
)  # fmt: skip
def test_the_kind_follows_the_gpus_and_ranks_may_share_one(choice, ranks, gpus, kind):
    assert generation_device(choice, ranks, gpus) == kind


def test_cuda_without_a_gpu_is_a_generate_error():
    with pytest.raises(GenerateError, match="--device cuda, but torch sees no CUDA device"):
        generation_device("cuda", 1, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_cuda_without_a_gpu_is_refused_alike_at_every_door(gpt_generate, capsys):
    said = "--device cuda, but torch sees no CUDA device: use --device cpu"
    args = ["generate", str(gpt_generate), "--prompt-ids", "1,2", "--device", "cuda"]
    assert main(args) == 2  # the command
    assert f"pipecompile: error: {said}" in capsys.readouterr().err
    with pytest.raises(GenerateError, match=said):  # the API
        pipecompile.load(gpt_generate).generate([[1, 2]], device="cuda")
    from pipecompile.surfaces.generate_command import generate_parser, prepared

    worker: argparse.Namespace = generate_parser("w").parse_args(args[1:])
    with pytest.raises(GenerateError, match=said):  # a torchrun rank, before any group forms
        prepared(worker, ranks=2, local_ranks=1)


def test_the_host_given_by_name_decodes_what_auto_does_here(gpt_generate, capsys):
    if torch.cuda.is_available():
        pytest.skip("auto is the GPU on this machine")
    assert _generate(capsys, gpt_generate, "--device", "cpu") == _generate(capsys, gpt_generate)


@pytest.mark.parametrize("first", ["meta", "cpu"])
def test_every_tensor_a_stage_makes_is_made_on_its_device(first):
    """The device plumbing without a GPU: Hugging Face GPT-2's three decoding stages (the
    greedy tests' compile), the first on the meta device or the host and the others on the
    meta device, run a prefill and a decode of gathered rows from ids on the host. A tensor
    a stage file makes on the host (GPT-2's make some), or a hidden state or position not
    moved to its stage's device, would meet a meta tensor in an op, which torch refuses; the
    logits come out on the last stage's device."""
    from pipecompile.generation.job import GenerateJob
    from pipecompile.generation.rank_model import WeightSource, rank_stage
    from pipecompile.generation.stages import Call, Rows
    from tests.generation.test_hf_greedy import _compiled

    directory = _compiled("gpt2", 3, 2, 2)[1].directory
    job = GenerateJob.build(directory, [])
    source = WeightSource("directory", directory, job.manifest)
    plan = job.plan
    places = [first, *["meta"] * (plan.stages - 1)]
    stages = [rank_stage(directory, plan, k, source, places[k]) for k in range(plan.stages)]
    prefill = [Call(Rows((1,), torch.arange(3)[None]))]
    decode = [Call(Rows((1, 0), torch.tensor([[3], [0]])))]  # not in order: gathered
    for calls, ids in ((prefill, torch.tensor([[5, 17, 3]])), (decode, torch.tensor([[8], [2]]))):
        xs = [ids]
        for stage in stages:
            xs = stage.run(0, calls, xs)
        assert xs[0].device.type == "meta"
        assert tuple(xs[0].shape) == (len(calls[0].rows.rows), plan.vocab)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_gpu_the_tokens_are_the_hosts(gpt_generate, capsys):
    """Greedy tokens: one process with every stage on a GPU, and one rank per stage (NCCL
    between two GPUs, or through host memory where the ranks share one)."""
    here = _generate(capsys, gpt_generate, "--device", "cpu")
    assert _generate(capsys, gpt_generate, "--device", "cuda") == here
    assert _generate(capsys, gpt_generate, "--device", "cuda", "--nproc", "2") == here
    rows = pipecompile.load(gpt_generate).generate(PROMPTS, max_new_tokens=7, device="cuda")
    assert [r.tolist() for r in rows] == [p + here[k] for k, p in enumerate(PROMPTS)]
