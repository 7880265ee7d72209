"""Compare pipecompile's exact partitioner with torchgpipe's and DeepSpeed's balancers.

The problem: split a sequence of non-negative integer costs into k contiguous, non-empty parts
so that the largest part sum (the bottleneck) is as small as possible. Every partitioner gets
the same cost vectors; each split is scored by bottleneck / optimum, where the optimum comes
from an independent O(n^2 k) dynamic program in this file (for the 20,000-node timing cases,
from an independent bisection on the bottleneck with a greedy check). Three parts:

1. random cost vectors (fixed seeds; several distributions, n in 2..200, 2..16 parts);
2. the real per-atom FLOP costs of every example model under ``examples/`` at 2, 4, 8 stages;
3. partition time for 20,000 nodes into 8 and 16 stages (median of 5; a peer that would need
   more than ``--cap`` seconds is not run, and its predicted time is printed instead).

Rerun from the repository root (about a minute on 2 cores)::

    python tools/bench/partitioners.py
    python tools/bench/partitioners.py --quick   # 2 cases per distribution, the MLP only,
                                                 # 200 nodes: every part in a few seconds

Peers are optional; a missing one is skipped with a note. Install them with::

    pip install torchgpipe
    DS_BUILD_OPS=0 pip install deepspeed

Prints Markdown tables (copied into ``docs/BENCHMARKS.md``).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.metadata
import importlib.util
import itertools
import math
import random
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
from common import EXAMPLES, command, machine, timed

from pipecompile.balance.min_max_partition import min_max_partition
from pipecompile.balance.partition_search import Problem, solve

EXAMPLE_NAMES = ("gpt", "mlp", "resnet", "hf_gpt2", "hf_bert", "hf_llama")
DISTRIBUTIONS = ("uniform", "exponential", "pareto", "huge-among-small", "transformer", "sparse")


# --------------------------------------------------------------------------- reference optima


def optimum_dp(costs: Sequence[int], parts: int) -> int:
    """Exact optimum by the textbook DP: best[j][i] = least bottleneck of costs[:i] in j parts."""
    n = len(costs)
    prefix = [0, *itertools.accumulate(costs)]
    inf = math.inf
    best: list[float] = [prefix[i] if i >= 1 else inf for i in range(n + 1)]  # one part
    for j in range(2, parts + 1):
        new: list[float] = [inf] * (n + 1)
        for i in range(j, n - (parts - j) + 1):
            p_i = prefix[i]
            new[i] = min(max(best[s], p_i - prefix[s]) for s in range(j - 1, i))
        best = new
    return int(best[n])


def optimum_bisect(costs: Sequence[int], parts: int) -> int:
    """Exact optimum by bisection on the bottleneck B: the least B for which greedy packing
    needs at most ``parts`` parts (with n >= parts, fewer parts can always be split further)."""

    def parts_needed(limit: int) -> int:
        count, run = 1, 0
        for c in costs:
            if run + c > limit:
                count, run = count + 1, c
            else:
                run += c
        return count

    lo, hi = max(costs), sum(costs)
    while lo < hi:
        mid = (lo + hi) // 2
        if parts_needed(mid) <= parts:
            hi = mid
        else:
            lo = mid + 1
    return lo


# --------------------------------------------------------------------------- partitioners


@dataclass
class Outcome:
    """One partitioner's answer: the bottleneck of its split, or why there is none."""

    bottleneck: int | None
    status: str = "ok"  # "ok", "empty part", "bad cover", "timeout", "error: ..."


class Timeout(Exception):
    """Raised by the alarm when a peer runs past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise Timeout in the (pure Python) code inside after ``seconds`` of wall time."""

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise Timeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def score_bounds(costs: Sequence[int], parts: int, bounds: Sequence[int]) -> Outcome:
    """Score the split with part j = costs[bounds[j]:bounds[j+1]]."""
    n = len(costs)
    if len(bounds) != parts + 1 or bounds[0] != 0 or bounds[-1] != n:
        return Outcome(None, "bad cover")
    if any(b <= a for a, b in zip(bounds, bounds[1:])):
        return Outcome(None, "empty part")
    prefix = [0, *itertools.accumulate(costs)]
    return Outcome(max(prefix[b] - prefix[a] for a, b in zip(bounds, bounds[1:])))


def run_pipecompile(costs: Sequence[int], parts: int) -> Outcome:
    starts = min_max_partition(list(costs), parts)
    return score_bounds(costs, parts, [*starts, len(costs)])


def run_general_solver(costs: Sequence[int], parts: int) -> Outcome:
    prefix = np.array([0, *itertools.accumulate(costs)], dtype=np.int64)
    solution = solve(Problem(work=(prefix,) * parts, cut=np.zeros(len(costs) + 1, np.int64)))
    assert solution is not None
    outcome = score_bounds(costs, parts, [*solution.starts, len(costs)])
    assert outcome.bottleneck == solution.bottleneck, (outcome, solution)
    return outcome


def load_torchgpipe() -> Callable[..., Any] | None:
    """torchgpipe.balance.blockpartition.solve, from the package or straight from its file."""
    try:
        from torchgpipe.balance.blockpartition import solve as tg_solve

        return tg_solve
    except Exception:  # old torchgpipe may fail to import with a new torch
        pass
    spec = importlib.util.find_spec("torchgpipe")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "balance" / "blockpartition.py"
    file_spec = importlib.util.spec_from_file_location("_tg_blockpartition", path)
    assert file_spec is not None and file_spec.loader is not None
    module = importlib.util.module_from_spec(file_spec)
    file_spec.loader.exec_module(module)
    return module.solve


def load_deepspeed() -> Callable[..., Any] | None:
    """deepspeed.runtime.utils.partition_balanced, or (if the package does not import here)
    the function and its helper compiled from the installed file's source."""
    try:
        with contextlib.redirect_stdout(sys.stderr):  # its logger (accelerator note) -> stderr
            from deepspeed.runtime.utils import partition_balanced

        return partition_balanced
    except Exception as error:
        print(f"note: import deepspeed.runtime.utils failed ({error!r})", file=sys.stderr)
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "runtime" / "utils.py"
    tree = ast.parse(path.read_text())
    wanted = {"partition_uniform", "partition_balanced", "prefix_sum_inc"}
    tree.body = [s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name in wanted]
    namespace: dict[str, Any] = {}
    exec(compile(tree, str(path), "exec"), namespace)
    return namespace["partition_balanced"]


def make_torchgpipe(tg_solve: Callable[..., Any], timeout: float) -> Callable[..., Outcome]:
    def run(costs: Sequence[int], parts: int) -> Outcome:
        # torchgpipe.balance.balance_cost: balance = [len(p) for p in solve(cost, partitions)]
        try:
            with time_limit(timeout):
                blocks = tg_solve(list(costs), parts)
        except Timeout:
            return Outcome(None, "timeout")
        except Exception as error:
            return Outcome(None, f"error: {type(error).__name__}")
        bounds = [0, *itertools.accumulate(len(b) for b in blocks)]
        return score_bounds(costs, parts, bounds)

    return run


def make_deepspeed(partition_balanced: Callable[..., Any]) -> Callable[..., Outcome]:
    def run(costs: Sequence[int], parts: int) -> Outcome:
        # PipelineModule._partition_layers: self.parts = partition_balanced(weights, num_stages)
        try:
            bounds = [int(b) for b in partition_balanced(list(costs), parts)]
        except Exception as error:
            return Outcome(None, f"error: {type(error).__name__}")
        return score_bounds(costs, parts, bounds)

    return run


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    dist: str
    costs: list[int]
    parts: int


def draw_costs(dist: str, rng: random.Random) -> list[int]:
    """One random cost vector of the given distribution (n in 2..200)."""
    if dist == "transformer":
        layers, d, s = rng.randint(1, 16), rng.choice([64, 128, 256]), rng.choice([16, 64, 256])
        block = [d, 3 * d * d, s * d, s, s * d, d * d, 0, d, 4 * d * d, 4 * d, 4 * d * d, 0]
        block = [c * s * 2 for c in block]  # x tokens, x 2 for multiply-add
        head = rng.choice([1000, 32000]) * d * s * 2
        return [0, *block * layers, d * s, head][: rng.randint(2, 200)]
    n = rng.randint(2, 200)
    if dist == "uniform":
        return [rng.randint(0, 1000) for _ in range(n)]
    if dist == "exponential":
        return [int(rng.expovariate(1 / 1000)) for _ in range(n)]
    if dist == "pareto":
        return [int(100 * rng.paretovariate(1.1)) for _ in range(n)]
    if dist == "huge-among-small":
        costs = [rng.randint(1, 20) for _ in range(n)]
        for i in rng.sample(range(n), min(n, rng.randint(1, 4))):
            costs[i] = rng.randint(10**4, 10**6)
        return costs
    if dist == "sparse":  # like real atom FLOPs: about half the atoms (views, adds) cost 0
        return [0 if rng.random() < 0.5 else int(rng.lognormvariate(12, 2)) for _ in range(n)]
    raise ValueError(dist)


def random_cases(per_dist: int, seed: int) -> list[Case]:
    cases = []
    for k, dist in enumerate(DISTRIBUTIONS):
        rng = random.Random(seed * 1000 + k)
        for _ in range(per_dist):
            costs = draw_costs(dist, rng)
            cases.append(Case(dist, costs, rng.randint(2, min(16, len(costs)))))
    return cases


def example_costs(name: str) -> list[int]:
    """Per-atom FLOP costs of ``examples/<name>.py``, as pipecompile's balancer sees them."""
    from pipecompile.frontend.tracer import trace
    from pipecompile.ir.graph.microbatch import split_microbatches
    from pipecompile.ir.graph.node_info import info
    from pipecompile.model.model_file import load_model_file
    from pipecompile.passes import annotate_costs
    from pipecompile.passes.balance_stages import _atoms, compute_nodes

    spec = load_model_file(str(EXAMPLES / f"{name}.py"))
    micro = split_microbatches(spec.inputs, 1)[0]
    traced = trace(spec.model, micro)
    annotated = annotate_costs(traced.module, root=traced.root)
    atoms = _atoms(list(compute_nodes(annotated.graph)))
    return [int(sum(info(n).flops for n in atom)) for atom in atoms]


# --------------------------------------------------------------------------- reporting


@dataclass
class Tally:
    optimal: int = 0
    valid: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    ratios: list[float] = field(default_factory=list)
    worst: tuple[float, Case | None] = (1.0, None)
    smallest: Case | None = None  # the shortest case it did not solve optimally
    seconds: float = 0.0

    def add(self, outcome: Outcome, optimum: int, case: Case) -> None:
        if outcome.bottleneck is None:
            self.failures[outcome.status] = self.failures.get(outcome.status, 0) + 1
            return
        self.valid += 1
        self.optimal += outcome.bottleneck == optimum
        ratio = outcome.bottleneck / optimum if optimum else 1.0
        self.ratios.append(ratio)
        if ratio > self.worst[0]:
            self.worst = (ratio, case)
        if outcome.bottleneck != optimum and (
            self.smallest is None or len(case.costs) < len(self.smallest.costs)
        ):
            self.smallest = case


def ratio_text(outcome: Outcome, optimum: int) -> str:
    if outcome.bottleneck is None:
        return outcome.status
    ratio = outcome.bottleneck / optimum if optimum else 1.0
    return f"{ratio:.3f}" + ("" if outcome.bottleneck == optimum else " ✗")


def peer_versions() -> list[str]:
    """numpy's and the installed peers' versions, for the machine line."""
    versions = [f"numpy {np.__version__}"]
    for package in ("torchgpipe", "deepspeed"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions.append(f"{package} {importlib.metadata.version(package)}")
    return versions


# --------------------------------------------------------------------------- sections


def section_random(partitioners: dict[str, Callable[..., Outcome]], per_dist: int) -> None:
    cases = random_cases(per_dist, seed=5)
    tallies = {name: Tally() for name in partitioners}
    by_dist = {(name, d): Tally() for name in partitioners for d in DISTRIBUTIONS}
    for case in cases:
        optimum = optimum_dp(case.costs, case.parts)
        assert optimum == optimum_bisect(case.costs, case.parts), case
        for name, run in partitioners.items():
            seconds, outcome = timed(run, case.costs, case.parts)
            tallies[name].seconds += seconds
            tallies[name].add(outcome, optimum, case)
            by_dist[name, case.dist].add(outcome, optimum, case)
            if name.startswith("pipecompile"):
                assert outcome.bottleneck == optimum, (name, case, outcome, optimum)
    sizes = [len(c.costs) for c in cases]
    print(f"\n### Random cost vectors ({len(cases)} cases)\n")
    print(
        f"{per_dist} cases each of {', '.join(DISTRIBUTIONS)}; n = {min(sizes)}..{max(sizes)} "
        f"(median {statistics.median(sizes):.0f}), parts = 2..min(16, n). Ratio = bottleneck / "
        "exact optimum (DP), over the cases where the partitioner returned a usable split.\n"
    )
    print(
        "| partitioner | optimal | usable split | no usable split | mean ratio | worst ratio "
        "| total time (s) |"
    )
    print("|---|---:|---:|---|---:|---:|---:|")
    for name, t in tallies.items():
        failures = ", ".join(f"{k}: {v}" for k, v in sorted(t.failures.items())) or "0"
        mean = statistics.fmean(t.ratios) if t.ratios else math.nan
        print(
            f"| {name} | {t.optimal}/{len(cases)} | {t.valid}/{len(cases)} | {failures} "
            f"| {mean:.3f} | {t.worst[0]:.3f} | {t.seconds:.2f} |"
        )
    print("\nOptimal / usable per distribution (mean ratio over usable):\n")
    print("| distribution | " + " | ".join(partitioners) + " |")
    print("|---|" + "---:|" * len(partitioners))
    for d in DISTRIBUTIONS:
        count = sum(c.dist == d for c in cases)
        cells = []
        for name in partitioners:
            t = by_dist[name, d]
            mean = statistics.fmean(t.ratios) if t.ratios else math.nan
            cells.append(f"{t.optimal}/{t.valid} ({mean:.3f})")
        print(f"| {d} ({count}) | " + " | ".join(cells) + " |")
    for name, t in tallies.items():
        ratio, case = t.worst
        if case is not None:
            print(
                f"\nWorst case for {name}: ratio {ratio:.3f} ({case.dist}, n={len(case.costs)}, "
                f"parts={case.parts})."
            )
        if t.smallest is not None:
            case = t.smallest
            print(
                f"Shortest non-optimal case for {name} ({case.dist}): parts={case.parts}, "
                f"costs={case.costs}, optimum {optimum_dp(case.costs, case.parts)}."
            )


def section_examples(
    partitioners: dict[str, Callable[..., Outcome]], examples: Sequence[str]
) -> None:
    print("\n### Example models: real per-atom FLOP costs\n")
    print("Cells: bottleneck / optimum (✗ = not optimal).\n")
    names = list(partitioners)
    print("| example | atoms (zero-cost) | stages | optimum (FLOPs) | " + " | ".join(names) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(names))
    for example in examples:
        try:
            costs = example_costs(example)
        except Exception as error:  # e.g. transformers missing
            print(f"| {example} | — | — | — | skipped: {error!r} |")
            continue
        zeros = sum(c == 0 for c in costs)
        for stages in (2, 4, 8):
            if stages > len(costs):
                print(f"| {example} | {len(costs)} ({zeros}) | {stages} | too few atoms |")
                continue
            optimum = optimum_dp(costs, stages)
            cells = []
            for name, run in partitioners.items():
                outcome = run(costs, stages)
                if name.startswith("pipecompile"):
                    assert outcome.bottleneck == optimum, (example, stages, name, outcome)
                cells.append(ratio_text(outcome, optimum))
            print(
                f"| {example} | {len(costs)} ({zeros}) | {stages} | {optimum:,} | "
                + " | ".join(cells)
                + " |"
            )


def section_timing(
    partitioners: dict[str, Callable[..., Outcome]],
    raw: dict[str, Callable[..., Any]],
    nodes: int,
    repeats: int,
    cap: float,
) -> None:
    if "torchgpipe" in raw:  # the same call, with the large-input cap as its time limit
        partitioners = {**partitioners, "torchgpipe": make_torchgpipe(raw["torchgpipe"], cap)}
    rows, notes = [], []
    for stages in (8, 16):
        rng = random.Random(stages)
        costs = flop_like(nodes, rng)
        optimum = optimum_bisect(costs, stages)
        for name, run in partitioners.items():
            if name == "DeepSpeed":
                small = min(400, nodes // 4)  # 400 unless the nodes are few (--quick)
                seconds, _ = timed(raw["DeepSpeed"], flop_like(small, rng), stages)
                predicted = seconds * (nodes / small) ** 2
                notes.append(
                    f"DeepSpeed `partition_balanced`, {small} nodes, {stages} stages: "
                    f"{seconds:.2f} s; its DP is O(n^2 k) in Python loops, so x ({nodes}/{small})^2"
                    f" predicts {predicted:,.0f} s ({predicted / 60:,.0f} min) at {nodes:,} nodes."
                )
                if predicted > cap:
                    rows.append(
                        f"| {name} | {stages} | not run (~{predicted:,.0f} s predicted) | — |"
                    )
                    continue
            times, outcome = [], Outcome(None, "not run")
            for _ in range(repeats):
                seconds, outcome = timed(run, costs, stages)
                times.append(seconds)
                if outcome.status == "timeout" or seconds > cap:
                    break
            if outcome.status == "timeout":
                text = f"no result in {cap:.0f} s"
            else:
                text = f"{statistics.median(times) * 1000:,.1f} ms"
            if name.startswith("pipecompile"):
                assert outcome.bottleneck == optimum, (name, stages, outcome, optimum)
            rows.append(f"| {name} | {stages} | {text} | {ratio_text(outcome, optimum)} |")
    print(f"\n### Partition time, {nodes:,} nodes\n")
    print(
        "Costs as in tools/bench/balance.py (each node 0, up to 1e6, or 1e8..1e10 FLOPs; seeded); "
        f"median of {repeats} calls, each from the cost list to the split; optimum by bisection. "
        f"A peer predicted to need more than {cap:.0f} s is not run.\n"
    )
    for note in notes:
        print(note + "\n")
    print("| partitioner | stages | median time | bottleneck / optimum |")
    print("|---|---:|---:|---:|")
    for row in rows:
        print(row)


def flop_like(nodes: int, rng: random.Random) -> list[int]:
    """FLOP-like node costs: a third zero, a third small, a third large."""
    return [
        rng.choice([0, rng.randint(1, 10**6), rng.randint(10**8, 10**10)]) for _ in range(nodes)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-dist", type=int, default=55, help="random cases per distribution")
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cap", type=float, default=60.0, help="seconds a peer may take")
    parser.add_argument("--peer-timeout", type=float, default=2.0, help="seconds per small case")
    parser.add_argument("--skip-examples", action="store_true")
    parser.add_argument("--examples", nargs="+", default=list(EXAMPLE_NAMES), choices=EXAMPLE_NAMES)
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    if parser.parse_known_args()[0].quick:  # smaller defaults; options given still count
        parser.set_defaults(per_dist=2, nodes=200, repeats=1, examples=["mlp"])
    args = parser.parse_args()

    partitioners: dict[str, Callable[..., Outcome]] = {
        "pipecompile": run_pipecompile,
        "pipecompile general solver": run_general_solver,
    }
    raw: dict[str, Callable[..., Any]] = {}
    notes = []
    tg_solve = load_torchgpipe()
    if tg_solve is None:
        notes.append("torchgpipe not installed (pip install torchgpipe): column skipped.")
    else:
        raw["torchgpipe"] = tg_solve
        partitioners["torchgpipe"] = make_torchgpipe(tg_solve, args.peer_timeout)
    ds_balanced = load_deepspeed()
    if ds_balanced is None:
        notes.append(
            "DeepSpeed not installed (DS_BUILD_OPS=0 pip install deepspeed): column skipped."
        )
    else:
        raw["DeepSpeed"] = ds_balanced
        partitioners["DeepSpeed"] = make_deepspeed(ds_balanced)

    start = time.perf_counter()
    print("## Partitioners: pipecompile vs torchgpipe and DeepSpeed\n")
    for line in [f"Machine: {machine(*peer_versions())}.", *notes]:
        print(line)
    print(f"Command: `{command()}`")
    print(
        "\nColumns: pipecompile = `min_max_partition`; general solver = `partition_search.solve` "
        "with zero communication; torchgpipe = `balance.blockpartition.solve` (the split "
        "`balance_cost` takes: block lengths); DeepSpeed = `runtime.utils.partition_balanced` "
        "(boundaries). torchgpipe gets at most "
        f"{args.peer_timeout:g} s per small case (then: timeout)."
    )
    section_random(partitioners, args.per_dist)
    if not args.skip_examples:
        section_examples(partitioners, args.examples)
    section_timing(partitioners, raw, args.nodes, args.repeats, args.cap)
    print(f"\nTotal run time: {time.perf_counter() - start:.0f} s.")


if __name__ == "__main__":
    main()
