"""Benchmark pipecompile's compile time against torch.distributed.pipelining.pipeline().

Measures, side by side in one run, the wall-clock time to compile a randomly initialised
Hugging Face GPT-2 (n_embd 256, n_head 8, vocab 1000, input_ids (8, 64), 4 micro-batches)
into 4 pipeline stages:

* pipecompile: ``compile_model`` (trace -> annotate_costs -> balance_stages -> split_stages
  -> schedule -> insert_communication) followed by ``emit`` to a fresh temporary directory;
* torch.distributed.pipelining: ``pipeline()`` (torch.export trace + split) with hand-placed
  ``SplitPoint.BEGINNING`` split points at layers L/4, L/2 and 3L/4; it writes no files.

Each timed run builds a fresh model (construction is not timed). One untimed warm-up run of
each side comes first; then the two sides alternate for ``--repeats`` runs per layer count and
the medians are reported, together with each pipecompile pass's median share of its total.

Rerun with::

    python tools/bench/compile_time.py                       # 24 and 48 layers, 3 repeats
    python tools/bench/compile_time.py --layers 24 --repeats 5 --json /tmp/bench.json
    python tools/bench/compile_time.py --quick           # 4 layers, 1 repeat, no warm-up
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType

import torch
from common import command, log, machine, timed, use_examples
from torch import nn

from pipecompile.compiler import PASSES as COMPILER_PASSES

STAGES = 4
MICROBATCHES = 4
BATCH, SEQ_LEN, VOCAB = 8, 64, 1000
PASSES = (*COMPILER_PASSES, "emit")  # the compiler's own pass list, then writing the files


@dataclass
class SizeResult:
    """Raw timings (seconds) for one layer count."""

    layers: int
    pipecompile: list[float] = field(default_factory=list)
    pipelining: list[float] = field(default_factory=list)
    passes: list[dict[str, float]] = field(default_factory=list)


def load_gpt2_example() -> ModuleType:
    """``examples/hf_gpt2.py``, imported as ``hf_gpt2``."""
    use_examples()
    import hf_gpt2

    return hf_gpt2


def example_ids() -> torch.Tensor:
    """The (8, 64) int64 mini-batch of token ids, from a fixed generator."""
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, VOCAB, (BATCH, SEQ_LEN), generator=gen)


def make_builder(example: ModuleType, layers: int) -> Callable[[], nn.Module]:
    """A zero-argument factory for a fresh GPT-2 with ``layers`` blocks."""

    def build() -> nn.Module:
        return example.build_gpt2(
            n_layer=layers, n_embd=256, n_head=8, vocab_size=VOCAB, n_positions=128
        )

    return build


def time_pipecompile(model: nn.Module, ids: torch.Tensor) -> tuple[float, dict[str, float]]:
    """Compile and emit ``model``; return total seconds and per-pass seconds (incl. emit)."""
    from pipecompile.codegen.emit import ModelRef, emit
    from pipecompile.compiler import compile_model

    tmp = Path(tempfile.mkdtemp(prefix="bench_compile_"))
    try:
        start = time.perf_counter()
        compiled = compile_model(
            model, {"input_ids": ids}, stages=STAGES, microbatches=MICROBATCHES
        )
        mid = time.perf_counter()
        emit(compiled, tmp / "out", model=ModelRef(None, "build_gpt2", "hf_gpt2"))
        end = time.perf_counter()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    passes = dict(compiled.timings)
    passes["emit"] = end - mid
    return end - start, passes


def time_pipelining(model: nn.Module, ids: torch.Tensor, layers: int) -> float:
    """Run torch.distributed.pipelining.pipeline() with hand-placed split points; seconds."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    per = layers // STAGES
    spec = {f"transformer.h.{per * s}": SplitPoint.BEGINNING for s in range(1, STAGES)}
    micro = ids[: BATCH // MICROBATCHES]
    elapsed, pipe = timed(lambda: pipeline(model, mb_args=(micro,), split_spec=spec))
    if pipe.num_stages != STAGES:
        raise RuntimeError(f"pipeline() made {pipe.num_stages} stages, expected {STAGES}")
    return elapsed


def warm_up(build: Callable[[], nn.Module], ids: torch.Tensor, layers: int) -> None:
    """One untimed run of each side, to pay one-time import and torch.export costs."""
    log(f"warm-up ({layers} layers): pipecompile ...")
    time_pipecompile(build(), ids)
    log(f"warm-up ({layers} layers): pipelining ...")
    time_pipelining(build(), ids, layers)


def measure_size(example: ModuleType, ids: torch.Tensor, layers: int, repeats: int) -> SizeResult:
    """Alternate the two sides ``repeats`` times at one layer count."""
    build = make_builder(example, layers)
    result = SizeResult(layers)
    for rep in range(1, repeats + 1):
        total, passes = time_pipecompile(build(), ids)
        result.pipecompile.append(total)
        result.passes.append(passes)
        log(f"[{layers} layers, run {rep}/{repeats}] pipecompile {total:7.2f} s")
        seconds = time_pipelining(build(), ids, layers)
        result.pipelining.append(seconds)
        log(f"[{layers} layers, run {rep}/{repeats}] pipelining  {seconds:7.2f} s")
    return result


def median_shares(result: SizeResult) -> dict[str, float]:
    """Median percentage of pipecompile's total per pass, plus the unattributed rest."""
    shares: dict[str, list[float]] = {name: [] for name in (*PASSES, "other")}
    for total, passes in zip(result.pipecompile, result.passes, strict=True):
        for name in PASSES:
            shares[name].append(100.0 * passes.get(name, 0.0) / total)
        shares["other"].append(100.0 * (total - sum(passes.values())) / total)
    return {name: statistics.median(values) for name, values in shares.items()}


def time_table(results: list[SizeResult]) -> str:
    """The Markdown table of median compile times and their ratio."""
    lines = [
        "| layers | pipecompile median (s) | pipelining median (s) | ratio (goal <= 1.0) |",
        "|---:|---:|---:|---:|",
    ]
    for r in results:
        pc, pl = statistics.median(r.pipecompile), statistics.median(r.pipelining)
        lines.append(f"| {r.layers} | {pc:.3f} | {pl:.3f} | {pc / pl:.2f} |")
    return "\n".join(lines)


def share_table(results: list[SizeResult]) -> str:
    """The Markdown table of each pass's median share of pipecompile's total."""
    shares = [median_shares(r) for r in results]
    header = "| pass | " + " | ".join(f"{r.layers} layers (%)" for r in results) + " |"
    lines = [header, "|---|" + "---:|" * len(results)]
    for name in (*PASSES, "other"):
        cells = " | ".join(f"{s[name]:.1f}" for s in shares)
        lines.append(f"| {name} | {cells} |")
    return "\n".join(lines)


def machine_lines(argv: list[str]) -> str:
    """The machine and the exact command line."""
    return f"- machine: {machine()}\n- command: `{command(argv[1:])}`"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[24, 48])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="also write raw numbers here")
    parser.add_argument("--quick", action="store_true", help="4 layers, one repeat")
    if parser.parse_known_args(argv)[0].quick:  # smaller defaults; options given still count
        parser.set_defaults(layers=[STAGES], repeats=1)
    args = parser.parse_args(argv)
    if args.repeats < 1 or any(n < STAGES or n % STAGES for n in args.layers):
        parser.error(f"--repeats must be >= 1 and each --layers a positive multiple of {STAGES}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the report."""
    argv = sys.argv if argv is None else argv
    args = parse_args(argv[1:])
    warnings.filterwarnings("ignore", category=FutureWarning)
    example, ids = load_gpt2_example(), example_ids()
    started = time.perf_counter()
    if not args.quick:  # in --quick the same calls run once, timed
        warm_up(make_builder(example, min(args.layers)), ids, min(args.layers))
    results = [measure_size(example, ids, n, args.repeats) for n in args.layers]
    log(f"done in {time.perf_counter() - started:.1f} s")
    print("# pipecompile vs torch.distributed.pipelining: compile time\n")
    print(machine_lines(argv) + "\n")
    print(
        f"GPT-2 n_embd 256, {STAGES} stages, {MICROBATCHES} micro-batches, medians of "
        f"{args.repeats} runs; pipecompile = compile_model + emit\n"
    )
    print(time_table(results) + "\n")
    print("pipecompile pass shares (median % of pipecompile total):\n")
    print(share_table(results))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
