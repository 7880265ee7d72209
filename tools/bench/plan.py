"""Benchmark the plan search: its speed, its predictions against measured steps, the plan
`--tune` picks against an exhaustive measured grid, and torch.distributed.pipelining's default
user setup on the same model, data and processes. Prints Markdown tables.

1. Search time: a 32-layer GPT (width 128, 64 tokens, batch 32), an 8-layer MLP (width
   256, batch 32), and models of 200 layers: a GPT (width 64, 32 tokens) and an MLP, over 8,
   16, 32 and 64 devices (goal: under 10 s each).
2. For a GPT, a Hugging Face Llama and a ResNet on 4 processes (CPU, gloo; `--processes 2`: 2):
   - `pipecompile MODEL --devices 4 --tune 3`: the plan chosen, re-measured;
   - a grid over stages (1, 2, 4; the search chooses their replicas up to the 4 devices) x
     micro-batches (2, 4, 8) x schedule (gpipe, 1f1b, zb1p), each compiled with `--devices
     4` and the rest fixed, its predicted step next to its measured one (`pipecompile run DIR
     --nproc R` on the R ranks it uses, median of the steps after the first), and how many
     are priced within 1.5x of their measured step;
   - torch.distributed.pipelining: ScheduleGPipe over 4 stages of equal layers, 4
     micro-batches, AdamW, the same data (its own step timer, slowest rank).
   Prediction error (median, worst) and Spearman's rank correlation over the grid.

The calibration is measured fresh into a temporary cache (as a new machine would). The grid
is predicted after `--tune` has kept what it learned for the model (its measured/predicted
ratio, as a second search would use it), and each prediction is also shown without it
(compiled against the calibration alone); the grid's own runs feed nothing back.
Rerun with::

    python tools/bench/plan.py            # docs/BENCHMARKS.md's figures (about 20 minutes)
    python tools/bench/plan.py --processes 2   # the same on 2 processes (one core each here)
    python tools/bench/plan.py --search-only   # the search times alone (part 1)
    python tools/bench/plan.py --no-search --processes 2   # part 2 alone
    python tools/bench/plan.py --quick    # 4 layers over 2 devices; one small GPT on 2
                                          # processes, --tune 1, a 1-point grid, the peer on
                                          # 2 stages, 2 steps a measured run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from common import machine, pipecompile_here, use_examples
from forked import run_ranks
from model_files import gpt_body, llama_body, resnet_body, write_model_file

use_examples()

STEPS = 4  # per measured run: the first warms up, the median of the rest counts
QUICK_STEPS = 2


@dataclass(frozen=True)
class Bench:
    """One model: its file's body (sizes, data, loss), the peer's equal-layer boundaries."""

    name: str
    body: str
    peer_split: tuple[str, ...]


GPT = Bench("gpt", gpt_body(8, 128, 4, 16, 64, 256), ("h.2", "h.4", "h.6"))
LLAMA = Bench(
    "hf_llama",
    llama_body(8, 128, 256, 16, 32),
    ("model.layers.2", "model.layers.4", "model.layers.6"),
)
RESNET = Bench("resnet", resnet_body(2, 32, 16), ("layer1", "layer2", "layer3"))
BENCHES = (GPT, LLAMA, RESNET)
QUICK_GPT = Bench("gpt", gpt_body(4, 32, 2, 16, 16, 64), ("h.1", "h.2", "h.3"))  # --quick's


def model_file(root: Path, bench: Bench) -> Path:
    return write_model_file(root / f"{bench.name}_bench.py", bench.body)


def search_models(quick: bool) -> list[tuple[str, torch.nn.Module, dict[str, torch.Tensor]]]:
    """The search-time models: a GPT (32 layers, width 128, 64 tokens, batch 32; 4 layers
    under --quick) and an 8-layer MLP (width 256, batch 32); then (not under --quick) 200
    layers of each: a GPT of width 64 over 32 tokens and an MLP."""
    from gpt import build_gpt

    def mlp(layers: int) -> torch.nn.Module:
        widths = [torch.nn.Linear(256, 256) for _ in range(layers)]
        return torch.nn.Sequential(*(m for lin in widths for m in (lin, torch.nn.ReLU())))

    layers = 4 if quick else 32
    g = torch.Generator().manual_seed(0)
    models = [
        (
            f"GPT {layers} layers",
            build_gpt(n_layer=layers, n_embd=128, n_head=4, block_size=64),
            {"idx": torch.randint(0, 128, (32, 64), generator=g)},
        ),
        ("MLP 8 layers", mlp(8), {"input": torch.randn(32, 256, generator=g)}),
    ]
    if not quick:
        models += [
            (
                "GPT 200 layers",
                build_gpt(n_layer=200, n_embd=64, n_head=2, block_size=32),
                {"idx": torch.randint(0, 128, (32, 32), generator=g)},
            ),
            ("MLP 200 layers", mlp(200), {"input": torch.randn(32, 256, generator=g)}),
        ]
    return models


def search_time(devices: tuple[int, ...], quick: bool) -> None:
    from dataclasses import replace

    from pipecompile.frontend.tracer import trace
    from pipecompile.ir.programs.cost_model import CostModel
    from pipecompile.passes import annotate_costs
    from pipecompile.planner.calibrate import calibrated_ranks
    from pipecompile.planner.model_facts import model_facts
    from pipecompile.planner.pricing import probe_timing
    from pipecompile.planner.rank_models import RankModels
    from pipecompile.planner.search import Space, search
    from pipecompile.runtime.process.threads import fair_share

    # Two sets of models, one per rank count: this machine's own, as a compile prices plans
    # (messages measured for the counts the largest search offers, N ranks sharing its 2
    # cores), and a stand-in for N devices of their own: the 2-rank calibration for every
    # count, its message latency raised by k picoseconds at k ranks so that no two counts
    # share the partitioner's work (as counts calibrated apart do not).
    most = max(devices)
    counts = list(range(1, most + 1))  # a search prices every count up to N
    made = calibrated_ranks(CostModel(), most, None, "", counts)
    own = RankModels(tuple(m for m, _ in made))
    two = made[1][0] if most > 1 else made[0][0]
    apart = RankModels(
        tuple(
            replace(two, message_latency=two.message_latency + k * 1e-12)
            for k in range(1, most + 1)
        )
    )
    print(
        "\n### Search time (one cost model per rank count: devices of their own, and this "
        "machine's ranks)\n"
    )
    print(
        "| model | devices | atoms | plans predicted | trace + facts | the model timed "
        "| search | search, calibration alone | search, this machine's ranks | chosen |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for label, model, inputs in search_models(quick):
        start = time.perf_counter()
        traced = trace(model, inputs)
        facts = model_facts(annotate_costs(traced.module, root=traced.root), 32)
        traced_s = time.perf_counter() - start
        start = time.perf_counter()  # as a compile does: the model's own timing corrects it
        probe = probe_timing(model, inputs, facts, fair_share(2))
        probe_s = time.perf_counter() - start
        timed_apart = _timed(apart, facts, probe, counts)
        timed_own = _timed(own, facts, probe, counts)
        for count in devices:
            space = Space(devices=count)
            first = _first(timed_apart, count)
            result = search(facts, batch=32, space=space, machine=first, keep=5)
            bare = search(facts, batch=32, space=space, machine=_first(apart, count), keep=5)
            here = search(facts, batch=32, space=space, machine=_first(timed_own, count), keep=5)
            searched = f"{result.tried} (+{result.bounded} bounded out)"
            chosen = result.best.plan.flags
            print(f"| {label} | {count} | {facts.atoms} | {searched} | {traced_s:.2f} s "
                  f"| {probe_s:.2f} s | {result.seconds:.2f} s | {bare.seconds:.2f} s "
                  f"| {here.seconds:.2f} s | `{chosen}` |", flush=True)  # fmt: skip


def _timed(models, facts, probe, counts):  # type: ignore[no-untyped-def]
    """``models`` corrected by the model's own timing (the counts searched; as a compile's)."""
    from pipecompile.planner.pricing import probe_applied

    fixed = tuple(
        probe_applied(facts, m, probe) if k in counts else m
        for k, m in enumerate(models.models, start=1)
    )
    return type(models)(fixed)


def _first(models, count: int):  # type: ignore[no-untyped-def]
    """The models of the counts up to ``count`` (a search offered ``count`` devices)."""
    return type(models)(models.models[:count])


def plan_of(directory: Path) -> dict:
    from pipecompile.ir.records.manifest import read_manifest

    plan = read_manifest(directory).plan
    assert plan is not None
    return plan.as_json()  # the manifest's JSON object, as this report writes it


def ranks_of(plan: dict) -> int:
    """The ranks a plan runs on (a search for N devices may choose fewer)."""
    if plan.get("devices_used"):
        return int(plan["devices_used"])
    replicas = plan.get("replicas") or []
    return sum(replicas) if any(r > 1 for r in replicas) else int(plan["devices"])


def measured(directory: Path, ranks: int, steps: int = STEPS) -> float:
    from pipecompile.planner.tune import measure_step

    return measure_step(directory, ranks, steps)


def grid_points(quick: bool, devices: int) -> list[tuple[int, int, str]]:
    if quick:
        return [(2, 2, "1f1b")]
    points = [(1, m, "gpipe") for m in (2, 4, 8)]
    stages = [s for s in (2, 4) if s <= devices]
    points += [(s, m, k) for s in stages for m in (2, 4, 8) for k in ("gpipe", "1f1b", "zb1p")]
    return points


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        for r, i in enumerate(order):
            out[i] = float(r)
        return out

    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    if n < 2:
        return float("nan")
    d2 = sum((a - b) ** 2 for a, b in zip(rx, ry))
    return 1 - 6 * d2 / (n * (n * n - 1))


def one_model(root: Path, bench: Bench, quick: bool, processes: int) -> dict:
    path = model_file(root, bench)
    tuned = root / f"{bench.name}-tuned"
    devices = "2" if quick else str(processes)
    steps = QUICK_STEPS if quick else STEPS
    pipecompile_here(str(path), "--devices", devices, "--tune", "1" if quick else "3", "-o",
                     str(tuned), "-q")  # fmt: skip
    chosen = plan_of(tuned)
    # re-measured beside the grid (quick: --tune's own measurement)
    chosen_s = chosen["measured_step_s"] if quick else measured(tuned, ranks_of(chosen))
    rows = []
    cache = untuned_cache(root)
    for stages, m, schedule in grid_points(quick, int(devices)):
        out = root / f"{bench.name}-{stages}-{m}-{schedule}"
        args = [str(path), "--devices", devices, "--stages", str(stages), "--microbatches",
                str(m), "--schedule", schedule]  # fmt: skip
        raw = predicted_untuned(cache, args, root / f"{out.name}-untuned")
        pipecompile_here(*args, "-o", str(out), "-q")
        plan = plan_of(out)
        rows.append((plan, raw, measured(out, ranks_of(plan), steps)))
    peer = peer_step(root, bench, path, int(devices), steps)
    return {"chosen": chosen, "chosen_s": chosen_s, "grid": rows, "peer_s": peer}


def peer_step(root: Path, bench: Bench, path: Path, stages: int, steps: int = STEPS) -> float:
    """torch.distributed.pipelining's ScheduleGPipe on equal-layer stages (4, or 2: the middle
    boundary), as many micro-batches as stages, ``steps`` steps (the median after the first)."""
    out = root / f"{bench.name}-peer"
    boundaries = bench.peer_split if stages == 4 else bench.peer_split[1:2]
    splits = [a for s in boundaries for a in ("--split-at", s)]
    pipecompile_here(str(path), "--stages", str(stages), "--microbatches", str(stages), *splits,
                     "-o", str(out), "-q")  # fmt: skip
    done = run_ranks(stages, __file__, "--peer-worker", "--directory", str(out), "--model-file",
                     str(path), "--steps", str(steps), timeout=900)  # fmt: skip
    found = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not found:
        raise SystemExit(done.stdout[-2000:] + done.stderr[-3000:])
    return float(json.loads(found[0][7:]))


def peer_worker(directory: Path, model_path: Path, steps: int = STEPS) -> None:
    """One rank of the peer's run over the emitted equal-layer stages."""
    import importlib.util

    import torch.distributed as dist
    from distributed import Passing, live_sets
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from pipecompile.runtime.load import load_stage, read_manifest

    spec = importlib.util.spec_from_file_location("bench_model", model_path)
    assert spec is not None and spec.loader is not None
    user = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(user)
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    manifest = read_manifest(directory)
    module = load_stage(directory, manifest.stages[rank])
    sets = [[*manifest.inputs]] + live_sets(manifest) + [[]]
    entry = manifest.stages[rank]
    wrapped = Passing(module, list(entry.inputs), list(entry.outputs), sets[rank],
                      sets[rank + 1], rank == world - 1)  # fmt: skip
    stage = PipelineStage(wrapped, rank, world, torch.device("cpu"))

    def loss(output: object, target: torch.Tensor) -> torch.Tensor:
        logits = getattr(output, "logits", output)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                 target.reshape(-1))  # fmt: skip

    schedule = ScheduleGPipe(stage, n_microbatches=world, loss_fn=loss)
    raw = user.example_inputs()
    inputs = [raw[n] for n in manifest.inputs] if isinstance(raw, dict) else list(raw)
    (target,) = user.example_targets()
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    times = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            schedule.step(*inputs)
        elif rank == world - 1:
            schedule.step(target=target, losses=[])
        else:
            schedule.step()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        slowest = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        times.append(slowest.item())
    if rank == 0:
        print("RESULT " + json.dumps(statistics.median(times[1:])), flush=True)
    dist.destroy_process_group()


def untuned_cache(root: Path) -> Path:
    """A cache holding this machine's calibration without what `--tune` learned (its
    ``step_scale``): compiled against it, a plan shows the calibrated-only prediction."""
    from pipecompile.planner.calibrate import record_path

    records = json.loads(record_path().read_text())
    for entry in records.values():
        entry.pop("step_scale", None)
    cache = root / "untuned-cache"
    cache.mkdir(exist_ok=True)
    (cache / "calibration.json").write_text(json.dumps(records))
    return cache


def predicted_untuned(cache: Path, args: list[str], out: Path) -> float:
    """The predicted step of the plan ``args`` compile to, priced by the untuned cache."""
    kept = os.environ["PIPECOMPILE_CACHE"]
    os.environ["PIPECOMPILE_CACHE"] = str(cache)
    try:
        pipecompile_here(*args, "-o", str(out), "-q")
        return float(plan_of(out)["predicted_step_s"])
    finally:
        os.environ["PIPECOMPILE_CACHE"] = kept


def report(bench: Bench, got: dict) -> tuple[list[float], list[float], float]:
    grid = got["grid"]
    n = got["chosen"]["devices"]
    print(f"\n### {bench.name} on {n} processes\n")
    print("| stages x replicas | micro-batches | schedule | calibrated | after --tune | measured "
          "| error (calibrated) | error (after --tune) |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    errors, raw_errors = [], []
    for plan, raw, seconds in grid:
        error, raw_error = plan["predicted_step_s"] / seconds - 1, raw / seconds - 1
        errors.append(error)
        raw_errors.append(raw_error)
        replicas = ",".join(map(str, plan["replicas"]))
        print(f"| {plan['stages']} x ({replicas}) | {plan['microbatches']} | {plan['schedule']} "
              f"| {raw * 1e3:.1f} ms | {plan['predicted_step_s'] * 1e3:.1f} ms "
              f"| {seconds * 1e3:.1f} ms | {raw_error:+.1%} | {error:+.1%} |")  # fmt: skip
    best = min(seconds for _, _, seconds in grid)
    chosen = got["chosen"]
    rho = spearman([p["predicted_step_s"] for p, _, _ in grid], [s for _, _, s in grid])
    print(
        f"\nchosen by `--devices {n} --tune K`: {chosen['stages']} stages x "
        f"({','.join(map(str, chosen['replicas']))}), {chosen['microbatches']} micro-batches, "
        f"{chosen['schedule']}: measured {got['chosen_s'] * 1e3:.1f} ms; best of the grid "
        f"{best * 1e3:.1f} ms ({got['chosen_s'] / best - 1:+.1%}); torch.distributed.pipelining "
        f"default (ScheduleGPipe, {n} equal stages, {n} micro-batches) "
        f"{got['peer_s'] * 1e3:.1f} ms: "
        f"**{got['peer_s'] / got['chosen_s']:.2f}x**. Prediction error, calibrated only: "
        f"median {statistics.median(abs(e) for e in raw_errors):.1%}, worst "
        f"{max(abs(e) for e in raw_errors):.1%}; after --tune's ratio: median "
        f"{statistics.median(abs(e) for e in errors):.1%}, worst "
        f"{max(abs(e) for e in errors):.1%}; rank correlation {rho:.2f}."
    )  # fmt: skip
    for label, found in (("calibrated only", raw_errors), ("after --tune", errors)):
        print(f"\n{within_line(label, found, grid)}")
    return errors, raw_errors, rho


FAR = 1.5  # a price within this factor of the measured step (either way) holds


def within_line(label: str, errors: list[float], grid: list | None = None) -> str:
    """How many prices (their errors: predicted / measured - 1) are within ``FAR`` of the
    measured step, and (with ``grid``) the plans that are not."""
    beyond = [k for k, e in enumerate(errors) if not 1 / FAR <= 1 + e <= FAR]
    line = f"{label}: {len(errors) - len(beyond)} of {len(errors)} plans priced within {FAR}x"
    if grid is not None and beyond:
        shown = []
        for k in beyond:
            plan = grid[k][0]
            replicas = ",".join(map(str, plan["replicas"]))
            ratio = 1 / (1 + errors[k])
            shown.append(f"{plan['stages']} x ({replicas}), {plan['microbatches']} mb, "
                         f"{plan['schedule']}: measured {ratio:.2f}x its price")  # fmt: skip
        line += "; beyond: " + "; ".join(shown)
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="seconds: every path, small")
    parser.add_argument("--only", choices=[b.name for b in BENCHES], help="one model")
    parser.add_argument("--processes", type=int, choices=(2, 4), default=4,
                        help="devices (processes) of --tune, the grid and the peer")  # fmt: skip
    parser.add_argument("--search-only", action="store_true", help="part 1 alone")
    parser.add_argument("--no-search", action="store_true", help="part 2 alone")
    parser.add_argument("--peer-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--directory", help=argparse.SUPPRESS)
    parser.add_argument("--model-file", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=STEPS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer_worker:
        peer_worker(Path(args.directory), Path(args.model_file), args.steps)
        return
    print(f"Machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PIPECOMPILE_CACHE"] = str(Path(tmp) / "cache")  # a fresh calibration
        if not args.no_search:
            search_time((2,) if args.quick else (8, 16, 32, 64), args.quick)
        if args.search_only:
            return
        benches = [b for b in BENCHES if args.only in (None, b.name)]
        if args.quick:  # one model: the GPT at small sizes, unless --only names another
            benches = [QUICK_GPT if benches[0] is GPT else benches[0]]
        tuned, calibrated = [], []
        for bench in benches:
            got = one_model(Path(tmp), bench, args.quick, args.processes)
            errors, raw_errors, _ = report(bench, got)
            tuned += errors
            calibrated += raw_errors
        for label, found in (("calibrated only", calibrated), ("after --tune", tuned)):
            print(f"\nAll {len(found)} measured plans, {label}: prediction error median "
                  f"{statistics.median(abs(e) for e in found):.1%}, worst "
                  f"{max(abs(e) for e in found):.1%}; {within_line(label, found)}.")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
