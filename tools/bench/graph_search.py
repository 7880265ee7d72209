"""Benchmark the plan search on stage graphs against the search on chains alone.

For each model and device count the search runs twice on the same facts and cost model: once
pricing chains only (`--chain`), once pricing every plan of one stage a device also as a stage
graph (the default). Reported: both searches' seconds and their ratio (goal: at most 2x), the
plans predicted, the parallel blocks the graph search found, and the plan each chose. The
models: examples/two_towers.py with wide towers, examples/clip.py (two encoders), a 32-layer GPT,
an 8-layer MLP, and, not under --quick, a 200-layer GPT. The cost model is the default one for
every rank count (no calibration: the figures do not depend on this machine's load); each
search is the fastest of three runs. Exactness on graphs is tests/balance/
test_graph_partition.py's (every assignment of small graphs, brute force). Rerun with::

    python tools/bench/graph_search.py          # docs/BENCHMARKS.md's table
    python tools/bench/graph_search.py --quick  # two small models on 2 devices
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import torch
from common import machine, use_examples

use_examples()


def models(quick: bool) -> list[tuple[str, torch.nn.Module, dict[str, torch.Tensor]]]:
    """(label, model, one batch of its inputs), built from the examples."""
    import clip
    import two_towers
    from gpt import build_gpt

    g = torch.Generator().manual_seed(0)
    width, depth = (64, 2) if quick else (1024, 8)
    found = [
        (
            f"two towers ({depth} layers of {width} each)",
            two_towers.TwoTowers(width=width, depth=depth),
            {"user": torch.randn(32, 128, generator=g), "item": torch.randn(32, 128, generator=g)},
        ),
        ("CLIP (examples/clip.py)", clip.build_model(), clip.example_inputs()),
    ]
    if quick:
        return found
    found += [
        (
            "GPT 32 layers",
            build_gpt(n_layer=32, n_embd=128, n_head=4, block_size=64),
            {"idx": torch.randint(0, 128, (32, 64), generator=g)},
        ),
        (
            "MLP 8 layers",
            torch.nn.Sequential(
                *(m for _ in range(8) for m in (torch.nn.Linear(256, 256), torch.nn.ReLU()))
            ),
            {"input": torch.randn(32, 256, generator=g)},
        ),
        (
            "GPT 200 layers",
            build_gpt(n_layer=200, n_embd=64, n_head=2, block_size=32),
            {"idx": torch.randint(0, 128, (32, 32), generator=g)},
        ),
    ]
    return found


def fastest(run, repeats: int):  # type: ignore[no-untyped-def]
    """``run()``'s result and its fastest wall time of ``repeats``."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return result, best


def searched(facts, batch: int, space, cost, shapes: tuple[str, ...]):  # type: ignore[no-untyped-def]
    """The search of ``space`` pricing plans of ``shapes`` only."""
    from dataclasses import replace

    from pipecompile.planner.search import search

    return search(facts, batch=batch, space=replace(space, shapes=shapes), machine=cost, keep=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two small models, 2 devices")
    args = parser.parse_args()

    from pipecompile.balance.fork_join import fork_joins
    from pipecompile.frontend.tracer import trace
    from pipecompile.ir.programs.cost_model import CostModel
    from pipecompile.passes import annotate_costs
    from pipecompile.planner.model_facts import model_facts
    from pipecompile.planner.rank_models import RankModels
    from pipecompile.planner.search import Space

    devices = (2,) if args.quick else (2, 4, 8)
    repeats = 1 if args.quick else 3
    print(f"machine: {machine()}\n")
    print(
        "| model | atoms | blocks | devices | chains: search | plans | chains and graphs: "
        "search | plans | ratio | chosen |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    worst = 0.0
    for label, model, inputs in models(args.quick):
        batch = next(iter(inputs.values())).shape[0]
        traced = trace(model, inputs)
        facts = model_facts(annotate_costs(traced.module, root=traced.root), batch)
        blocks = len(fork_joins(facts.reads, [int(f) for f in facts.flops]))
        for count in devices:
            cost = RankModels.same(CostModel(), count)

            run = partial(searched, facts, batch, Space(devices=count), cost)
            chains, chain_s = fastest(partial(run, ("chain",)), repeats)
            both, both_s = fastest(partial(run, ("chain", "graph")), repeats)
            ratio = both_s / chain_s
            worst = max(worst, ratio)
            chosen = both.best.plan.flags
            row = [label, facts.atoms, blocks, count, f"{chain_s:.3f} s", chains.tried]
            row += [f"{both_s:.3f} s", both.tried, f"{ratio:.2f}x", f"`{chosen}`"]
            print("| " + " | ".join(map(str, row)) + " |", flush=True)
    print(f"\nworst ratio: {worst:.2f}x (goal: at most 2x)")


if __name__ == "__main__":
    main()
