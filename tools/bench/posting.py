"""Benchmark posting sends and receives ahead from a helper thread against posting them on
the rank's main thread (``PIPECOMPILE_POST_THREAD=0``), on 2 gloo processes with a core each.
Prints a Markdown table.

A gloo send or receive can block the thread that posts it for milliseconds while the
connection's own thread reads another message; posted from a helper thread, the main thread
computes meanwhile.

Models: the GPT (8 layers, width 64, 16 x 32 tokens) and the Hugging Face Llama (6 layers,
hidden 64, 16 x 16 tokens) of tools/bench/predicted.py, under two plans each: 2 stages, 1f1b,
8 micro-batches, and 4 stages two a device, interleaved, 4 micro-batches (the most messages
per device). Each plan is compiled once and run with `pipecompile run DIR --nproc 2 --threads 1
--steps N` by each way in turn, the order swapped every round; a run's figure is its median
``step_ms`` after the first step, a way's the median of its rounds. Rerun with::

    python tools/bench/posting.py            # docs/BENCHMARKS.md's figure (about 3 minutes)
    python tools/bench/posting.py --rounds 9
    python tools/bench/posting.py --quick    # a 2-layer GPT, one plan, one round of 3 steps
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path
from unittest import mock

from common import command, log, machine
from model_files import write_model_file
from predicted import GPT, LLAMA, TINY_GPT, Fixed, Model, compiled, measured_step

from pipecompile.runtime.distributed.local_ranks import fork_a_starter

PLANS = (Fixed(2, 8, "1f1b"), Fixed(4, 4, "interleaved", virtual_stages=2))
WAYS = ("thread", "main")  # PIPECOMPILE_POST_THREAD=1 and =0
_ENV = "PIPECOMPILE_POST_THREAD"


def measure(directory: Path, way: str, steps: int) -> float:
    """Seconds of a step of ``directory`` with receives posted ``way``."""
    with mock.patch.dict(os.environ, {_ENV: "1" if way == "thread" else "0"}):
        return measured_step(directory, 2, steps, directory.with_suffix(".jsonl"))


def one_plan(root: Path, model: Model, fixed: Fixed, rounds: int, steps: int) -> dict:
    """Each way's step per round, alternated (the order swapped each round)."""
    path = write_model_file(root / f"{model.name}_model.py", model.body)
    directory = root / f"{model.name}-{fixed.name}"
    log(f"{model.name}: compiling {' '.join(fixed.flags())}")
    compiled(path, fixed, directory)
    found: dict[str, list[float]] = {way: [] for way in WAYS}
    for k in range(rounds):
        for way in WAYS if k % 2 == 0 else WAYS[::-1]:
            found[way].append(measure(directory, way, steps))
            log(f"  round {k + 1}/{rounds}: {directory.name}, {way}: {found[way][-1] * 1e3:.1f} ms")
    return found


def report(rows: list[tuple[Model, Fixed, dict]]) -> None:
    print(
        "| model | plan | helper thread (ms) | main thread (ms) | thread / main | "
        "rounds the thread was faster |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for model, fixed, found in rows:
        thread, main = (statistics.median(found[w]) for w in WAYS)
        wins = sum(t < m for t, m in zip(found["thread"], found["main"]))
        plan = f"{fixed.stages} stages, {fixed.microbatches} micro-batches, {fixed.schedule}"
        print(
            f"| {model.title} | {plan} | {thread * 1e3:.1f} | {main * 1e3:.1f} "
            f"| {thread / main:.3f} | {wins} of {len(found['main'])} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny GPT, 1 plan, 1 round")
    parser.add_argument("--rounds", type=int, default=5, help="alternated rounds (default 5)")
    parser.add_argument("--steps", type=int, default=20, help="steps a run (default 20)")
    args = parser.parse_args()
    fork_a_starter()  # ranks forked by this process's starter: no torch import per run
    print(f"{machine()}\n\nCommand: `{command()}`\n")
    models = (TINY_GPT,) if args.quick else (GPT, LLAMA)
    plans = PLANS[:1] if args.quick else PLANS
    rounds, steps = (1, 3) if args.quick else (args.rounds, args.steps)
    with tempfile.TemporaryDirectory(prefix="pipecompile-posting-") as tmp:
        rows = [
            (model, fixed, one_plan(Path(tmp), model, fixed, rounds, steps))
            for model in models
            for fixed in plans
        ]
    report(rows)


if __name__ == "__main__":
    main()
