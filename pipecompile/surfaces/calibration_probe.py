"""Two measurements the plan search's calibration (``pipecompile.planner.calibrate``) makes
in fresh processes, each printing its figures as the last line of stdout:

- ``python -m pipecompile.surfaces.calibration_probe THREADS``: the runtime's own seconds per
  compute instruction: a tiny model compiled into 4 stages and trained for a step with 32
  micro-batches on the local backend, less the same model's eager forwards and backwards,
  over its 256 compute instructions (JSON: ``instr_overhead``, and ``spread``, the larger
  of the two timings' spreads);
- ``torchrun --nproc-per-node N -m pipecompile.surfaces.calibration_probe --ranks THREADS``: what N
  ranks on this machine pay for messages (gloo): the latency of a small message (neighbour
  pairs ping-ponging at once) and the bandwidth of a 4 MiB all-reduce over all of them. The
  calibration starts those ranks itself as `run --nproc` does (``rank_main``, forked by the
  process's rank starter), which spares it torchrun's interpreters.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from pipecompile.planner.calibration_timing import repeats, spread

__all__ = ["per_instruction", "probe_rank_figures", "rank_main"]


def per_instruction() -> dict[str, float]:
    """Seconds pipecompile's runtime adds per compute instruction (``instr_overhead``), and
    how far its timings' repeats spread (``spread``; see the module doc)."""
    from pipecompile.schedules import DEFAULT_SCHEDULE
    from pipecompile.surfaces.api import compile as compile_pipeline

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(8)])
    x, target = torch.randn(32, 8), torch.zeros(32, 8)
    pipe = compile_pipeline(model, x, stages=4, microbatches=32, schedule=DEFAULT_SCHEDULE)
    sgd = lambda params: torch.optim.SGD(params, lr=0.0)  # noqa: E731 - a factory

    def step() -> None:
        pipe.train_step(x, target, F.mse_loss, sgd)

    def eager() -> None:
        for chunk, t in zip(x.split(1), target.split(1)):
            F.mse_loss(model(chunk), t).backward()

    piped, alone = repeats(step, 3), repeats(eager, 3)
    seconds = max(0.0, (min(piped) - min(alone)) / (2 * 4 * 32))
    return {"instr_overhead": seconds, "spread": max(spread(piped), spread(alone))}


def probe_rank_figures() -> dict[str, float] | None:
    """On every rank of a torchrun: message latency and all-reduce bandwidth (rank 0 gets
    them, the slowest pair's latency and the all-reduce as every rank timed it)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    partner = rank ^ 1
    small, rounds = torch.zeros(256), 100

    def ping() -> None:
        if partner >= world:
            return
        for _ in range(rounds):
            if rank % 2 == 0:
                dist.send(small, partner)
                dist.recv(small, partner)
            else:
                dist.recv(small, partner)
                dist.send(small, partner)

    big = torch.zeros(1 << 20)
    ping()
    dist.all_reduce(big)
    dist.barrier()
    start = time.perf_counter()
    ping()
    latency = torch.tensor([(time.perf_counter() - start) / (2 * rounds)])
    dist.barrier()
    start = time.perf_counter()
    for _ in range(5):
        dist.all_reduce(big)
    seconds = torch.tensor([(time.perf_counter() - start) / 5])
    dist.all_reduce(latency, op=dist.ReduceOp.MAX)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    dist.destroy_process_group()
    if rank != 0:
        return None
    moved = 2 * (world - 1) / world * big.numel() * big.element_size()
    return {"message_latency": latency.item(), "bandwidth": moved / seconds.item()}


def rank_main(args: list[str]) -> int:
    """A rank of the calibration's launch (``local_ranks.LocalRanks``, ``entry``):
    ``args`` are ``THREADS OUT``; rank 0 writes ``probe_rank_figures()`` to the file OUT as JSON."""
    torch.set_num_threads(int(args[0]))
    found = probe_rank_figures()
    if found is not None:
        with open(args[1], "w") as out:
            json.dump(found, out)
    return 0


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--ranks"]
    torch.set_num_threads(int(args[0]) if args else torch.get_num_threads())
    if "--ranks" in sys.argv:
        found = probe_rank_figures()
        if found is not None:
            print(json.dumps(found))
    else:
        print(json.dumps(per_instruction()))
