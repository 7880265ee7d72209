"""Benchmark the local backend on a busy machine: its threads follow the idle cores.

HF GPT-2 (8 layers, n_embd 256, 8 heads, vocabulary 1024, 16 x 64 tokens in 8 micro-batches),
2 stages, gpipe, AdamW, `pipecompile run` in one process. Each case runs ``--steps`` steps and
reports the median step of steps 2 onward (the metrics file's ``step_ms``): the machine idle;
then with half its cores kept busy by spinning processes: the default (threads follow the idle
cores), ``--threads`` set to every core (what a run without the option did before), and
``--threads 1``. The cases alternate ``--rounds`` times; each figure is the median over rounds.

``--part generate``: `pipecompile generate` of examples/char_lm.py (2 stages, ``--generate``),
40 new tokens after ``def ``, in one process: the seconds from the stages being built to the
last token (the command's own rate line), idle, with half the cores busy and with every core
busy: the default (threads following the idle cores, measured between turns), ``--threads``
every core (what generate did before it chose its threads) and ``--threads 1``.

Rerun with::

    python tools/bench/busy.py            # the figures in docs/BENCHMARKS.md (both parts)
    python tools/bench/busy.py --quick    # a 2-layer GPT-2 of width 32, 2 steps, one round,
                                          # the busy case with the threads following the cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from common import (
    EXAMPLES,
    command,
    log,
    machine,
    pipecompile_command,
    pipecompile_done,
    run_checked,
    spinning,
)

MODEL_FILE = """
import sys
sys.path.insert(0, {examples!r})
import torch
from hf_gpt2 import build_gpt2, loss_fn  # noqa: F401

LAYERS, WIDTH = {layers}, {width}


def build_model():
    return build_gpt2(n_layer=LAYERS, n_embd=WIDTH, n_head=max(WIDTH // 32, 1), vocab_size=1024,
                      n_positions=128)


def _ids():
    return torch.randint(0, 1024, (16, 65), generator=torch.Generator().manual_seed(0))


def example_inputs():
    return {{"input_ids": _ids()[:, :-1].contiguous()}}


def example_targets():
    return (_ids()[:, 1:].contiguous(),)
"""


def step_ms(directory: Path, steps: int, *flags: str) -> float:
    metrics = directory.parent / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    run_checked(pipecompile_command("run", str(directory), "--steps", str(steps), "-q",
                                    "--metrics", str(metrics), *flags))  # fmt: skip
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    times = [r["step_ms"] for r in rows if r.get("kind") == "train"]
    return statistics.median(times[1:] or times)


def generate_s(directory: Path, *flags: str) -> float:
    """Seconds `pipecompile generate` took from the stages being built to the 40th token."""
    argv = pipecompile_command("generate", str(directory), "--prompt", "def ",
                               "--max-new-tokens", "40", *flags)  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    line = next(ln for ln in done.stderr.splitlines() if "tokens/s" in ln)
    return float(line.split(" in ")[1].split(" s")[0])


def generation(rounds: int, quick: bool) -> None:
    """The generate part: seconds for 40 tokens, per case, median over rounds."""
    cores = len(os.sched_getaffinity(0))
    half = max(1, cores // 2)
    cases = {
        "idle, default": ((), 0),
        f"{half} of {cores} cores busy, default (follows idle cores)": ((), half),
        f"{half} of {cores} cores busy, --threads {cores} (the old default)":
            (("--threads", str(cores)), half),
        f"{half} of {cores} cores busy, --threads 1": (("--threads", "1"), half),
        f"{cores} of {cores} cores busy, default": ((), cores),
        f"{cores} of {cores} cores busy, --threads {cores}": (("--threads", str(cores)), cores),
        f"{cores} of {cores} cores busy, --threads 1": (("--threads", "1"), cores),
    }  # fmt: skip
    if quick:
        cases = dict(list(cases.items())[1:2])
    results: dict[str, list[float]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "char_lm"
        log("compiling examples/char_lm.py into 2 stages with --generate ...")
        pipecompile_done(str(EXAMPLES / "char_lm.py"), "--stages", "2", "--microbatches", "4",
                         "--generate", "-q", "-o", str(out))  # fmt: skip
        for k in range(rounds):
            for name, (flags, busy) in cases.items():
                with spinning(busy, gentle=quick):
                    results[name].append(generate_s(out, *flags))
                log(f"round {k + 1}: {name}: {results[name][-1]:.2f} s")
    print("\n| generate, 40 tokens | median seconds | spread |\n|---|---:|---|")
    for name, times in results.items():
        print(f"| {name} | {statistics.median(times):.3f} | {min(times):.3f}-{max(times):.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny GPT-2, one round")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--part", choices=("run", "generate", "all"), default="all")
    args = parser.parse_args()
    os.environ.pop("OMP_NUM_THREADS", None)  # it would fix the runs' threads
    print(f"machine: {machine()}")
    print(f"command: {command()}")
    if args.part in ("generate", "all"):
        generation(1 if args.quick else args.rounds, args.quick)
    if args.part in ("run", "all"):
        training(args)


def training(args: argparse.Namespace) -> None:
    """The run part: the median step per case, median over rounds."""
    sizes = (2, 32, 2, 1) if args.quick else (8, 256, args.steps, args.rounds)
    layers, width, steps, rounds = sizes
    cores = len(os.sched_getaffinity(0))
    busy = max(1, cores // 2)
    cases = {
        "idle, default": ((), False),
        f"{busy} of {cores} cores busy, default (follows idle cores)": ((), True),
        f"{busy} of {cores} cores busy, --threads {cores} (the old default)": (
            ("--threads", str(cores)), True),
        f"{busy} of {cores} cores busy, --threads 1": (("--threads", "1"), True),
    }  # fmt: skip
    if args.quick:  # the path the benchmark is about: busy, threads following the cores
        cases = dict(list(cases.items())[1:2])
    results: dict[str, list[float]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model.py"
        model.write_text(MODEL_FILE.format(examples=str(EXAMPLES), layers=layers, width=width))
        out = Path(tmp) / "out"
        log(f"compiling GPT-2 ({layers} layers, n_embd {width}) into 2 stages ...")
        # in this process: the compile is not what is measured
        pipecompile_done(str(model), "--stages", "2", "--microbatches", "8", "-q", "-o", str(out))
        for k in range(rounds):
            for name, (flags, loaded) in cases.items():
                with spinning(busy if loaded else 0, gentle=args.quick):
                    results[name].append(step_ms(out, steps, *flags))
                log(f"round {k + 1}: {name}: {results[name][-1]:.1f} ms")
    print("\n| case | median step (ms) |\n|---|---:|")
    for name, times in results.items():
        print(f"| {name} | {statistics.median(times):.1f} |")


if __name__ == "__main__":
    main()
