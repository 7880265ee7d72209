"""One rank of a distributed run: `python -m pipecompile.runtime.distributed.worker OUT [options]`.

Started one process per device of the program, by `pipecompile run OUT --nproc N` on one
machine (``run_record``: the launcher's job, as its record) or by torch's launcher on several
(``main``: the job of the rank's own argv; docs/DISTRIBUTED.md). Either way the rank builds
the job with ``RunJob.build``, which makes every refusal `pipecompile run` makes, before its
process group forms: a refused job ends every rank with status 2, rank 0 saying why. Each
rank then loads only its own stages, runs its own device's instructions over the distributed
backend (gloo on CPU, NCCL on CUDA) and rank 0 prints the losses and the check.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipecompile.errors import CheckError, PipecompileError, RuntimeFailure
from pipecompile.files.atomic import write_atomically
from pipecompile.files.names import LATEST
from pipecompile.ir.graph.noise_floor import Tolerance
from pipecompile.ir.programs.instr import Op
from pipecompile.model.data_hooks import (
    EVAL,
    TRAIN,
    Batch,
    BatchSource,
    batch_source,
    example_source,
)
from pipecompile.runtime.check.batch_shapes import check_shapes
from pipecompile.runtime.distributed.backend import DistBackend, tie_groups
from pipecompile.runtime.distributed.mesh import (
    data_parallel_of,
    fully_shard_stages,
    sharded_optimizer,
)
from pipecompile.runtime.distributed.rank_output import say, user_output
from pipecompile.runtime.distributed.watchdog import Watchdog
from pipecompile.runtime.job.gpus import device_kind
from pipecompile.runtime.job.run import RunJob
from pipecompile.runtime.layout import Layout
from pipecompile.runtime.load import load_stage, load_tail
from pipecompile.runtime.pipeline import Messaging, Pipeline
from pipecompile.runtime.process.faults import FAULT_ENV, fault_at
from pipecompile.runtime.process.threads import use_threads
from pipecompile.runtime.training.loop import RankShare, TrainState, train
from pipecompile.runtime.training.metrics import append_record

__all__ = ["main", "run_record", "meet_refused", "peer_problem", "end_together"]


class _Refused(PipecompileError):
    """A refusal every rank makes alike (rank 0 says it; all end with status 2)."""


def main(argv: list[str] | None = None) -> int:
    """A rank started by torchrun: the job of its own argv (``DIRECTORY [options]``), checked
    here as `pipecompile run` checks it; rank 0 also checks where the run writes."""
    started, local = _world()
    args = list(sys.argv[1:] if argv is None else argv)
    return _serve(lambda: RunJob.from_argv(args, started=started, local_ranks=local), places=True)


def run_record(args: list[str]) -> int:
    """A rank forked by `run --nproc`: the job of the launcher's record (``args[0]``, JSON),
    built and checked again here (the launcher checked where it writes)."""
    started, local = _world()
    record = json.loads(args[0])
    return _serve(
        lambda: RunJob.from_record(record, started=started, local_ranks=local), places=False
    )


def _world() -> tuple[int, int]:
    """The ranks the launcher started, and those of them on this machine."""
    env = os.environ
    return int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_WORLD_SIZE", "1"))


def _built(build: Callable[[], RunJob]) -> RunJob:
    """The rank's job; a refusal ends the rank before its process group forms, with status
    2 (every rank reaches the same verdict: rank 0 says it, the others end quietly)."""
    try:
        return build()
    except PipecompileError as err:
        rank = int(os.environ.get("RANK", "0"))
        _say_refused(rank, err)
        _write_status(rank, 2, reason=str(err))
        meet_refused(rank)
        sys.stdout.flush()
        os._exit(2)


def meet_refused(rank: int, wait_s: float = 30.0) -> None:
    """Before a refusing rank ends: the ranks meet on the launcher's store (no process group
    yet), so that none ends before rank 0 has said why and every rank has recorded its
    status (a launcher stops the others once one ends, and a rank still starting would end
    without a word). Bounded by ``wait_s``: a rank that does not refuse goes on into its
    process group, which the refusing ones never join."""
    env = os.environ
    if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
        return
    world = int(env.get("WORLD_SIZE", "1"))
    try:
        store = dist.TCPStore(
            env["MASTER_ADDR"],
            int(env["MASTER_PORT"]),
            world,
            False,
            timeout=timedelta(seconds=wait_s),
        )
        prefix = f"/pipecompile/refused/{_restart_count()}/"
        store.set(f"{prefix}{rank}", "2")
        store.wait([f"{prefix}{r}" for r in range(world)], timedelta(seconds=wait_s))
    except (RuntimeError, OSError):  # the store is gone, or a rank never came: end anyway
        return


def _serve(build: Callable[[], RunJob], *, places: bool) -> int:
    # Before any thread exists (gloo starts some), so every thread inherits it: SIGTERM is
    # then taken only by the watchdog's own thread, which reports before ending the process,
    # and SIGINT only by _stop_on_sigint's (a KeyboardInterrupt inside a collective would
    # print tracebacks and could leave the rank running).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    job = _built(build)
    local = job.local_ranks or 1
    use_threads(job.run.threads, local)
    where = _device(job.run.device or "auto", local)
    backend = "nccl" if where.type == "cuda" else "gloo"
    timeout = job.run.timeout or 60.0
    _init_process_group(backend, timedelta(seconds=max(timeout, 1.0) * 2))
    rank, world = dist.get_rank(), dist.get_world_size()
    progress = TrainState()
    watchdog = Watchdog(
        # torchrun keeps its store across its restarts: each attempt's keys are its own
        dist.PrefixStore(f"attempt{_restart_count()}/", dist.distributed_c10d._get_default_store()),
        rank,
        world,
        timeout=timeout,
        on_stop=lambda status, why: _write_status(rank, status, step=progress.done, reason=why),
    )
    watchdog.start()
    threading.Thread(target=_stop_on_sigint, args=(watchdog,), daemon=True).start()
    status, reason, agreed = 0, None, False
    try:
        job = _after_torchrun_restart(job, rank)
        if places:
            _check_places(job, rank)
        status = _run(job, rank, watchdog, where, progress)
    except _Refused as err:
        _say_refused(rank, err)
        status, reason, agreed = 2, str(err), True
    except CheckError as err:
        _say_error(rank, str(err))
        status = 1
    except Exception as err:
        # A peer's death often surfaces here first (a receive's connection was reset, which
        # the interpreter reports as a RuntimeFailure): blame the peer, not this rank.
        if os.environ.get("PIPECOMPILE_DEBUG"):
            traceback.print_exc()
        ours = isinstance(err, PipecompileError) and not isinstance(err, RuntimeFailure)
        problem = None if ours else peer_problem(watchdog, err)
        if problem is not None:
            watchdog.blame(problem)
            _say_error(rank, f"stopping at instruction {watchdog.current}: {problem}")
            status, reason = 3, problem
        else:
            text = str(err) if isinstance(err, PipecompileError) else f"{type(err).__name__}: {err}"
            watchdog.report_failure(text)
            _say_error(rank, f"error: {text}")
            status, reason = 2, text
    _write_status(rank, status, step=progress.done, reason=reason)
    end_together(watchdog, finished=status in (0, 1) or agreed)  # a mismatch ends normally
    sys.stdout.flush()
    os._exit(status)  # never linger in a collective a failed peer will not join


def end_together(watchdog: Watchdog, *, finished: bool) -> None:
    """A rank's end: ``finished`` ranks meet at a barrier (none is mistaken for a dead one)
    and leave the process group; the watchdog stops either way."""
    if finished:
        watchdog.idle("finishing")
        dist.barrier()
    watchdog.stop(finished=finished)
    if finished:
        dist.destroy_process_group()


def _check_places(job: RunJob, rank: int) -> None:
    """Where the run writes, checked by rank 0 alone (the place is one for all ranks) and its
    verdict shared, so that every rank refuses alike."""
    verdict: list[str | None] = [None]
    if rank == 0:
        try:
            replaced = job.check_places()
            if replaced:
                say(f"pipecompile: note: {replaced}")
        except PipecompileError as err:
            verdict = [str(err)]
    dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise _Refused(verdict[0])


def _stop_on_sigint(watchdog: Watchdog) -> None:
    """Ctrl-C ends the rank as SIGTERM does, through the watchdog, and every rank names it."""
    signal.sigwait({signal.SIGINT})
    watchdog.blame("interrupted (SIGINT)")
    os.kill(os.getpid(), signal.SIGTERM)


def _device(choice: str, local_ranks: int) -> torch.device:
    """cpu, or this rank's GPU (LOCAL_RANK) for cuda; auto picks cuda when every rank of this
    machine (LOCAL_WORLD_SIZE) has a GPU of its own (the job refused cuda without enough)."""
    kind = device_kind(choice, local_ranks)
    if kind == "cpu":
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _run(
    job: RunJob, rank: int, watchdog: Watchdog, where: torch.device, progress: TrainState
) -> int:
    emitted, flags, options = job.emitted, job.run, job.train
    directory, manifest, program = emitted
    copies = flags.dp or 1
    placement = job.placement.copy(rank // job.placement.world)
    device, replica = placement.role(rank)
    # First: it registers output types.
    watchdog.reading("the model file's import")  # bounded by --timeout, its prints shown
    with user_output(rank):
        spec = job.model_file()  # a rank builds only its stages
    watchdog.idle("setup")
    modules: list[Any] = [
        load_stage(directory, entry).to(where) if program.stage_device[j] == device else None
        for j, entry in enumerate(manifest.stages)
    ]
    layout = Layout.from_manifest(manifest, program.stage_device)
    groups = tie_groups(layout, placement, copies)
    order = tuple(x.stage for x in program.devices[device] if x.op == Op.STEP)
    reads_inputs = program.stage_device[0] == device and replica == 0
    data_parallel = data_parallel_of(
        where, copies, placement, order, lead=reads_inputs, shard=flags.shard
    )
    if data_parallel.sharded:
        fully_shard_stages(modules, data_parallel)
    pipe = Pipeline(
        manifest,
        modules,
        program,
        device=device,
        replica=(replica, placement.device_replicas[device]),
        default_device=where if where.type == "cuda" else None,
        messaging=Messaging(
            backend=lambda: DistBackend(
                layout,
                manifest,
                program.microbatches,
                groups,
                placement,
                device=where,
                wire_dtype=pipe.precision,
            ),
            wrap=lambda handlers: _tracked(handlers, watchdog, progress),
            after_step=lambda: watchdog.idle("between steps"),
        ),
        tail=load_tail(directory, manifest) if modules[-1] is not None else None,
    )
    if flags.check:
        _check(job, pipe, spec, where, rank)
        return 0
    mine = {j for j, m in enumerate(modules) if m is not None}
    reads = (0 in mine, len(modules) - 1 in mine)  # inputs, targets: only these ranks read
    data = (_hook(spec, TRAIN, watchdog) or example_source(spec)) if any(reads) else None
    eval_data = _hook(spec, EVAL, watchdog) if any(reads) else None
    if flags.shard == "optimizer":
        options.optimizer_factory = sharded_optimizer(options, data_parallel)
    group = _DistGroup(where, placement.world)
    rank_share = RankShare(
        group, reads, one_process=False, device=where, data_parallel=data_parallel
    )
    train(pipe, spec.loss_fn, data, options, eval_data=eval_data, state=progress, rank=rank_share)
    return 0


def _init_process_group(backend: str, timeout: timedelta) -> None:
    """The run's process group. After a torchrun restart, on torchrun's store under a prefix of
    this attempt's: torch 2.13 keeps the agent's store across restarts, and the previous
    attempt's addresses left there would otherwise be read by the new ranks, which then fail
    to connect."""
    count = _restart_count()
    if not count or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, timeout=timeout)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, False, timeout=timeout
    )
    store = dist.PrefixStore(f"/pipecompile/attempt_{count}", agent)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def _restart_count() -> int:
    """How often torchrun has restarted this run's ranks (0 under `run --nproc`)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def _after_torchrun_restart(job: RunJob, rank: int) -> RunJob:
    """Under torchrun's ``--max-restarts``, a restarted rank (TORCHELASTIC_RESTART_COUNT > 0)
    resumes from the newest step in ``--save`` by itself (from the start, or the ``--resume``
    given, while there is none): the job resuming there, checked again; rank 0 records the
    restart."""
    count, options = _restart_count(), job.train
    if not count or options.save is None:
        return job
    pointer = Path(options.save) / LATEST
    resumed = pointer.read_text().strip() if pointer.is_file() else None
    if resumed is not None:
        job = job.resuming(Path(options.save))
    if rank == 0:
        step = int(resumed.removeprefix("step_")) if resumed else 0
        record = {"kind": "restart", "restart": count, "rank": None, "resumed_from": step}
        record["reason"] = "restarted by torchrun"
        append_record(Path(options.metrics) if options.metrics else None, record)
        where = f"{resumed} in {options.save}" if resumed else "the start (no step saved yet)"
        say(f"pipecompile: torchrun restart {count}: resuming from {where}")
    return job


def _check(job: RunJob, pipe: Pipeline, spec: Any, where: torch.device, rank: int) -> None:
    """`run --nproc N --check`: the ranks' step against the one-process run and the eager
    model, on each batch shape; rank 0 prints the reports."""
    from pipecompile.runtime.check.distributed import CheckSettings, check_distributed

    flags = job.run
    asked = CheckSettings(
        job.directory, flags.program, job.train.lr, Tolerance(flags.atol, flags.rtol)
    )

    if where.type == "cuda":  # fp32 compared with fp32: no TensorFloat-32 kernels
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    pipe.compile_stages(job.train.compile)

    def compare(shaped: Any) -> Any:
        inputs = {k: v.to(where) for k, v in shaped.inputs.items()}
        targets = tuple(t.to(where) for t in shaped.targets)
        return check_distributed(pipe, shaped, asked, inputs, targets)

    what = "distributed results differ"
    check_shapes(spec, pipe, flags.batch_shapes, compare, show=rank == 0, what=what)


def _hook(spec: Any, hook: str, watchdog: Watchdog) -> BatchSource | None:
    """The model file's data ``hook`` (None if it has none), watched: each call and each
    batch must come within --timeout, and what the hook prints is shown as this rank's."""
    rank = watchdog.rank
    try:
        watchdog.reading(f"{hook}() of {spec.path.name}")
        with user_output(rank):
            source = batch_source(spec, hook)
    finally:
        watchdog.idle("setup")
    if source is None:
        return None
    return dataclasses.replace(source, start=lambda: _watched(source, watchdog))


def _watched(source: BatchSource, watchdog: Watchdog) -> Iterator[Batch]:
    """One epoch of ``source``, each batch read under the watchdog's timer and with the
    hook's output shown as this rank's."""
    batches, k = source.start(), 0
    while True:
        watchdog.reading(source.batch_name(k))
        try:
            with user_output(watchdog.rank):
                batch = next(batches, None)
        finally:
            watchdog.idle("between steps")
        if batch is None:
            return
        yield batch
        k += 1


class _DistGroup:
    """The training loop's collectives over every rank (float64, on the rank's device)."""

    def __init__(self, device: torch.device, copy_width: int) -> None:
        self.rank, self.world, self.device = dist.get_rank(), dist.get_world_size(), device
        self.copy_width = copy_width  # ranks of one data-parallel copy (batch agreement)

    def sum(self, values: list[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: list[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MAX)

    def gather_objects(self, value: Any) -> list[Any] | None:
        every: list[Any] | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(value, every, dst=0)
        return every

    def gather(self, values: list[float]) -> list[list[float]]:
        mine = torch.tensor(values, dtype=torch.float64, device=self.device)
        every = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(every, mine)
        return [t.tolist() for t in every]

    def _reduce(self, values: list[float], op: Any) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=op)
        return tensor.tolist()


def peer_problem(watchdog: Watchdog, err: Exception) -> str | None:
    """A failed peer behind ``err``, if any; a lost connection gets two seconds for the
    peer's death to become visible."""
    lost = any(w in str(err) for w in ("Connection", "connection", "peer"))
    deadline = time.monotonic() + (2.0 if lost else 0.0)
    while True:
        problem = watchdog.diagnose(stale_after=1.0)
        if problem is not None or time.monotonic() >= deadline:
            return problem
        time.sleep(0.05)


def _tracked(handlers: dict, watchdog: Watchdog, progress: TrainState) -> dict:
    """Handlers that tell the watchdog which instruction runs (and obey a test's fault hook,
    ``runtime.faults``: the step an instruction belongs to is the one after those done)."""
    hooked = bool(os.environ.get(FAULT_ENV))

    def wrap(op: str, handler: Any) -> Any:
        def run(instr: Any) -> bool:
            watchdog.at(str(instr))
            if hooked:
                fault = fault_at(watchdog.rank, (progress.done or 0) + 1, str(instr))
                if fault is not None:
                    _inject(fault.kind, watchdog)
            return handler(instr)

        return run

    return {op: wrap(op, h) for op, h in handlers.items()}


def _inject(kind: str, watchdog: Watchdog) -> None:
    if kind == "kill":
        watchdog.publish_now()
        _write_status(dist.get_rank(), 137, killed_at=watchdog.current)
        os.kill(os.getpid(), 9)
    if kind == "hang":
        while True:
            time.sleep(1)
    raise RuntimeError(f"injected failure at {watchdog.current}")


def _say_refused(rank: int, err: Exception) -> None:
    """A refusal every rank made alike: rank 0's line, as `pipecompile run` prints it."""
    if rank == 0:
        say(f"pipecompile: error: {err}")


def _say_error(rank: int, message: str) -> None:
    say(f"pipecompile: rank {rank}: {message}")


def _write_status(rank: int, status: int, **extra: Any) -> None:
    where = os.environ.get("PIPECOMPILE_STATUS_DIR")
    if where:
        process = {"pid": os.getpid(), "parent": os.getppid(), "session": os.getsid(0)}
        entry = {"rank": rank, "status": status, "time": time.time(), **process, **extra}
        write_atomically(Path(where, f"rank{rank}.json"), json.dumps(entry), unique=True)


if __name__ == "__main__":
    main()
