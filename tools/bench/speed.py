"""Step time against torch.distributed.pipelining, eager and compiled, and against the limit.

HF GPT-2 (24 layers, n_embd 256, 8 heads, vocabulary 1024, 64 tokens; ``--model llama``: an
HF Llama of the same depth and width, 4 key-value heads, SwiGLU of 1024), mini-batch 16 in 8
micro-batches, CPU, gloo, one thread per process. For each process count the model is compiled
once per schedule (gpipe, 1f1b, zb1p; the same split) and every rank runs the *same* stage
module under each system, the timed steps alternating between them:

* ``ours``: pipecompile's program on its distributed backend (``Pipeline`` as `run --nproc`
  builds it), eagerly and with ``--compile`` (``compile_stages``, Inductor by default);
* ``pipelining``: torch.distributed.pipelining's ScheduleGPipe / Schedule1F1B over a
  PipelineStage of the same module, eagerly and with the module through ``torch.compile``
  (it offers no one-stage-per-rank zero-bubble schedule, and refuses compiled stages in its
  split-backward ones).

Each timing is the slowest rank's, the median of the timed steps; gradients are zeroed inside
the step and no optimizer runs. Then the limit of this machine: every rank runs only its own
stage's forward and backward over the same micro-batches (inputs recorded from a pipelined
step), all ranks at once, no communication; the schedule's step simulated with those stage
times (its bubble included) is the limit, and limit / measured step the efficiency. The same
with the stage times rescaled to the whole model's eager forward+backward on one process alone
(rank 0 while the others wait) shows what running ranks side by side costs by itself.

Rerun with::

    python tools/bench/speed.py                      # the figures in docs/BENCHMARKS.md
    python tools/bench/speed.py --model llama --procs 2
    python tools/bench/speed.py --quick              # a 2-layer GPT-2 of width 32, 2
                                                     # processes, 1f1b, torch.compile's eager
                                                     # backend, one step and one pass of each
                                                     # timing: every path but zb1p's skip
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
from common import QUICK_GPT2, command, log, machine, use_examples
from distributed import Sizes as DistributedSizes
from distributed import alternate, data, loss_of, ours, theirs
from forked import run_ranks
from torch import nn

use_examples()

SCHEDULES = ("gpipe", "1f1b", "zb1p")
WAIT_S = 3000  # the most one torchrun of the full benchmark may take (Inductor compiles)


@dataclass(frozen=True)
class Sizes(DistributedSizes):
    """distributed.py's model and batch (the same GPT-2, 2 and 4 processes), and this run's."""

    model: str = "gpt2"  # or "llama"
    backend: str = "inductor"  # torch.compile's, on both sides
    warmup: int = 2
    repeats: int = 5
    schedules: tuple[str, ...] = SCHEDULES
    passes: int = 3  # of each stage alone and of the whole model alone: the median counts


QUICK = Sizes(**QUICK_GPT2, batch=4, micro=2, procs=(2,), backend="eager", warmup=0, repeats=1,
              schedules=("1f1b",), passes=1)  # fmt: skip


def build(sizes: Sizes) -> nn.Module:
    if sizes.model == "llama":
        from hf_llama import build_llama

        return build_llama(num_hidden_layers=sizes.layers, hidden_size=sizes.width,
                           num_attention_heads=sizes.heads, num_key_value_heads=sizes.heads // 2,
                           intermediate_size=4 * sizes.width, vocab_size=sizes.vocab)  # fmt: skip
    from hf_gpt2 import build_gpt2

    return build_gpt2(n_layer=sizes.layers, n_embd=sizes.width, n_head=sizes.heads,
                      vocab_size=sizes.vocab, n_positions=128)  # fmt: skip


def compile_all(root: Path, sizes: Sizes) -> None:
    """One directory per (process count, schedule); each schedule's split must be gpipe's."""
    from pipecompile.codegen.emit import ModelRef, emit
    from pipecompile.compiler import compile_model

    model = build(sizes)
    inputs, _ = data(sizes)
    for p in sizes.procs:
        for schedule in sizes.schedules:
            compiled = compile_model(model, {"input_ids": inputs}, stages=p,
                                     microbatches=sizes.micro, schedule=schedule)  # fmt: skip
            emit(compiled, root / f"{schedule}-{p}", model=ModelRef(None, sizes.model, "m"))
        splits = {s: (root / f"{s}-{p}" / "stage_0.py").read_text() for s in sizes.schedules}
        if len(set(splits.values())) != 1:
            raise SystemExit(f"{p} processes: the schedules split the model differently")


# -- one rank ---------------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    raw = json.loads(args.sizes)
    sizes = Sizes(**{**raw, "procs": (), "schedules": tuple(raw["schedules"])})
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    import hf_gpt2  # noqa: F401  (registers the output types for the output spec)
    import hf_llama  # noqa: F401

    from pipecompile.runtime.load import load_stage, read_manifest

    rank, world = dist.get_rank(), dist.get_world_size()
    root = Path(args.directory)
    first = root / f"{sizes.schedules[0]}-{world}"
    manifest = read_manifest(first)
    module = load_stage(first, manifest.stages[rank])
    alone = eager_alone(sizes) if rank == 0 else 0.0
    dist.barrier()
    for schedule in sizes.schedules:
        result = one_schedule(root / f"{schedule}-{world}", module, schedule, sizes)
        if rank == 0:
            print("RESULT " + json.dumps({"schedule": schedule, "alone": alone, **result}),
                  flush=True)  # fmt: skip
    dist.barrier()
    dist.destroy_process_group()


def one_schedule(directory: Path, module: nn.Module, schedule: str, sizes: Sizes) -> dict:
    from pipecompile.runtime.load import read_manifest

    manifest = read_manifest(directory)
    runs: dict[str, Callable[[], None]] = {}
    same = (directory, manifest, module, sizes)  # distributed.py's helpers take these sizes too
    runs["ours"], _ = ours(*same)
    recorded = record_inputs(module, runs["ours"])
    runs["ours_compiled"], _ = ours(*same, sizes.backend)
    if schedule != "zb1p":  # pipelining has no one-stage-per-rank zero-bubble schedule
        runs["pipelining"] = theirs(manifest, module, schedule, sizes)
        runs["pipelining_compiled"] = theirs(manifest, module, schedule, sizes, sizes.backend)
    times = alternate(runs, sizes.warmup, sizes.repeats)
    alone: list[tuple[float, float]] = [(0.0, 0.0)] * dist.get_world_size()
    dist.all_gather_object(alone, stage_alone(module, recorded, sizes.passes))  # every stage's
    return {**times, "limit_f": [f for f, _ in alone], "limit_b": [b for _, b in alone]}


def record_inputs(module: nn.Module, run: Callable[[], None]) -> list[tuple]:
    """The inputs of each forward of ``module`` during one step of ``run``."""
    seen: list[tuple] = []

    def keep(_: nn.Module, args: tuple) -> None:
        seen.append(tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args))

    handle = module.register_forward_pre_hook(keep)
    try:
        run()
    finally:
        handle.remove()
    return seen


def stage_alone(module: nn.Module, recorded: list[tuple], count: int = 3) -> tuple[float, float]:
    """Per micro-batch forward and backward seconds of this rank's stage, every rank at once,
    no communication (median of ``count`` passes over the micro-batches)."""
    passes = []
    for _ in range(count):
        dist.barrier()
        forward = backward = 0.0
        for args in recorded:
            args = tuple(a.requires_grad_() if _floating(a) else a for a in args)
            start = time.perf_counter()
            outs = [o for o in module(*args) if _floating(o) and o.requires_grad]
            middle = time.perf_counter()
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
            backward += time.perf_counter() - middle
            forward += middle - start
        module.zero_grad(set_to_none=True)
        passes.append((forward / len(recorded), backward / len(recorded)))
    forward = statistics.median(p[0] for p in passes)
    backward = statistics.median(p[1] for p in passes)
    return forward, backward


def eager_alone(sizes: Sizes) -> float:
    """The whole model's forward and backward over the micro-batches, on this process alone."""
    model = build(sizes)
    inputs, target = data(sizes)
    runs = []
    for _ in range(sizes.passes):
        start = time.perf_counter()
        for x, y in zip(inputs.chunk(sizes.micro), target.chunk(sizes.micro)):
            loss_of(model(input_ids=x).logits, y).backward()
        runs.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    return statistics.median(runs)


def _floating(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


# -- the driver -------------------------------------------------------------------------------


def limits(directory: Path, result: dict) -> tuple[float, float]:
    """The step the stages' own compute allows (simulated, bubble included), and the same with
    the stage times scaled to the whole model's one-process eager time."""
    from pipecompile.ir.programs.simulate import Costs, simulate
    from pipecompile.ir.programs.topology import topology_from_manifest
    from pipecompile.runtime.load import read_manifest, read_program

    manifest = read_manifest(directory)
    program = read_program(directory / manifest.program)
    forward, backward = result["limit_f"], result["limit_b"]
    costs = Costs(tuple(forward), tuple(backward))
    limit = simulate(program, topology_from_manifest(manifest), costs).makespan
    # the stage times as if each ran at the speed of the whole model on one process alone
    scale = result["alone"] / (manifest.microbatches * (sum(forward) + sum(backward)))
    scaled = Costs(tuple(f * scale for f in forward), tuple(b * scale for b in backward))
    return limit, simulate(program, topology_from_manifest(manifest), scaled).makespan


def torchrun(nproc: int, root: Path, sizes: Sizes) -> list[dict]:
    done = run_ranks(nproc, __file__, "--worker", "--directory", str(root), "--sizes",
                     json.dumps(asdict(sizes)), timeout=WAIT_S)  # fmt: skip
    found = [json.loads(ln[7:]) for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or len(found) != len(sizes.schedules):
        raise SystemExit(done.stdout[-3000:] + done.stderr[-3000:])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny GPT-2, aot_eager")
    parser.add_argument("--model", choices=("gpt2", "llama"), default="gpt2")
    parser.add_argument("--procs", type=int, action="append", help="process counts (2 and 4)")
    parser.add_argument("--backend", help="torch.compile backend (default inductor)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--directory", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    sizes = replace(QUICK if args.quick else Sizes(), model=args.model)
    if args.procs:
        sizes = replace(sizes, procs=tuple(args.procs))
    if args.backend:
        sizes = replace(sizes, backend=args.backend)
    print(f"machine: {machine()}")
    print(f"command: {command()}")
    print("| model | processes | schedule | pipecompile (ms) | compiled (ms) | pipelining (ms) "
          "| pipelining compiled (ms) | speed-up eager | speed-up compiled | limit (ms) "
          "| efficiency | one-process limit (ms) | efficiency vs one process |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        log(f"compiling {sizes.model} ({sizes.layers} layers, width {sizes.width}) ...")
        compile_all(Path(tmp), sizes)
        for p in sizes.procs:
            log(f"{p} processes: {', '.join(sizes.schedules)} ({sizes.backend} compiles first)")
            for r in torchrun(p, Path(tmp), sizes):
                limit, alone = limits(Path(tmp) / f"{r['schedule']}-{p}", r)
                print(row(sizes.model, p, r, limit, alone), flush=True)


def row(model: str, p: int, r: dict, limit: float, alone: float) -> str:
    def ms(key: str) -> str:
        return f"{r[key] * 1e3:.0f}" if key in r else "-"

    def ratio(a: str, b: str) -> str:
        return f"{r[b] / r[a]:.2f}x" if a in r and b in r else "-"

    best = min(r["ours"], r["ours_compiled"])
    return (f"| {model} | {p} | {r['schedule']} | {ms('ours')} | {ms('ours_compiled')} "
            f"| {ms('pipelining')} | {ms('pipelining_compiled')} | {ratio('ours', 'pipelining')} "
            f"| {ratio('ours_compiled', 'pipelining_compiled')} | {limit * 1e3:.0f} "
            f"| {limit / best:.2f} | {alone * 1e3:.0f} | {alone / best:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
