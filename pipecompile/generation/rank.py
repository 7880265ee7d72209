"""One rank 1..N-1 of `generate --nproc N`, forked by the rank starter
(``generation.children``): builds its decoding stage alone from the directory's files, with
its weights read from the source rank 0 names, and runs turns until rank 0 says
stop."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch


def main(raw: str, rank: int) -> None:
    from pipecompile.generation.job import GenerateJob
    from pipecompile.generation.places import stage_device
    from pipecompile.generation.rank_model import WeightSource, rank_stage
    from pipecompile.generation.ranks import run_stage
    from pipecompile.generation.sampler import Sampler
    from pipecompile.generation.wire import connect
    from pipecompile.options.fields import from_record
    from pipecompile.options.generate import GenerateFlags

    spec = json.loads(raw)
    torch.set_num_threads(spec["threads"])
    directory = Path(spec["directory"])
    # the job again, every refusal made here too, before the group forms
    job = GenerateJob.build(directory, [], from_record(GenerateFlags, spec["flags"]))
    manifest, plan = job.manifest, job.plan
    source = WeightSource.from_json(spec["source"], manifest)
    where = stage_device(job.device, rank)
    if where.type == "cuda":  # this process's GPU (its CUDA context made there alone)
        torch.cuda.set_device(where)
    stage = rank_stage(directory, plan, rank, source, where)
    store = torch.distributed.TCPStore("127.0.0.1", spec["port"], spec["world"], False)
    sampler = Sampler(job.sampling, job.max_new_tokens, job.eos)
    run_stage(stage, connect(store, rank, spec["world"], device=where), sampler)


def rank_entry(args: list[str]) -> int:
    """What a forked rank runs (``generation.children``): ``args`` is the spec's JSON; this
    rank is 1 + the launch's ``RANK``. A failure is one line on stderr that names the rank."""
    rank = int(os.environ["RANK"]) + 1
    try:
        main(args[0], rank)
    except Exception as err:  # rank 0 names this rank with this line
        print(f"generation rank {rank}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return 1
    return 0
