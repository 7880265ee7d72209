"""Benchmark the plan search's predictions: predicted against measured step for 12 fixed plans
of each of three models on 2 processes (one core each), with the spread of repeated
measurements beside them, and the rank correlation. Prints Markdown tables.

Models: a GPT (examples/gpt.py, 8 layers, width 64, 16 x 32 tokens), a Hugging Face Llama
(examples/hf_llama.py, 6 layers, hidden 64, 16 x 16 tokens) and a ResNet (examples/resnet.py,
2 blocks a group, width 16, 16 images of 32 x 32). Plans, all for 2 devices: 1 stage (2, 4,
8 micro-batches; 2 replicas, unless the search prices one device faster: the table then says
so and it runs on one process); 2 stages with gpipe (2, 4, 8), 1f1b (4, 8) and zb1p (4, 8);
4 stages, 2 a device, interleaved (--virtual-stages 2) and zbv (4 micro-batches).

Each plan is compiled with ``pipecompile MODEL --devices 2 --stages S --microbatches M
--schedule X``, so the plan search prices exactly that plan with this machine's kept
calibration (measured first where none is kept; a ratio ``--tune`` kept for the model scales
every prediction alike) and records it as the manifest's ``predicted_step_s``. It is measured
by ``pipecompile run DIR --nproc 2 --threads 1 --steps N --metrics FILE`` (from this
process, whose rank starter imported torch once, so a run starts at once): the median
``step_ms`` of the steps after the first (which warms up). The plans are measured round-robin
(all 12, then all 12 again, ...) so that drift on the machine hits every plan alike. A plan's
figure is the median of its repeats; its spread is their range over that median.

Spearman's rank correlation compares the predicted with the measured order (goal: 0.8 or
more). A pair of plans whose repeats overlap is ordered by noise, not by the measurement: their
count says how much of the order the measurement settles, and how many of the other pairs the
prediction orders as measured. Rerun, on a quiet machine, with::

    python tools/bench/predicted.py          # docs/BENCHMARKS.md's figure (about 8 minutes)
    python tools/bench/predicted.py --only gpt --repeats 5
    python tools/bench/predicted.py --quick  # a 2-layer GPT, 3 plans, 1 measurement of 3 steps

``--part replicated`` prices replicated plans where their gradient all-reduce weighs: a wider GPT
(8 layers, width 192, 16 x 32 tokens: 14 MB of gradients) as 1 stage x 2 replicas beside 2
stages, the ratio of measured to predicted of each (where the cost model stops holding is
where the replicated rows' ratio leaves the pipelined ones')::

    python tools/bench/predicted.py --part replicated
    python tools/bench/predicted.py --part replicated --busy 1   # another program on a core
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

from common import command, log, machine, pipecompile_done, spinning
from model_files import gpt_body, llama_body, resnet_body, write_model_file

from pipecompile.runtime.distributed.local_ranks import fork_a_starter

NPROC = 2


@dataclass(frozen=True)
class Model:
    """A model file's body (its sizes, example batch and loss), and how the report names it."""

    name: str
    title: str
    body: str


def _gpt(layers: int, width: int, heads: int, batch: int, seq: int, vocab: int) -> Model:
    title = f"GPT ({layers} layers, width {width}, {batch} x {seq} tokens)"
    return Model("gpt", title, gpt_body(layers, width, heads, batch, seq, vocab))


GPT = _gpt(8, 64, 4, 16, 32, 256)
LLAMA = Model(
    "hf_llama",
    "Hugging Face Llama (6 layers, hidden 64, 16 x 16 tokens)",
    llama_body(6, 64, 128, 16, 16),
)
RESNET = Model(
    "resnet",
    "ResNet (2 blocks a group, width 16, 16 images of 32 x 32)",
    resnet_body(2, 16, 16),
)
TINY_GPT = _gpt(2, 32, 2, 8, 16, 128)
WIDE_GPT = _gpt(8, 192, 4, 16, 32, 256)  # --part replicated: gradients that weigh
MODELS = (GPT, LLAMA, RESNET)


@dataclass(frozen=True)
class Fixed:
    """A plan fixed on the command line: stages, micro-batches, schedule (and stages a device
    for interleaved)."""

    stages: int
    microbatches: int
    schedule: str
    virtual_stages: int | None = None

    def flags(self) -> list[str]:
        fixed = ["--devices", str(NPROC), "--stages", str(self.stages)]
        fixed += ["--microbatches", str(self.microbatches), "--schedule", self.schedule]
        if self.virtual_stages is not None:
            fixed += ["--virtual-stages", str(self.virtual_stages)]
        return fixed

    @property
    def name(self) -> str:
        return f"{self.stages}-{self.microbatches}-{self.schedule}"


PLANS = (
    *(Fixed(1, m, "gpipe") for m in (2, 4, 8)),  # 2 replicas share the micro-batches
    *(Fixed(2, m, "gpipe") for m in (2, 4, 8)),
    *(Fixed(2, m, "1f1b") for m in (4, 8)),
    *(Fixed(2, m, "zb1p") for m in (4, 8)),
    Fixed(4, 4, "interleaved", virtual_stages=2),
    Fixed(4, 4, "zbv"),
)
QUICK_PLANS = (Fixed(1, 2, "gpipe"), Fixed(2, 2, "1f1b"), Fixed(2, 4, "zb1p"))
REPLICATED_PLANS = (
    Fixed(1, 2, "gpipe"), Fixed(1, 4, "gpipe"), Fixed(2, 2, "gpipe"), Fixed(2, 4, "1f1b"),
)  # fmt: skip


@dataclass(frozen=True)
class Row:
    """One plan: its manifest's plan record and its measured steps (seconds, one a repeat)."""

    plan: dict
    repeats: tuple[float, ...]

    @property
    def predicted(self) -> float:
        return float(self.plan["predicted_step_s"])

    @property
    def measured(self) -> float:
        return statistics.median(self.repeats)

    @property
    def spread(self) -> float:
        return (max(self.repeats) - min(self.repeats)) / self.measured

    @property
    def ranks(self) -> int:
        """The processes the plan runs on: the devices it uses (the search may leave one out)."""
        return int(self.plan["devices_used"])

    @property
    def shape(self) -> str:
        """``1 x (2)`` for replicas, ``4 (2 a device)`` for stages that share devices, and
        the devices used where the search left one out."""
        stages, used = self.plan["stages"], self.ranks
        if any(r > 1 for r in self.plan["replicas"]):
            return f"{stages} x ({','.join(map(str, self.plan['replicas']))})"
        if stages > used:
            return f"{stages} ({stages // used} a device)"
        return str(stages) if used == NPROC else f"{stages} (on {used} of {NPROC} devices)"


def model_file(root: Path, model: Model) -> Path:
    return write_model_file(root / f"{model.name}_model.py", model.body)


def compiled(path: Path, fixed: Fixed, out: Path) -> dict:
    """Compile ``fixed`` (without the proof, which is not what is measured) into ``out``; its
    manifest's plan record. The compile's notes (a calibration in doubt) go to stderr."""
    from pipecompile.ir.records.manifest import read_manifest

    done = pipecompile_done(str(path), *fixed.flags(), "--no-verify", "-o", str(out), "-q")
    for line in done.stderr.splitlines():
        if "note:" in line:
            log(line)
    plan = read_manifest(out).plan
    assert plan is not None, out
    return plan.as_json()  # the manifest's JSON object, as this report writes it


def measured_step(directory: Path, ranks: int, steps: int, metrics: Path) -> float:
    """Seconds of a step of ``directory`` on ``ranks`` ranks of one thread: the median
    ``step_ms`` of the steps after the first."""
    metrics.unlink(missing_ok=True)
    run = ["run", str(directory), "--nproc", str(ranks), "--threads", "1"]
    pipecompile_done(*run, "--steps", str(steps), "--metrics", str(metrics), "-q")
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    times = [r["step_ms"] / 1e3 for r in records if r.get("kind") == "train"]
    return statistics.median(times[1:] or times)


def round_robin(
    directories: list[Path], ranks: list[int], repeats: int, steps: int
) -> list[tuple[float, ...]]:
    """Each directory's step on its ranks, measured ``repeats`` times: all of them once,
    then all again."""
    found: list[list[float]] = [[] for _ in directories]
    for k in range(repeats):
        for times, directory, nproc in zip(found, directories, ranks):
            metrics = directory.with_suffix(".jsonl")
            times.append(measured_step(directory, nproc, steps, metrics))
            log(f"  round {k + 1}/{repeats}: {directory.name}: {times[-1] * 1e3:.1f} ms")
    return [tuple(t) for t in found]


def one_model(
    root: Path, model: Model, plans: tuple[Fixed, ...], repeats: int, steps: int
) -> list[Row]:
    path = model_file(root, model)
    directories = [root / f"{model.name}-{fixed.name}" for fixed in plans]
    records = []
    for fixed, directory in zip(plans, directories):
        log(f"{model.name}: compiling {' '.join(fixed.flags())}")
        records.append(compiled(path, fixed, directory))
    ranks = [int(plan["devices_used"]) for plan in records]
    measured = round_robin(directories, ranks, repeats, steps)
    return [Row(plan, times) for plan, times in zip(records, measured)]


def ranks(values: list[float]) -> list[float]:
    """1-based ranks of ``values``, ties given the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start : end + 1]:
            out[i] = (start + end) / 2 + 1
        start = end + 1
    return out


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation: Pearson's of the (tie-averaged) ranks; NaN when either
    side has fewer than two distinct values."""
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx and vy else float("nan")


def pair_counts(rows: list[Row]) -> tuple[int, int, int, int]:
    """Pairs of plans: all; those whose repeats overlap (their order is noise); of the others,
    those the prediction orders as measured, and those it orders the other way."""
    noise = agree = disagree = 0
    pairs = list(combinations(rows, 2))
    for a, b in pairs:
        if max(min(a.repeats), min(b.repeats)) <= min(max(a.repeats), max(b.repeats)):
            noise += 1
        elif (a.predicted - b.predicted) * (a.measured - b.measured) > 0:
            agree += 1
        elif a.predicted != b.predicted:
            disagree += 1
    return len(pairs), noise, agree, disagree


def report(model: Model, rows: list[Row], repeats: int) -> float:
    """The model's table and its summary line; its rank correlation."""
    cost_model = rows[0].plan["cost_model"]
    calibration = cost_model.get("calibration") or "off (the default costs)"
    print(f"\n### {model.title} on {NPROC} processes, one core each\n")
    factors = [
        f"x{cost_model[k]:.2f} ({k})" for k in ("fixed_scale", "work_scale") if k in cost_model
    ]
    timed = f"; the model's own timing: {', '.join(factors)}" if factors else ""
    print(f"calibration: {calibration}{timed}\n")
    print(
        "| stages | micro-batches | schedule | predicted | measured (median) "
        f"| spread of {repeats} | measured / predicted |"
    )
    print("|---|---:|---|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row.shape} | {row.plan['microbatches']} | {row.plan['schedule']} "
            f"| {row.predicted * 1e3:.1f} ms | {row.measured * 1e3:.1f} ms "
            f"| {row.spread:.1%} | {row.measured / row.predicted:.2f} |"
        )
    rho = spearman([r.predicted for r in rows], [r.measured for r in rows])
    pairs, noise, agree, disagree = pair_counts(rows)
    ratios = [r.measured / r.predicted for r in rows]
    spreads = [r.spread for r in rows]
    print(
        f"\nrank correlation (Spearman) **{rho:.2f}** (goal 0.8 or more); measured / "
        f"predicted median {statistics.median(ratios):.2f} (from {min(ratios):.2f} to "
        f"{max(ratios):.2f}); repeats' spread median {statistics.median(spreads):.1%}, worst "
        f"{max(spreads):.1%}. "
        f"Of {pairs} pairs of plans, {noise} differ by less than their repeats' spread (their "
        f"measurements overlap: noise); of the other {pairs - noise}, the prediction orders "
        f"{agree} as measured and {disagree} the other way."
    )
    return rho


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 2-layer GPT, 3 plans, once")
    parser.add_argument("--only", choices=[m.name for m in MODELS], help="one model")
    parser.add_argument(
        "--busy", type=int, default=0, help="processes kept spinning while the plans run"
    )
    parser.add_argument(
        "--part",
        choices=("models", "replicated"),
        default="models",
        help="models: the three models' 12 plans; replicated: a wider GPT's replicas",
    )
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each plan")
    parser.add_argument(
        "--steps", type=int, default=10, help="steps a measurement (the first warms up)"
    )
    if parser.parse_known_args()[0].quick:  # smaller defaults; options given still count
        parser.set_defaults(repeats=1, steps=3)
    args = parser.parse_args()
    fork_a_starter()  # the ranks' starter, forked before this process runs a torch op
    print(f"machine: {machine()}")
    print(f"command: {command()}", flush=True)
    models = [TINY_GPT] if args.quick else [m for m in MODELS if args.only in (None, m.name)]
    plans = QUICK_PLANS if args.quick else PLANS
    if args.part == "replicated" and not args.quick:
        models, plans = [WIDE_GPT], REPLICATED_PLANS
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-predicted-") as tmp:
        found = {}
        for model in models:
            with spinning(args.busy):  # the calibration kept is the quiet machine's
                rows = one_model(Path(tmp), model, plans, args.repeats, args.steps)
            found[model.name] = report(model, rows, args.repeats)
    shown = ", ".join(f"{name} {rho:.2f}" for name, rho in found.items())
    print(f"\nrank correlations: {shown}; the run took {time.perf_counter() - start:.0f} s.")


if __name__ == "__main__":
    main()
