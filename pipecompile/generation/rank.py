"""One rank 1..N-1 of `generate --nproc N` (started by ``generation.ranks``): builds its
stage alone (the rest of the model stays on the meta device) with its weights read from the
source rank 0 names, and runs turns until rank 0 says stop."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch


def main(raw: str) -> None:
    from pipecompile.generation.plan import decode_stages
    from pipecompile.generation.rank_model import WeightSource, rank_model, skeleton
    from pipecompile.generation.ranks import run_stage
    from pipecompile.generation.sampler import Sampler, Sampling
    from pipecompile.generation.session import plan_of
    from pipecompile.generation.wire import ring
    from pipecompile.ir.manifest import read_manifest

    spec = json.loads(raw)
    torch.set_num_threads(spec["threads"])
    rank = int(os.environ["PIPECOMPILE_GENERATE_RANK"])
    directory = Path(spec["directory"])
    manifest = read_manifest(directory)
    plan = plan_of(directory, manifest)
    source = WeightSource.from_json(spec["source"], manifest)
    model = rank_model(skeleton(directory, manifest), plan, rank, source)
    stage = decode_stages(model, plan, [rank])[0]
    store = torch.distributed.TCPStore("127.0.0.1", spec["port"], spec["world"], False)
    sampler = Sampler(Sampling(*spec["sampling"]))
    run_stage(stage, ring(store, rank, spec["world"]), sampler)


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except Exception as err:  # rank 0 shows this last line
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        sys.exit(1)
