"""Benchmark pipeline x data parallelism on a (dp, pp) mesh against torch.distributed.pipelining
with DDP, side by side, and measure sharding over the copies and resuming at another scale.

Four parts, in one run:

1. **Throughput, 4 processes on this CPU.** HF GPT-2 (12 layers, n_embd 256, 64 tokens), a
   global mini-batch of 16 in micro-batches of 2, no optimizer. Four layouts run in one
   4-rank torchrun, their steps alternating: pipecompile 2 stages x dp 2 (each copy 8 samples
   in 4 micro-batches, gradients summed over dp) and 4 stages x dp 1 (16 samples in 8), and
   torch.distributed.pipelining's Schedule1F1B over PipelineStage wrappers of the *same* stage
   modules, 2 stages x DDP 2 and 4 stages x 1. Each step time is the slowest rank's; the
   median of the timed steps gives samples/s.
2. **Resume at another scale**: examples/char_lm.py (dropout, a tied embedding), 4 stages x dp 1
   with ``--accumulate 2`` and 2 stages x dp 2 (the same global batch), each saved after
   5 steps and resumed by the other (the dp 2 one trained with ``--shard optimizer``); the next
   5 steps' losses against the uninterrupted run.
3. **Optimizer state with --shard optimizer** at dp 2: each rank's AdamW state bytes from the
   metrics files of those runs, the ZeRO-1 one against the unsharded dp 2 one.
4. **Every --shard at dp 2**: char_lm at P/2 stages x dp 2 from scratch, unsharded and with
   ``--shard optimizer`` (ZeRO-1), ``grads`` (ZeRO-2, FSDP2) and ``params`` (ZeRO-3, FSDP2),
   10 steps each: the losses' max relative difference from the uninterrupted P-stage run with
   ``--accumulate 2``, each rank's AdamW state bytes, and the median samples/s of the steps
   after the first (from the metrics files; the runs follow one another). --quick: grads only.

Rerun with::

    python tools/bench/mesh.py            # the figures in docs/BENCHMARKS.md
    python tools/bench/mesh.py --quick    # a 2-layer GPT-2 of width 32 on 2 processes (1 stage x
                                          # dp 2 against 2 x 1), one timed step, 1+1 steps
                                          # around each resume: every path in seconds
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

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
from distributed import (
    Passing,
    alternate,
    gpt2_loss,
    live_sets,
    loss_of,
    pipelining_step,
    rank_pipeline,
)
from forked import run_ranks

from pipecompile.runtime.state.step_options import StepOptions
from pipecompile.surfaces.cli import main as pipecompile

use_examples()

WAIT_S = 900  # the most one torchrun may take
COPIES = 2  # data-parallel copies of the 2-stage layouts


@dataclass(frozen=True)
class Sizes(GPT2Sizes):
    """The model (``GPT2Sizes``, 12 layers), its global mini-batch, and the run."""

    layers: int = 12
    micro_size: int = 2  # samples per micro-batch
    resume_steps: int = 5  # steps before and after each resume
    procs: int = 4  # P/2 stages x dp 2 against P stages x 1

    @property
    def layouts(self) -> tuple[str, ...]:
        half, p = self.procs // COPIES, self.procs
        return (f"pipecompile {half} x dp 2", f"pipecompile {p} x dp 1",
                f"pipelining {half} x DDP 2", f"pipelining {p} x 1")  # fmt: skip


QUICK = Sizes(**QUICK_GPT2, batch=8, resume_steps=1, procs=2)


def batch_of(sizes: Sizes, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, sizes.vocab, (n, sizes.tokens + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def compile_layouts(root: Path, sizes: Sizes) -> None:
    """The 2-stage pipeline at a copy's batch and the 4-stage one at the global batch."""
    from hf_gpt2 import build_gpt2

    from pipecompile.codegen.emit import ModelRef, emit
    from pipecompile.compiler import compile_model

    model = build_gpt2(n_layer=sizes.layers, n_embd=sizes.width, n_head=sizes.heads,
                       vocab_size=sizes.vocab, n_positions=128)  # fmt: skip
    for stages, n in ((sizes.procs // COPIES, sizes.batch // COPIES), (sizes.procs, sizes.batch)):
        inputs, _ = batch_of(sizes, n, 0)
        compiled = compile_model(model, {"input_ids": inputs}, stages=stages,
                                 microbatches=n // sizes.micro_size, schedule="1f1b")  # fmt: skip
        emit(compiled, root / f"gpt2-{stages}", model=ModelRef(None, "gpt2", "gpt2"))


# -- part 1: one torchrun, the four layouts' steps alternating ----------------------------


def worker(args: argparse.Namespace) -> None:
    import hf_gpt2  # noqa: F401  (registers the model's output type)

    from pipecompile.runtime.distributed.mesh import mesh_of

    sizes = Sizes(**json.loads(args.sizes))
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, half = dist.get_rank(), sizes.procs // COPIES
    mesh = mesh_of("cpu", COPIES, half)  # copy k on ranks k*half ...
    pp, dp = mesh.get_group("pp"), mesh.get_group("dp")
    root, names = Path(args.directory), sizes.layouts
    steps = {
        names[0]: ours_on_mesh(root / f"gpt2-{half}", sizes, rank // half, rank % half),
        names[1]: ours_on_mesh(root / f"gpt2-{sizes.procs}", sizes, 0, rank),
        names[2]: theirs(root / f"gpt2-{half}", sizes, rank // half, rank % half, pp, dp),
        names[3]: theirs(root / f"gpt2-{sizes.procs}", sizes, 0, rank, None, None),
    }
    medians = alternate(steps, args.warmup, args.repeats)
    if rank == 0:
        print("RESULT " + json.dumps(medians), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def ours_on_mesh(directory: Path, sizes: Sizes, copy: int, place: int) -> Callable[[], None]:
    """pipecompile's step on copy ``copy``, rank ``place`` of its pipeline: the program, then
    the gradients summed over dp (started at each stage's STEP), as `run --dp` does."""
    from pipecompile.ir.programs.instr import Op
    from pipecompile.runtime.distributed.mesh import data_parallel_of
    from pipecompile.runtime.load import load_stage, read_manifest

    manifest = read_manifest(directory)
    copies = dist.get_world_size() // len(manifest.stages)
    module = load_stage(directory, manifest.stages[place])
    pipe, placement = rank_pipeline(directory, manifest, module, place, copy)
    order = tuple(x.stage for x in pipe.program.devices[place] if x.op == Op.STEP)
    dp = data_parallel_of(torch.device("cpu"), copies, placement, order, lead=place == 0)
    micro = pipe.program.microbatches
    inputs, target = batch_of(sizes, sizes.batch // copies, seed=copy)

    def run() -> None:
        kept = StepOptions(keep_grads=True, loss_scale=1 / (micro * copies))
        pipe.train_step(
            {"input_ids": inputs},
            (target,),
            gpt2_loss,
            on_step=lambda j: dp.start(pipe.modules, j),
            options=kept,
        )
        dp.finish(pipe.modules)
        pipe.drop_step()

    return run


def theirs(
    directory: Path, sizes: Sizes, copy: int, place: int, pp: object, dp: object
) -> Callable[[], None]:
    """torch.distributed.pipelining's Schedule1F1B over a PipelineStage wrapper of the same
    stage module, wrapped in DDP over ``dp`` when there are copies (its stage skips DDP's
    all-reduce on all but the last micro-batch's backward)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.nn.parallel import DistributedDataParallel

    from pipecompile.runtime.load import load_stage, read_manifest

    manifest = read_manifest(directory)
    width = len(manifest.stages)
    copies = dist.get_world_size() // width
    sets = [[*manifest.inputs]] + live_sets(manifest) + [[]]
    entry = manifest.stages[place]
    wrapped = Passing(load_stage(directory, entry), list(entry.inputs), list(entry.outputs),
                      sets[place], sets[place + 1], place == width - 1)  # fmt: skip
    module = DistributedDataParallel(wrapped, process_group=dp) if copies > 1 else wrapped
    stage = PipelineStage(module, place, width, torch.device("cpu"), group=pp)
    micro = sizes.batch // copies // sizes.micro_size
    schedule = Schedule1F1B(stage, n_microbatches=micro, loss_fn=loss_of)
    inputs, target = batch_of(sizes, sizes.batch // copies, seed=copy)

    def run() -> None:
        pipelining_step(schedule, place, width, inputs, target)
        wrapped.zero_grad(set_to_none=True)

    return run


def throughput(root: Path, sizes: Sizes, warmup: int, repeats: int) -> dict[str, float]:
    """Median step seconds of each layout (rank 0's report of the torchrun)."""
    result = run_ranks(sizes.procs, __file__, "--worker", "--directory", str(root), "--sizes",
                       json.dumps(asdict(sizes)), "--warmup", str(warmup), "--repeats",
                       str(repeats), timeout=WAIT_S)  # fmt: skip
    found = [json.loads(ln[7:]) for ln in result.stdout.splitlines() if ln.startswith("RESULT ")]
    if result.returncode or not found:
        raise SystemExit(result.stdout[-3000:] + result.stderr[-3000:])
    return found[0]


# -- parts 2 and 3: the command line ----------------------------------------------------------


def run(directory: Path, metrics: Path, *argv: str) -> list[dict]:
    """`pipecompile run DIRECTORY ...` in this process; its metrics file's step records."""
    metrics.unlink(missing_ok=True)
    status = pipecompile(["run", str(directory), "-q", "--metrics", str(metrics), *argv])
    if status:
        raise SystemExit(f"pipecompile run {directory} {' '.join(argv)} exited {status}")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [r for r in records if r["kind"] == "train"]


def compile_char_lm(root: Path, sizes: Sizes) -> None:
    for stages in (str(sizes.procs // COPIES), str(sizes.procs)):
        assert pipecompile([str(EXAMPLES / "char_lm.py"), "--stages", stages, "--microbatches",
                            "4", "-q", "-o", str(root / f"lm{stages}")]) == 0  # fmt: skip


def uninterrupted(root: Path, sizes: Sizes) -> dict[int, float]:
    """The losses of 2 x resume_steps steps at P stages with --accumulate 2 (the reference)."""
    p, n = str(sizes.procs), sizes.resume_steps
    records = run(root / f"lm{p}", root / "whole.jsonl", "--nproc", p, "--accumulate", "2",
                  "--seed", "0", "--steps", str(2 * n))  # fmt: skip
    return {r["step"]: r["loss"] for r in records}


def shard_modes(
    root: Path, sizes: Sizes, whole: dict[int, float], modes: tuple[str, ...]
) -> dict[str, dict]:
    """Each --shard of ``modes`` (none: unsharded) at P/2 stages x dp 2 from scratch: the
    losses' max relative difference from ``whole``, the AdamW state bytes per rank, the
    median samples/s."""
    p, n = str(sizes.procs), sizes.resume_steps
    found = {}
    for shard in modes:
        flags = () if shard == "none" else ("--shard", shard)
        records = run(root / f"lm{sizes.procs // COPIES}", root / "modes.jsonl", "--nproc", p,
                      "--dp", "2", *flags, "--seed", "0", "--steps", str(2 * n))  # fmt: skip
        rates = sorted(r["samples_per_s"] for r in records[1:] or records)
        found[shard] = {
            "max_rel_diff": max(
                abs(r["loss"] - whole[r["step"]]) / abs(whole[r["step"]]) for r in records
            ),  # fmt: skip
            "optimizer_state_bytes": records[-1]["optimizer_state_bytes"],
            "samples_per_s": rates[len(rates) // 2],
        }
    return found


def resumes(
    root: Path, sizes: Sizes, whole: dict[int, float]
) -> tuple[dict[str, float], list[int], list[int]]:
    """Max relative loss difference of the steps after each resume against the uninterrupted
    run (P stages with --accumulate 2 and P/2 stages x dp 2 train the same global batches);
    and the AdamW state bytes per rank at P/2 stages x dp 2 without and with --shard optimizer
    (the dp 2 runs: the one resumed unsharded, the one saved with ZeRO-1)."""
    n, p = sizes.resume_steps, str(sizes.procs)
    four = (root / f"lm{p}", "--nproc", p, "--accumulate", "2")
    two = (root / f"lm{sizes.procs // COPIES}", "--nproc", p, "--dp", "2")
    seed = ("--seed", "0")
    found: dict[str, float] = {}
    bytes_of: dict[str, list[int]] = {}
    big, half = sizes.procs, sizes.procs // COPIES
    for name, before, after in ((f"{big} x dp 1 -> {half} x dp 2", four, two),
                                (f"{half} x dp 2 (ZeRO-1) -> {big} x dp 1",
                                 (*two, "--shard", "optimizer"), four)):  # fmt: skip
        ck = root / f"ck-{len(found)}"
        saved = run(before[0], root / "before.jsonl", *before[1:], *seed, "--steps", str(n),
                    "--save", str(ck))  # fmt: skip
        later = run(after[0], root / "after.jsonl", *after[1:], "--steps", str(2 * n),
                    "--resume", str(ck))  # fmt: skip
        found[name] = max(abs(r["loss"] - whole[r["step"]]) / abs(whole[r["step"]])
                          for r in later)  # fmt: skip
        if after is two:  # resumed at dp 2, unsharded
            bytes_of["plain"] = later[-1]["optimizer_state_bytes"]
        else:  # saved at dp 2 with ZeRO-1
            bytes_of["sharded"] = saved[-1]["optimizer_state_bytes"]
    return found, bytes_of["plain"], bytes_of["sharded"]


def main() -> None:
    args = torchrun_options(__doc__.splitlines()[0], "a tiny GPT-2, one timed step", 7)
    if args.worker:
        worker(args)
        return
    sizes = QUICK if args.quick else Sizes()
    announce()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        half = sizes.procs // COPIES
        log(f"compiling GPT-2 ({sizes.layers} layers, n_embd {sizes.width}) at {half} and "
            f"{sizes.procs} stages")  # fmt: skip
        compile_layouts(root, sizes)
        log(f"timing the four layouts in one {sizes.procs}-rank run ...")
        seconds = throughput(root, sizes, args.warmup, args.repeats)
        print(f"\nGPT-2, global batch {sizes.batch}, micro-batches of {sizes.micro_size}, "
              f"{sizes.procs} processes, 1f1b:")  # fmt: skip
        print("| layout | step (s) | samples/s |")
        print("|---|---:|---:|")
        for name in sizes.layouts:
            print(f"| {name} | {seconds[name]:.3f} | {sizes.batch / seconds[name]:.1f} |")
        compile_char_lm(root, sizes)
        log("resuming at another scale (and ZeRO-1's optimizer state) ...")
        whole = uninterrupted(root, sizes)
        diffs, plain, sharded = resumes(root, sizes, whole)
        for name, diff in diffs.items():
            print(f"resume {name}: next {sizes.resume_steps} steps' losses, max relative "
                  f"difference from the uninterrupted run {diff:.1e}")  # fmt: skip
        worst = max(s / p for s, p in zip(sharded, plain))
        print(f"\nchar_lm, AdamW state per rank at {sizes.procs // COPIES} stage(s) x dp 2:")
        print(f"  unsharded: {[f'{b / 2**20:.2f} MiB' for b in plain]}")
        print(f"  --shard optimizer: {[f'{b / 2**20:.2f} MiB' for b in sharded]}")
        print(f"  largest share of unsharded on any rank: {worst:.3f}")
        log("every --shard at dp 2 from scratch ...")
        chosen = ("grads",) if args.quick else ("none", "optimizer", "grads", "params")
        modes = shard_modes(root, sizes, whole, chosen)
        print(f"\nchar_lm, {half} stage(s) x dp 2, {2 * sizes.resume_steps} steps, against "
              f"{sizes.procs} stages with --accumulate 2:")  # fmt: skip
        print("| --shard | max rel. loss diff | AdamW state per rank (MiB) | largest share | "
              "samples/s |")  # fmt: skip
        print("|---|---:|---|---:|---:|")
        for shard, got in modes.items():
            held = got["optimizer_state_bytes"]
            share = max(h / b for h, b in zip(held, plain))
            print(f"| {shard} | {got['max_rel_diff']:.1e} | "
                  f"{', '.join(f'{h / 2**20:.3f}' for h in held)} | {share:.3f} | "
                  f"{got['samples_per_s']:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
