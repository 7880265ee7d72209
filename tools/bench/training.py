"""Benchmark `pipecompile run` as a training loop, side by side with eager PyTorch and
torch.distributed.pipelining.

1. Seeds: examples/gpt.py:build_dropout_model (dropout 0.1), 3 steps with --seed 7, for 1, 2
   and 4 stages, gpipe / 1f1b / zb1p, --recompute always, and --nproc 2: every loss
   against the 2-stage gpipe run's.
2. bf16: examples/gpt.py (no dropout), 20 AdamW steps on its example batch with --precision
   bf16, against the same 20 steps of the eager model under torch.autocast(bf16), and the
   bytes sent between stages per step (the runtime's counters) in fp32 and bf16.
3. Throughput: examples/char_lm.py on its own corpus (train_batches()), `run --nproc 2`
   (gpipe, 4 micro-batches) against a torch.distributed.pipelining training loop over the
   same model, data, micro-batches and optimizer (ScheduleGPipe, split at the middle block),
   both on 2 CPU processes with gloo: samples/s, median over the timed steps.

Compiles and the runs of one process go through ``pipecompile.surfaces.cli.main`` in this process
(their time is not reported; a fresh interpreter would spend seconds importing torch); the two
throughput runs, whose whole-command time is reported, start processes of their own (under
--quick, which judges no figure, the peer's ranks are forked from a warm process instead of
started by torchrun: tools/bench/forked.py).

    python tools/bench/training.py            # the figures in docs/BENCHMARKS.md
    python tools/bench/training.py --quick    # 2 seed configurations, 2 bf16 and 2 throughput
                                              # steps, one round
    python tools/bench/training.py --part throughput   # one part
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import (
    EXAMPLES,
    machine,
    pipecompile_command,
    pipecompile_here,
    run_checked,
    timed,
    use_examples,
)
from forked import run_ranks

WAIT_S = 900  # the most the peer's ranks may take
GPT = EXAMPLES / "gpt.py"
CHAR = EXAMPLES / "char_lm.py"


def train_records(path: Path) -> list[dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in lines if r["kind"] == "train"]


def seeds(root: Path, quick: bool) -> None:
    configs = {
        "2 stages gpipe": (["--stages", "2"], []),
        "1 stage": (["--stages", "1"], []),
        "4 stages gpipe": (["--stages", "4"], []),
        "2 stages 1f1b": (["--stages", "2", "--schedule", "1f1b"], []),
        "2 stages zb1p": (["--stages", "2", "--schedule", "zb1p"], []),
        "4 stages --recompute always": (["--stages", "4", "--recompute", "always"], []),
        "2 stages --nproc 2": (["--stages", "2"], ["--nproc", "2"]),
    }
    if quick:
        configs = {k: configs[k] for k in ("2 stages gpipe", "1 stage")}
    losses = {}
    for name, (compile_args, run_args) in configs.items():
        out = root / name.replace(" ", "_")
        pipecompile_here(f"{GPT}:build_dropout_model", *compile_args, "--microbatches", "4", "-q",
                    "-o", str(out))  # fmt: skip
        pipecompile_here("run", str(out), "--steps", "3", "--seed", "7", "-q", *run_args)
        losses[name] = [r["loss"] for r in train_records(out / "metrics.jsonl")]
    reference = losses["2 stages gpipe"]
    print("\n## Same --seed, dropout 0.1 GPT, 3 steps\n")
    print("| configuration | loss step 1 | step 2 | step 3 | largest difference |")
    print("|---|---:|---:|---:|---:|")
    for name, got in losses.items():
        diff = max(abs(a - b) for a, b in zip(got, reference))
        print(f"| {name} | {got[0]:.9f} | {got[1]:.9f} | {got[2]:.9f} | {diff:.1e} |")


def bf16(root: Path, quick: bool) -> None:
    steps = 2 if quick else 20
    use_examples()
    import gpt  # examples/gpt.py

    curves, sent = {}, {}
    out = root / "bf16"
    pipecompile_here(str(GPT), "--stages", "2", "--microbatches", "4", "-q", "-o", str(out))
    for precision in ("fp32", "bf16"):
        pipecompile_here("run", str(out), "--steps", str(steps), "--precision", precision, "-q",
                    "--lr", "1e-3")  # fmt: skip
        records = train_records(out / "metrics.jsonl")[-steps:]
        curves[precision] = [r["loss"] for r in records]
        sent[precision] = records[0]["sent_bytes"]
    model = gpt.build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    eager = []
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = gpt.loss_fn(model(*gpt.example_inputs()), *gpt.example_targets())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        eager.append(loss.item())
    rel = max(abs(a - b) / abs(b) for a, b in zip(curves["bf16"], eager))
    rel32 = max(abs(a - b) / abs(b) for a, b in zip(curves["fp32"], eager))
    print(f"\n## bf16 on CPU, GPT example, {steps} AdamW steps\n")
    print("| | loss step 1 | loss last step | largest relative gap to eager autocast |")
    print("|---|---:|---:|---:|")
    print(f"| eager torch.autocast(bf16) | {eager[0]:.5f} | {eager[-1]:.5f} | - |")
    print(f"| pipecompile --precision bf16 | {curves['bf16'][0]:.5f} | {curves['bf16'][-1]:.5f} "
          f"| {rel:.2e} |")  # fmt: skip
    print(f"| pipecompile fp32 | {curves['fp32'][0]:.5f} | {curves['fp32'][-1]:.5f} "
          f"| {rel32:.2e} |")  # fmt: skip
    print(f"\nBytes sent between stages per step: fp32 {sent['fp32']}, bf16 {sent['bf16']} "
          f"({sent['bf16'] / sent['fp32']:.2f}x)")  # fmt: skip


def throughput(root: Path, quick: bool) -> None:
    steps = 2 if quick else 30
    out = root / "char_lm"
    model = str(CHAR)
    pipecompile_here(model, "--stages", "2", "--microbatches", "4", "-q", "-o", str(out))
    args = ["--steps", str(steps), "-q", "--optimizer", "adamw", "--lr", "1e-3"]
    ours = peer = 0.0
    for _ in range(1 if quick else 2):  # alternate, so both see the same machine
        ours_run = pipecompile_command("run", str(out), "--nproc", "2", *args)
        ours_wall, _ = timed(run_checked, ours_run)  # the whole command: a process of its own
        records = train_records(out / "metrics.jsonl")[-steps:]
        ours = max(ours, statistics.median(r["samples_per_s"] for r in records[1:] or records))
        result = root / "peer.json"
        peer_wall, _ = timed(peer_run, steps, result, model)
        peer = max(peer, json.loads(result.read_text())["samples_per_s"])
    print(f"\n## Training throughput, char_lm, 2 processes, {steps} steps\n")
    print("| | samples/s (median step) | whole command (s) |")
    print("|---|---:|---:|")
    print(f"| pipecompile run --nproc 2 | {ours:.1f} | {ours_wall:.1f} |")
    print(f"| torch.distributed.pipelining | {peer:.1f} | {peer_wall:.1f} |")
    print(f"\nRatio: {ours / peer:.2f}x")


def peer_run(steps: int, result: Path, model: str) -> None:
    """The torch.distributed.pipelining loop on 2 ranks (``forked.run_ranks``: torchrun, one
    thread a rank as torchrun gives it; under --quick, whose whole-command time is not
    judged, ranks forked from a warm process)."""
    args = ("--peer-worker", str(steps), str(result), "--model-ref", model)
    done = run_ranks(2, __file__, *args, timeout=WAIT_S)
    if done.returncode:
        raise SystemExit(done.stdout[-3000:] + done.stderr[-3000:])


def peer_worker(steps: int, result: Path, model_ref: str) -> None:
    """One rank of the torch.distributed.pipelining training loop (torchrun starts two)."""
    import importlib.util

    import torch.distributed as dist
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline

    path, _, name = model_ref.partition(":")
    spec = importlib.util.spec_from_file_location("char_lm", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["char_lm"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = getattr(module, name or "build_model")()
    (idx,), _ = next(iter(module.train_batches()))
    micro = 4
    middle = len(model.h) // 2
    pipe = pipeline(model, mb_args=(idx.chunk(micro)[0],),
                    split_spec={f"h.{middle}": SplitPoint.BEGINNING})  # fmt: skip
    stage = pipe.build_stage(rank, torch.device("cpu"))
    optimizer = torch.optim.AdamW(stage.submod.parameters(), lr=1e-3)
    schedule = ScheduleGPipe(stage, micro, loss_fn=module.loss_fn)
    batches = iter(module.train_batches())
    times = []
    for _ in range(steps):
        inputs, targets = next(batches)
        began = time.perf_counter()
        if rank == 0:
            schedule.step(inputs[0])
        else:
            schedule.step(target=targets[0])
        optimizer.step()
        optimizer.zero_grad()
        flag = torch.zeros(1)
        dist.all_reduce(flag)  # the step ends when both ranks are done, as pipecompile's does
        times.append(time.perf_counter() - began)
    if rank == 0:
        samples = idx.shape[0]
        median = statistics.median(times[1:] or times)
        result.write_text(json.dumps({"samples_per_s": samples / median}))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and configurations")
    parser.add_argument("--peer-worker", nargs=2, metavar=("STEPS", "RESULT"))
    parser.add_argument("--model-ref", default=str(CHAR))
    parser.add_argument("--part", action="append", choices=("seeds", "bf16", "throughput"),
                        help="run only this part (repeatable; default all)")  # fmt: skip
    args = parser.parse_args()
    if args.peer_worker:
        peer_worker(int(args.peer_worker[0]), Path(args.peer_worker[1]), args.model_ref)
        return
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for part in args.part or ("seeds", "bf16", "throughput"):
            {"seeds": seeds, "bf16": bf16, "throughput": throughput}[part](root, args.quick)


if __name__ == "__main__":
    main()
