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
cost of a checkpoint save. Rerun with ``python tools/bench_distributed.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

LAYERS, WIDTH, HEADS, VOCAB, TOKENS, BATCH, MICRO = 24, 256, 8, 1024, 64, 16, 8


def data() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, TOKENS + 1), generator=torch.Generator().manual_seed(0))
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def loss_of(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))


def compile_all(root: Path) -> dict[str, str]:
    from hf_gpt2 import build_gpt2

    from pipecompile.codegen.emit import ModelRef, emit
    from pipecompile.compiler import compile_model

    model = build_gpt2(n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS, vocab_size=VOCAB,
                       n_positions=128)  # fmt: skip
    inputs, _ = data()
    out = {}
    for p in (2, 4):
        for schedule in ("gpipe", "1f1b"):
            compiled = compile_model(model, {"input_ids": inputs}, stages=p,
                                     microbatches=MICRO, schedule=schedule)  # fmt: skip
            target = root / f"{schedule}-{p}"
            emit(compiled, target, model=ModelRef(None, "gpt2", "gpt2"))
            out[f"{schedule}-{p}"] = str(target)
    return out


class Passing(nn.Module):
    """A pipecompile stage made chain-shaped for PipelineStage: takes the values live on the
    boundary before it (sorted by name), returns those live on the boundary after it."""

    def __init__(self, stage: nn.Module, inputs: list[str], outputs: list[str],
                 before: list[str], after: list[str], last: bool) -> None:  # fmt: skip
        super().__init__()
        self.stage, self.inputs, self.outputs = stage, inputs, outputs
        self.before, self.after, self.last = before, after, last

    def forward(self, *values: torch.Tensor) -> object:
        env = dict(zip(self.before, values))
        env.update(zip(self.outputs, self.stage(*[env[n] for n in self.inputs])))
        if self.last:
            return env[self.outputs[0]]
        return tuple(env[n] for n in self.after)


def live_sets(manifest: dict) -> list[list[str]]:
    """Per boundary k (between stage k and k+1), the values produced at or before k and read
    after k."""
    stages = manifest["stages"]
    made = {n: j for j, s in enumerate(stages) for n in s["outputs"]}
    for name in manifest["inputs"]:
        made[name] = -1
    sets = []
    for k in range(len(stages) - 1):
        needed = {n for s in stages[k + 1 :] for n in s["inputs"] if made.get(n, 99) <= k}
        sets.append(sorted(needed))
    return sets


def worker(args: argparse.Namespace) -> None:
    import hf_gpt2  # noqa: F401  (registers the model's output type for the output spec)
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from pipecompile.runtime.checkpoint import save
    from pipecompile.runtime.dist_backend import DistBackend, tie_groups
    from pipecompile.runtime.layout import Layout
    from pipecompile.runtime.load import load_stage, read_manifest, read_program
    from pipecompile.runtime.pipeline import Pipeline

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    directory = Path(args.directory)
    manifest = read_manifest(directory)
    program = read_program(directory / manifest["program"])
    modules = [load_stage(directory, e) if j == rank else None
               for j, e in enumerate(manifest["stages"])]  # fmt: skip
    layout = Layout.from_manifest(manifest, program.stage_device)
    groups = tie_groups(layout)
    pipe = Pipeline(manifest, modules, program, device=rank,
                    backend=lambda: DistBackend(layout, manifest, MICRO, groups))  # fmt: skip
    inputs, target = data()

    def ours_loss(output: object, t: torch.Tensor) -> torch.Tensor:
        return loss_of(output.logits, t)  # type: ignore[attr-defined]

    sets = [[*manifest["inputs"]]] + live_sets(manifest) + [[]]
    entry = manifest["stages"][rank]
    wrapped = Passing(modules[rank], entry["inputs"], entry["outputs"], sets[rank],
                      sets[rank + 1], rank == world - 1)  # fmt: skip
    stage = PipelineStage(wrapped, rank, world, torch.device("cpu"))
    kind = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
    theirs = kind(stage, n_microbatches=MICRO, loss_fn=loss_of)

    def run_ours() -> None:
        pipe.train_step({"input_ids": inputs}, (target,), ours_loss)

    def run_theirs() -> None:
        if rank == 0:
            theirs.step(inputs)
        elif rank == world - 1:
            theirs.step(target=target, losses=[])
        else:
            theirs.step()
        wrapped.zero_grad(set_to_none=True)

    times: dict[str, list[float]] = {"pipecompile": [], "pipelining": []}
    for k in range(args.warmup + args.repeats):
        for name, run in (("pipecompile", run_ours), ("pipelining", run_theirs)):
            dist.barrier()
            start = time.perf_counter()
            run()
            slowest = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if k >= args.warmup:
                times[name].append(slowest.item())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) if rank == 0 else Path(tmp)
        shared = [str(root)]
        dist.broadcast_object_list(shared, src=0)
        pipe.set_optimizer(lambda ps: torch.optim.AdamW(ps, lr=1e-3))
        run_ours()
        dist.barrier()
        start = time.perf_counter()
        save(pipe, Path(shared[0]) / "ck", 1, rank)
        save_s = time.perf_counter() - start
        size = sum(f.stat().st_size for f in (Path(shared[0]) / "ck").rglob("*") if f.is_file())
    if rank == 0:
        print("RESULT " + json.dumps({
            "pipecompile": statistics.median(times["pipecompile"]),
            "pipelining": statistics.median(times["pipelining"]),
            "save_s": save_s, "save_bytes": size,
        }), flush=True)  # fmt: skip
    dist.barrier()
    dist.destroy_process_group()


def torchrun(nproc: int, *args: str) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", __file__, "--worker", *args]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    for line in result.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(result.stdout[-3000:] + result.stderr[-3000:])


def detection(directory: str, nproc: int) -> float:
    """Seconds from killing rank 1 mid-step until the last other rank has stopped."""
    from pipecompile.runtime.launch import launch

    os.environ["PIPECOMPILE_FAULT"] = "1:1B3:kill"
    records: list[dict] = []
    try:
        launch(nproc, [directory, "--steps", "3", "-q", "--model",
                       str(ROOT / "examples" / "mlp.py")], keep=records)  # fmt: skip
    finally:
        del os.environ["PIPECOMPILE_FAULT"]
    by_rank = {r["rank"]: r for r in records}
    return max(r["time"] for k, r in by_rank.items() if k != 1) - by_rank[1]["time"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--directory", help=argparse.SUPPRESS)
    parser.add_argument("--schedule", default="gpipe", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        print(f"compiling GPT-2 ({LAYERS} layers, n_embd {WIDTH}) ...", file=sys.stderr)
        dirs = compile_all(Path(tmp))
        print("| processes | schedule | pipecompile step (s) | pipelining step (s) | ratio "
              "| checkpoint save (s) | checkpoint size |")  # fmt: skip
        print("|---:|---|---:|---:|---:|---:|---:|")
        for p in (2, 4):
            for schedule in ("gpipe", "1f1b"):
                r = torchrun(
                    p,
                    "--directory",
                    dirs[f"{schedule}-{p}"],
                    "--schedule",
                    schedule,
                    "--warmup",
                    str(args.warmup),
                    "--repeats",
                    str(args.repeats),
                )
                print(f"| {p} | {schedule} | {r['pipecompile']:.3f} | {r['pipelining']:.3f} "
                      f"| {r['pipecompile'] / r['pipelining']:.2f} | {r['save_s']:.3f} "
                      f"| {r['save_bytes'] / 2**20:.1f} MiB |", flush=True)  # fmt: skip
        mlp = Path(tmp) / "mlp"
        from pipecompile.cli import main as cli

        for p in (2, 4):
            cli([str(ROOT / "examples" / "mlp.py"), "--stages", str(p), "--microbatches", "4",
                 "-q", "-o", str(mlp / str(p))])  # fmt: skip
            seconds = detection(str(mlp / str(p)), p)
            print(f"\n{p} processes: after rank 1 is killed at 1B3, every other rank has "
                  f"stopped {seconds:.2f} s later")  # fmt: skip


if __name__ == "__main__":
    main()
