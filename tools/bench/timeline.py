"""Benchmark measured timelines: where each rank's step goes, and what tracing costs.

HF GPT-2 (24 layers, n_embd 256, 8 heads, vocabulary 1024, 64 tokens; ``--model llama``: an HF
Llama of the same depth and width, 4 key-value heads, SwiGLU of 1024), mini-batch 16 in 8
micro-batches, CPU, gloo, ``run --nproc 2`` (``--procs``) with AdamW. For each schedule (gpipe,
1f1b, zb1p): one run with ``--trace`` (every step traced), one without, and one without receives
posted ahead (``PIPECOMPILE_RECEIVE_AHEAD=0``), alternated ``--rounds`` times; then ``show
--measured`` of the last trace. Printed per schedule and rank: the step and its compute, waiting
(the measured bubble), communication, optimizer, data and other in ms, the measured bubble next
to the predicted one, the step simulated with the measured stage times against the measured
step, and the median step (over the steps after the first) of each of the three kinds of run.

Rerun with::

    python tools/bench/timeline.py            # the figures in docs/BENCHMARKS.md
    python tools/bench/timeline.py --model llama --procs 4 --schedules 1f1b --rounds 1
    python tools/bench/timeline.py --quick    # a 2-layer GPT-2 of width 32, gpipe, the traced
                                              # run only: seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from common import (
    EXAMPLES,
    QUICK_GPT2,
    GPT2Sizes,
    command,
    log,
    machine,
    pipecompile_command,
    pipecompile_done,
    run_checked,
)

MODEL_FILE = """
import sys
sys.path.insert(0, {examples!r})
import torch
from hf_gpt2 import build_gpt2, loss_fn  # noqa: F401
from hf_llama import build_llama

SIZES = {sizes!r}


def build_model():
    if SIZES["model"] == "llama":
        heads = SIZES["heads"]
        return build_llama(num_hidden_layers=SIZES["layers"], hidden_size=SIZES["width"],
                           num_attention_heads=heads, num_key_value_heads=heads // 2,
                           intermediate_size=4 * SIZES["width"], vocab_size=SIZES["vocab"])
    return build_gpt2(n_layer=SIZES["layers"], n_embd=SIZES["width"], n_head=SIZES["heads"],
                      vocab_size=SIZES["vocab"], n_positions=128)


def _ids():
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, SIZES["vocab"], (SIZES["batch"], SIZES["tokens"] + 1), generator=g)


def example_inputs():
    return {{"input_ids": _ids()[:, :-1].contiguous()}}


def example_targets():
    return (_ids()[:, 1:].contiguous(),)
"""


@dataclass(frozen=True)
class Sizes(GPT2Sizes):
    """The model (``GPT2Sizes``) and the run."""

    model: str = "gpt2"  # or "llama" (HF Llama: grouped-query attention, SwiGLU)
    procs: int = 2
    micro: int = 8
    steps: int = 6
    schedules: tuple[str, ...] = ("gpipe", "1f1b", "zb1p")


QUICK = Sizes(**QUICK_GPT2, batch=4, micro=2, steps=2, schedules=("gpipe",))


def step_ms(metrics: Path) -> float:
    """The median step of a metrics file's last run, without its first step."""
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    last = max(i for i, r in enumerate(records) if r["kind"] == "start")
    steps = [r["step_ms"] for r in records[last:] if r["kind"] == "train"]
    return statistics.median(steps[1:] or steps)


def one_schedule(
    root: Path, model: Path, sizes: Sizes, schedule: str, rounds: int, *, compare: bool = True
) -> dict:
    """The traced runs' report; with ``compare`` also the untraced runs and those without
    receives posted ahead (``--quick`` leaves them out: the same command twice more)."""
    out = root / schedule
    stages = str(sizes.procs)
    split = ["--stages", stages, "--microbatches", str(sizes.micro), "--schedule", schedule]
    pipecompile_done(str(model), *split, "-q", "-o", str(out))
    trace, traced, plain = (
        root / f"{schedule}.json",
        root / f"{schedule}-t.jsonl",
        root / f"{schedule}-p.jsonl",
    )
    base = [
        "run",
        str(out),
        "--nproc",
        str(sizes.procs),
        "--steps",
        str(sizes.steps),
        "-q",
        "--optimizer",
        "adamw",
    ]
    with_trace, without, late = [], [], []
    for _ in range(rounds):  # alternate, so all three see the same machine
        pipecompile_done(*base, "--trace", str(trace), "--trace-steps", str(sizes.steps),
                         "--metrics", str(traced))  # fmt: skip
        with_trace.append(step_ms(traced))
        if not compare:
            continue
        pipecompile_done(*base, "--metrics", str(plain))
        without.append(step_ms(plain))
        run_checked(  # a variable read when the runtime is imported: a process of its own
            pipecompile_command(*base, "--metrics", str(plain)), PIPECOMPILE_RECEIVE_AHEAD="0"
        )
        late.append(step_ms(plain))
    shown = pipecompile_done("show", str(out), "--measured", str(trace), "--json")
    report = json.loads(shown.stdout)
    report["step_ms_traced"] = statistics.median(with_trace)
    report["step_ms_untraced"] = statistics.median(without) if without else float("nan")
    report["step_ms_receive_when_needed"] = statistics.median(late) if late else float("nan")
    return report


def table(reports: dict[str, dict]) -> str:
    columns = ("compute", "waiting", "communication", "optimizer", "data", "other")
    lines = [
        "| schedule | rank | step ms | " + " | ".join(columns) + " | bubble measured | predicted |",
        "|---|---:|---:|" + "---:|" * len(columns) + "---:|---:|",
    ]
    for schedule, report in reports.items():
        for rank, f in report["rows"].items():
            cells = " | ".join(f"{f[c]:.2f}" for c in columns)
            bubble = f["waiting"] / f["step"]
            predicted = report["predicted_bubble"][int(rank)]
            lines.append(f"| {schedule} | {rank} | {f['step']:.2f} | {cells} | {bubble:.1%} | "
                         f"{predicted:.1%} |")  # fmt: skip
    lines += [
        "",
        "| schedule | measured step / simulated from measured stage times "
        "| median step untraced (ms) | traced (ms) | tracing costs "
        "| receives not posted ahead (ms) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for schedule, r in reports.items():
        cost = r["step_ms_traced"] / r["step_ms_untraced"] - 1
        ratio = f"{r['measured_step_ms']:.1f} / {r['simulated_step_ms']:.1f} ms"
        steps = f"{r['step_ms_untraced']:.1f} | {r['step_ms_traced']:.1f}"
        late = r["step_ms_receive_when_needed"]
        lines.append(
            f"| {schedule} | {r['measured_over_simulated']:.2f} ({ratio}) | {steps} | {cost:+.1%} "
            f"| {late:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny GPT-2, gpipe, 2 steps")
    parser.add_argument("--rounds", type=int, default=3, help="traced/untraced pairs per schedule")
    parser.add_argument("--model", choices=("gpt2", "llama"), default="gpt2")
    parser.add_argument("--procs", type=int, default=2, help="processes (and stages)")
    parser.add_argument("--schedules", nargs="+", choices=("gpipe", "1f1b", "zb1p"))
    args = parser.parse_args()
    sizes = QUICK if args.quick else Sizes()
    sizes = replace(sizes, model=args.model, procs=args.procs)
    if args.schedules:
        sizes = replace(sizes, schedules=tuple(args.schedules))
    rounds = 1 if args.quick else args.rounds
    print(f"machine: {machine()}")
    print(f"command: {command()}")
    print(f"sizes: {asdict(sizes)}\n")
    reports = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "gpt2_model.py"
        model.write_text(MODEL_FILE.format(examples=str(EXAMPLES), sizes=asdict(sizes)))
        for schedule in sizes.schedules:
            log(f"{schedule}: compiling, then {rounds} traced/untraced pairs of runs ...")
            reports[schedule] = one_schedule(
                Path(tmp), model, sizes, schedule, rounds, compare=not args.quick
            )
    print(table(reports))


if __name__ == "__main__":
    main()
