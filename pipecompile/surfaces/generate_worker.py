"""A generation rank started by torchrun, the same command on every node::

    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        -m pipecompile.surfaces.generate_worker OUT --prompt-ids 464,318 --max-new-tokens 20

Rank k runs decoding stage k of OUT (one rank per stage: the launchers' world is the
generation's ``--nproc``). Each rank builds the job from its own command line through the door
`pipecompile generate` and the API use (``generate_command.prepared``: the same refusals, made
before any process group forms; rank 0 says why, every rank ends with status 2). The ranks
then form torchrun's process group, and their stages (each on its node's GPU ``LOCAL_RANK``
under ``--device cuda``) talk by point-to-point messages in a gloo group of their own, with
NCCL beside it between two GPUs (``generation.wire``). Rank 0 keeps the prompt queue and prints what
`pipecompile generate` prints; the training runtime's watchdog names a rank that dies or
fails, and rank 0 stops after ``--timeout`` seconds without tokens: nothing hangs."""

from __future__ import annotations

import os
import signal
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from pipecompile.errors import PipecompileError
from pipecompile.runtime.distributed.rank_output import say

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    # before any thread exists: SIGTERM is then the watchdog thread's (torchrun's stop)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    from pipecompile.surfaces.generate_command import generate_parser, prepared

    args = generate_parser("pipecompile.surfaces.generate_worker").parse_args(argv)
    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        job, show = prepared(args, ranks=world, local_ranks=local)
    except PipecompileError as err:
        from pipecompile.runtime.distributed.worker import meet_refused

        if rank == 0:
            say(f"pipecompile: error: {err}")
        meet_refused(rank)
        sys.stdout.flush()
        os._exit(2)
    status = _generate(job, show, rank, world)
    sys.stdout.flush()
    os._exit(status)


def _generate(job, show, rank: int, world: int) -> int:  # type: ignore[no-untyped-def]
    """This rank's part; its exit status (0; 2: it failed; 3: a peer did)."""
    from pipecompile.generation.lanes import Lanes
    from pipecompile.generation.places import stage_device
    from pipecompile.generation.rank_model import WeightSource, rank_stage
    from pipecompile.generation.ranks import lead, run_stage
    from pipecompile.generation.sampler import Sampler
    from pipecompile.generation.wire import PeerGone, connect
    from pipecompile.runtime.distributed.watchdog import Watchdog
    from pipecompile.runtime.distributed.worker import end_together, peer_problem
    from pipecompile.runtime.process.threads import use_threads

    use_threads(job.threads, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    dist.init_process_group("gloo", timeout=timedelta(seconds=max(job.timeout, 1.0) * 2))
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"generate{restart}/", dist.distributed_c10d._get_default_store())
    watchdog = Watchdog(store, rank, world, timeout=job.timeout)
    watchdog.idle("building its stage")
    watchdog.start()
    status = 0
    try:
        kind = "train_state" if job.train_state is not None else "directory"
        where = job.train_state if job.train_state is not None else job.directory
        source = WeightSource(kind, where, job.manifest)
        device = stage_device(job.device, int(os.environ.get("LOCAL_RANK", "0")))
        if device.type == "cuda":  # this rank's GPU (its CUDA context made there alone)
            torch.cuda.set_device(device)
        stage = rank_stage(job.directory, job.plan, rank, source, device)
        watchdog.idle("generating")
        watchdog.publish_now()
        wire = connect(
            store, rank, world, timeout=job.timeout if rank == 0 else None, device=device
        )
        if rank == 0:
            plan = job.plan
            stops = (job.max_new_tokens, job.eos)
            book = Lanes(job.prompts, plan.lanes, plan.rows, *stops, show.token, show.begin)
            lead(stage, wire, book)
            show.end(book.finished)
        else:
            run_stage(stage, wire, Sampler(job.sampling, job.max_new_tokens, job.eos))
    except Exception as err:
        if os.environ.get("PIPECOMPILE_DEBUG"):
            traceback.print_exc()
        problem = peer_problem(watchdog, err) if isinstance(err, PeerGone) else None
        if problem is None and not isinstance(err, PeerGone):
            problem = peer_problem(watchdog, err) if "onnection" in str(err) else None
        if problem is not None:
            watchdog.blame(problem)
            say(f"pipecompile: rank {rank}: stopping: {problem}")
            status = 3
        else:
            text = str(err) if isinstance(err, PipecompileError) else f"{type(err).__name__}: {err}"
            watchdog.report_failure(text)
            say(f"pipecompile: rank {rank}: error: {text}")
            status = 2
    end_together(watchdog, finished=status == 0)
    return status


if __name__ == "__main__":
    main()
