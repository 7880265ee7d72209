"""Benchmark the distributed backend against torch.distributed.pipelining, side by side.

HF GPT-2 (24 layers, n_embd 256, 8 heads, vocabulary 1024, 64 tokens), mini-batch 16 in 8
micro-batches, CPU, gloo. For 2 and 4 processes, pipecompile compiles the model and both
systems run the *same* stage modules: pipecompile's program (gpipe, 1f1b) on its
distributed backend, and torch.distributed.pipelining's ScheduleGPipe / Schedule1F1B over
PipelineStage wrappers of those modules (values a later stage needs, such as the attention
mask, are passed along stage by stage, as PipelineStage requires). Steps alternate between
the two systems; each timing is the slowest rank's, median of the timed steps; both zero
their gradients inside the timed step and neither runs an optimizer.

Also measured: how long the other ranks take to stop after one is killed mid-step, and the
cost of a checkpoint save. Rerun with::

    python tools/bench/distributed.py            # the figures in docs/BENCHMARKS.md
    python tools/bench/distributed.py --quick    # a 2-layer GPT-2 of width 32, 2 processes,
                                                 # one timed step: every path in seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist
from common import (
    EXAMPLES,
    QUICK_GPT2,
    GPT2Sizes,
    announce,
    log,
    torchrun_options,
    use_examples,
)
from forked import run_ranks
from torch import nn

from pipecompile.ir.records.manifest import Manifest
from pipecompile.runtime.pipeline import Messaging

use_examples()

WAIT_S = 900  # the most one torchrun of the full benchmark may take
T = TypeVar("T")


@dataclass(frozen=True)
class Sizes(GPT2Sizes):
    """The model and the batch (``GPT2Sizes``), the micro-batches and which process counts
    to run."""

    micro: int = 8
    procs: tuple[int, ...] = (2, 4)


QUICK = Sizes(**QUICK_GPT2, batch=4, micro=2, procs=(2,))
SCHEDULES = ("gpipe", "1f1b")


def data(sizes: Sizes) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (sizes.batch, sizes.tokens + 1)
    ids = torch.randint(0, sizes.vocab, shape, generator=torch.Generator().manual_seed(0))
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def loss_of(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))


def compile_all(root: Path, sizes: Sizes) -> dict[str, str]:
    from hf_gpt2 import build_gpt2

    from pipecompile.codegen.emit import ModelRef, emit
    from pipecompile.compiler import compile_model

    model = build_gpt2(n_layer=sizes.layers, n_embd=sizes.width, n_head=sizes.heads,
                       vocab_size=sizes.vocab, n_positions=128)  # fmt: skip
    inputs, _ = data(sizes)
    out = {}
    for p in sizes.procs:
        for schedule in SCHEDULES:
            compiled = compile_model(model, {"input_ids": inputs}, stages=p,
                                     microbatches=sizes.micro, schedule=schedule)  # fmt: skip
            target = root / f"{schedule}-{p}"
            emit(compiled, target, model=ModelRef(None, "gpt2", "gpt2"))
            out[f"{schedule}-{p}"] = str(target)
    return out


class ContiguousGrad(torch.autograd.Function):
    """The identity, whose backward makes the gradient contiguous: PipelineStage sends a stage's
    input gradients as autograd made them (a transposed view when the split falls inside an
    attention block), and gloo refuses a strided tensor."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


class Passing(nn.Module):
    """A pipecompile stage made chain-shaped for PipelineStage: takes the values live on the
    boundary before it (sorted by name), returns those live on the boundary after it."""

    def __init__(self, stage: nn.Module, inputs: list[str], outputs: list[str],
                 before: list[str], after: list[str], last: bool) -> None:  # fmt: skip
        super().__init__()
        self.stage, self.inputs, self.outputs = stage, inputs, outputs
        self.before, self.after, self.last = before, after, last

    def forward(self, *values: torch.Tensor) -> object:
        values = tuple(ContiguousGrad.apply(v) if v.requires_grad else v for v in values)
        env = dict(zip(self.before, values))
        env.update(zip(self.outputs, self.stage(*[env[n] for n in self.inputs])))
        if self.last:
            return env[self.outputs[0]]
        # PipelineStage sends what it is given and gloo refuses a strided view (the split can
        # fall on one); pipecompile's backend makes the same copy before it sends.
        return tuple(env[n].contiguous() for n in self.after)


def live_sets(manifest: Manifest) -> list[list[str]]:
    """Per boundary k (between stage k and k+1), the values produced at or before k and read
    after k."""
    stages = manifest.stages
    made = {n: j for j, s in enumerate(stages) for n in s.outputs}
    for name in manifest.inputs:
        made[name] = -1
    sets = []
    for k in range(len(stages) - 1):
        needed = {n for s in stages[k + 1 :] for n in s.inputs if made.get(n, 99) <= k}
        sets.append(sorted(needed))
    return sets


def passing(manifest: Manifest, module: nn.Module, place: int) -> Passing:
    """``module``, stage ``place`` of a chain of ``manifest``'s stages, as ``Passing`` wraps it
    for PipelineStage (the first takes the model's inputs, the last returns its output)."""
    sets = [[*manifest.inputs]] + live_sets(manifest) + [[]]
    entry = manifest.stages[place]
    return Passing(module, list(entry.inputs), list(entry.outputs), sets[place],
                   sets[place + 1], place == len(manifest.stages) - 1)  # fmt: skip


def worker(args: argparse.Namespace) -> None:
    """One rank: every schedule of one process count, each timed against pipelining."""
    sizes = Sizes(**json.loads(args.sizes))
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    for schedule in SCHEDULES:
        directory = Path(args.directory) / f"{schedule}-{dist.get_world_size()}"
        result = compare(directory, schedule, sizes, args.warmup, args.repeats)
        if dist.get_rank() == 0:
            print("RESULT " + json.dumps({"schedule": schedule, **result}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def compare(directory: Path, schedule: str, sizes: Sizes, warmup: int, repeats: int) -> dict:
    """Alternate steps of the two systems on this rank's stage; then time a checkpoint save."""
    import hf_gpt2  # noqa: F401  (registers the model's output type for the output spec)

    from pipecompile.runtime.load import load_stage, read_manifest

    rank = dist.get_rank()
    manifest = read_manifest(directory)
    module = load_stage(directory, manifest.stages[rank])
    run_ours, pipe = ours(directory, manifest, module, sizes)
    run_theirs = theirs(manifest, module, schedule, sizes)
    runs = {"pipecompile": run_ours, "pipelining": run_theirs}
    medians = alternate(runs, warmup, repeats)
    pipe.set_optimizer(lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    run_ours()
    save_s, size = checkpoint_save(pipe)
    return {**medians, "save_s": save_s, "save_bytes": size}


def alternate(
    runs: dict[str, Callable[[], None]],
    warmup: int,
    repeats: int,
    summary: Callable[[list[float]], T] = statistics.median,  # type: ignore[assignment]
) -> dict[str, T]:
    """Each run's ``summary`` (median) of its step times (the slowest rank's) over ``repeats``
    timed turns after ``warmup`` untimed ones, the runs taking turns (every rank calls it)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for k in range(warmup + repeats):
        for name, run in runs.items():
            dist.barrier()
            start = time.perf_counter()
            run()
            slowest = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if k >= warmup:
                times[name].append(slowest.item())
    return {name: summary(t) for name, t in times.items()}


def ours(
    directory: Path, manifest: Manifest, module: nn.Module, sizes: Sizes, compiled: str = "off"
) -> tuple:
    """pipecompile's training step on its distributed backend, and the pipeline it runs
    (``compiled``: its stages through ``--compile`` with that backend)."""
    pipe, _ = rank_pipeline(directory, manifest, module, dist.get_rank())
    pipe.compile_stages(compiled)
    inputs, target = data(sizes)

    def run() -> None:
        pipe.train_step({"input_ids": inputs}, (target,), gpt2_loss)

    return run, pipe


def rank_pipeline(
    directory: Path, manifest: Manifest, module: nn.Module | None, place: int, copy: int = 0
) -> tuple:
    """The pipeline of rank ``place`` of data-parallel copy ``copy`` (one per ``world //
    devices`` ranks), holding ``module`` as stage ``place`` (None: every stage the program
    places on device ``place``, loaded as a rank of `run` loads them: a graph plan's or a
    looped schedule's several), on the distributed backend as a rank of `run` builds it; and
    its copy's placement."""
    from pipecompile.runtime.distributed.backend import DistBackend, tie_groups
    from pipecompile.runtime.job.placement import Placement
    from pipecompile.runtime.layout import Layout
    from pipecompile.runtime.load import load_stage, read_program
    from pipecompile.runtime.pipeline import Pipeline

    program = read_program(directory / manifest.program)
    whole = Placement.from_manifest(manifest, program.stage_device)
    copies = dist.get_world_size() // whole.world
    modules = [
        (load_stage(directory, entry) if program.stage_device[j] == place else None)
        if module is None
        else (module if j == place else None)
        for j, entry in enumerate(manifest.stages)
    ]
    layout = Layout.from_manifest(manifest, program.stage_device)
    placement = whole.copy(copy)
    groups = tie_groups(layout, placement, copies)

    def backend() -> DistBackend:
        return DistBackend(layout, manifest, program.microbatches, groups, placement)

    return Pipeline(
        manifest, modules, program, device=place, messaging=Messaging(backend)
    ), placement


def gpt2_loss(output: object, target: torch.Tensor) -> torch.Tensor:
    """The language-model loss of a Hugging Face GPT-2's output."""
    return loss_of(output.logits, target)  # type: ignore[attr-defined]


def theirs(
    manifest: Manifest, module: nn.Module, schedule: str, sizes: Sizes, compiled: str | None = None
) -> Callable[[], None]:
    """torch.distributed.pipelining's step over a PipelineStage wrapper of the same module
    (``compiled``: the wrapper through ``torch.compile`` with that backend)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    rank, world = dist.get_rank(), dist.get_world_size()
    wrapped = passing(manifest, module, rank)
    runs = torch.compile(wrapped, backend=compiled) if compiled else wrapped
    stage = PipelineStage(runs, rank, world, torch.device("cpu"))
    kind = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    steps = kind(stage, n_microbatches=sizes.micro, loss_fn=loss_of)
    inputs, target = data(sizes)

    def run() -> None:
        pipelining_step(steps, rank, world, inputs, target)
        wrapped.zero_grad(set_to_none=True)

    return run


def pipelining_step(
    schedule: object,
    place: int,
    width: int,
    inputs: torch.Tensor | tuple[torch.Tensor, ...],
    target: torch.Tensor,
) -> None:
    """One step of a torch.distributed.pipelining schedule on stage ``place`` of ``width``:
    the first stage feeds the inputs (a tuple: the model's several, in order), the last the
    targets (one stage: both)."""
    given = inputs if isinstance(inputs, tuple) else (inputs,)
    if width == 1:
        schedule.step(*given, target=target, losses=[])  # type: ignore[attr-defined]
    elif place == 0:
        schedule.step(*given)  # type: ignore[attr-defined]
    elif place == width - 1:
        schedule.step(target=target, losses=[])  # type: ignore[attr-defined]
    else:
        schedule.step()  # type: ignore[attr-defined]


def checkpoint_save(pipe: object) -> tuple[float, int]:
    """Seconds one checkpoint save takes (weights and optimizer state), and its bytes."""
    from pipecompile.runtime.training.train_state import save

    with tempfile.TemporaryDirectory() as tmp:
        shared = [tmp]  # rank 0's directory: every rank writes its stages there
        dist.broadcast_object_list(shared, src=0)
        root = Path(shared[0]) / "ck"
        dist.barrier()
        start = time.perf_counter()
        save(pipe, root, 1, dist.get_rank())  # type: ignore[arg-type]
        seconds = time.perf_counter() - start
        size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
        dist.barrier()  # rank 0 removes the directory only once every rank has measured
    return seconds, size


def torchrun(nproc: int, *args: str) -> list[dict]:
    """Start ``nproc`` workers; rank 0's results, one per schedule."""
    result = run_ranks(nproc, __file__, "--worker", *args, timeout=WAIT_S)
    found = [json.loads(ln[7:]) for ln in result.stdout.splitlines() if ln.startswith("RESULT ")]
    if result.returncode or len(found) != len(SCHEDULES):
        raise SystemExit(result.stdout[-3000:] + result.stderr[-3000:])
    return found


def detection(directory: str, nproc: int) -> float:
    """Seconds from killing rank 1 mid-step until the last other rank has stopped."""
    from pipecompile.runtime.distributed.launch import launch
    from pipecompile.runtime.job.run import RunJob

    os.environ["PIPECOMPILE_FAULT"] = "1:1B3:kill"
    records: list[dict] = []
    try:
        argv = [directory, "--steps", "3", "-q", "--model", str(EXAMPLES / "mlp.py")]
        launch(RunJob.from_argv(argv, nproc=nproc), keep=records)
    finally:
        del os.environ["PIPECOMPILE_FAULT"]
    by_rank = {r["rank"]: r for r in records}
    return max(r["time"] for k, r in by_rank.items() if k != 1) - by_rank[1]["time"]


def main() -> None:
    args = torchrun_options(__doc__.splitlines()[0], "a tiny GPT-2 on 2 processes", 5)
    if args.worker:
        worker(args)
        return
    sizes = QUICK if args.quick else Sizes()
    announce()
    with tempfile.TemporaryDirectory() as tmp:
        log(f"compiling GPT-2 ({sizes.layers} layers, n_embd {sizes.width}) ...")
        compile_all(Path(tmp), sizes)
        print("| processes | schedule | pipecompile step (s) | pipelining step (s) | ratio "
              "| checkpoint save (s) | checkpoint size |")  # fmt: skip
        print("|---:|---|---:|---:|---:|---:|---:|")
        for p in sizes.procs:
            options = ["--directory", tmp, "--sizes", json.dumps(asdict(sizes))]
            options += ["--warmup", str(args.warmup), "--repeats", str(args.repeats)]
            for r in torchrun(p, *options):
                print(f"| {p} | {r['schedule']} | {r['pipecompile']:.3f} "
                      f"| {r['pipelining']:.3f} | {r['pipecompile'] / r['pipelining']:.2f} "
                      f"| {r['save_s']:.3f} | {r['save_bytes'] / 2**20:.1f} MiB |",
                      flush=True)  # fmt: skip
        stop_times(Path(tmp) / "mlp", sizes.procs)


def stop_times(root: Path, procs: tuple[int, ...]) -> None:
    """Kill rank 1 of an MLP run mid-step; print when the other ranks had stopped."""
    from pipecompile.surfaces.cli import main as cli

    for p in procs:
        cli([str(EXAMPLES / "mlp.py"), "--stages", str(p), "--microbatches", "4",
             "-q", "-o", str(root / str(p))])  # fmt: skip
        seconds = detection(str(root / str(p)), p)
        print(f"\n{p} processes: after rank 1 is killed at 1B3, every other rank has "
              f"stopped {seconds:.2f} s later")  # fmt: skip


if __name__ == "__main__":
    main()
