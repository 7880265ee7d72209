"""Benchmark a graph plan against chain plans on two equal towers: pipecompile's graph plan,
its best chain plan, and torch.distributed.pipelining over that chain's stages.

examples/two_towers.py's model (two towers of 4 Linear+ReLU layers of width 1024 and a
projection, joined by a dot product) on a mini-batch of 512 rather than the example's 32: a
step long enough to time steadily, and micro-batches of 256 rows, which a CPU multiplies
nearly as efficiently per row as the whole batch (a model file this script writes to a
temporary folder imports the example's class). For M = 1 and 2 micro-batches, on 2 processes
(gloo, CPU, one thread each), three systems train it:

- **graph**: ``pipecompile MODEL --stages 2 --microbatches M``, the default compile, whose
  plan may be a stage graph (the two towers on different devices, running at the same time;
  a stage that only hands the inputs on, several stages a device), on pipecompile's
  distributed backend;
- **chain**: the same compile with ``--chain`` (the best chain of 2 stages), same backend;
- **pipelining**: torch.distributed.pipelining's ScheduleGPipe over PipelineStage wrappers of
  the chain's stage modules (tools/bench/distributed.py's ``Passing``).

One torchrun per M: both ranks load the three, then steps alternate between them; a step's
time is the slowest rank's, and each system's figure is the median of its timed steps, with
their min-max and interquartile range. Every step zeroes its gradients; none runs an
optimizer. Each plan's shape is printed too: "graph" where a value crosses from a stage to
one other than the next (from the manifest's edges), with the field the manifest itself
declares, if any.

Also reported: the plan pipecompile's plan search picks unprompted,
``pipecompile MODEL --devices 2`` on the timed model (its own file, mini-batch included):
stages, schedule, micro-batches, shape and stage -> device map.

The figures come from a 2-core CPU machine (the script prints which). Rerun with::

    python tools/bench/graph_plans.py                         # the table, about a minute
    python tools/bench/graph_plans.py --json /tmp/plans.json  # also the raw numbers
    python tools/bench/graph_plans.py --quick                 # tiny towers, M = 1, one timed
                                                              # step: every path in seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from common import (
    EXAMPLES,
    announce,
    command,
    log,
    machine,
    pipecompile_done,
    torchrun_options,
)
from distributed import alternate, passing, pipelining_step, rank_pipeline
from forked import run_ranks

from pipecompile.model.model_file import load_model_file

WAIT_S = 600  # the most one torchrun of the full benchmark may take
PROCS = 2
SYSTEMS = ("graph", "chain", "pipelining")
MODEL = '''"""examples/two_towers.py's TwoTowers at the benchmark's sizes."""

import sys

import torch

sys.path.insert(0, {examples!r})
from two_towers import IN_FEATURES, TwoTowers, loss_fn  # noqa: E402,F401

WIDTH, DEPTH, BATCH = {width}, {depth}, {batch}


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return TwoTowers(width=WIDTH, depth=DEPTH).train()


def example_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return {{
        "user": torch.randn(BATCH, IN_FEATURES, generator=g),
        "item": torch.randn(BATCH, IN_FEATURES, generator=g),
    }}


def example_targets() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(5678)
    return (torch.randn(BATCH, generator=g),)
'''


@dataclass(frozen=True)
class Sizes:
    """The towers (width, Linear+ReLU layers each), the mini-batch, the micro-batch counts."""

    width: int = 1024
    depth: int = 4
    batch: int = 512
    micro: tuple[int, ...] = (1, 2)


QUICK = Sizes(width=16, depth=1, batch=8, micro=(1,))


def write_model(root: Path, sizes: Sizes) -> Path:
    """The model file of ``sizes`` in ``root``."""
    path = root / "model.py"
    text = MODEL.format(examples=str(EXAMPLES), width=sizes.width, depth=sizes.depth,
                        batch=sizes.batch)  # fmt: skip
    path.write_text(text)
    return path


def compile_both(model: Path, micro: int, root: Path) -> None:
    """``root``/graph (the default compile) and ``root``/chain (``--chain``) of ``model``,
    2 stages, ``micro`` micro-batches."""
    common = [str(model), "--stages", str(PROCS), "--microbatches", str(micro), "-q"]
    pipecompile_done(*common, "-o", str(root / "graph"))
    pipecompile_done(*common, "--chain", "-o", str(root / "chain"))


def plan_of(directory: Path) -> dict:
    """What ``directory``'s manifest and program say of its plan: stages, schedule,
    micro-batches, the stage -> device map, the shape its edges make ("graph" where a value
    crosses from a stage to one other than the next, else "chain") and the one the manifest
    declares (``balance.shape``)."""
    from pipecompile.runtime.load import read_program

    raw = json.loads((directory / "manifest.json").read_text())
    program = read_program(directory / raw["program"])
    declared = (raw.get("balance") or {}).get("shape")
    forward = all(e["dst"] == e["src"] + 1 for e in raw["edges"])
    return {
        "stages": len(raw["stages"]),
        "schedule": raw["schedule"],
        "microbatches": raw["microbatches"],
        "stage_device": list(program.stage_device),
        "shape": "chain" if forward else "graph",
        "declared_shape": declared,
    }


def spread(times: list[float]) -> dict[str, object]:
    """The median of ``times``, their min, max and quartiles, and the times themselves."""
    q1, _, q3 = statistics.quantiles(times, n=4) if len(times) > 1 else (times * 3)
    return {"median": statistics.median(times), "min": min(times), "max": max(times),
            "q1": q1, "q3": q3, "times": times}  # fmt: skip


def per_turn(figures: dict[str, dict], other: str) -> float:
    """The median over the turns of the graph step's time over ``other``'s in the same turn."""
    pairs = zip(figures["graph"]["times"], figures[other]["times"])
    return statistics.median(g / o for g, o in pairs)


def worker(args: argparse.Namespace) -> None:
    """One rank: the three systems of one M, their steps taking turns."""
    directory = Path(args.directory)
    model = load_model_file(str(directory.parent / "model.py")).module
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    given = model.example_inputs()
    (target,) = model.example_targets()
    runs = {
        "graph": pipecompile_run(directory / "graph", given, target, model.loss_fn),
        "chain": pipecompile_run(directory / "chain", given, target, model.loss_fn),
        "pipelining": pipelining_run(directory / "chain", given, target, model.loss_fn),
    }
    result = alternate(runs, args.warmup, args.repeats, summary=spread)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def pipecompile_run(
    directory: Path, given: dict[str, torch.Tensor], target: torch.Tensor, loss: Callable
) -> Callable[[], None]:
    """pipecompile's training step on its distributed backend, this rank holding every stage
    the program places on its device (a graph plan may place several on one)."""
    from pipecompile.runtime.load import read_manifest

    manifest = read_manifest(directory)
    pipe, _ = rank_pipeline(directory, manifest, None, dist.get_rank())

    def run() -> None:
        pipe.train_step(given, (target,), loss)

    return run


def pipelining_run(
    directory: Path, given: dict[str, torch.Tensor], target: torch.Tensor, loss: Callable
) -> Callable[[], None]:
    """torch.distributed.pipelining's ScheduleGPipe step over a PipelineStage wrapper of this
    rank's stage of the chain in ``directory``."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from pipecompile.runtime.load import load_stage, read_manifest

    rank, world = dist.get_rank(), dist.get_world_size()
    manifest = read_manifest(directory)
    if len(manifest.stages) != world:
        raise SystemExit(f"{directory}: {len(manifest.stages)} stages, not a chain of {world}")
    wrapped = passing(manifest, load_stage(directory, manifest.stages[rank]), rank)
    stage = PipelineStage(wrapped, rank, world, torch.device("cpu"))
    steps = ScheduleGPipe(stage, n_microbatches=manifest.microbatches, loss_fn=loss)
    inputs = tuple(given[name] for name in manifest.inputs)

    def run() -> None:
        pipelining_step(steps, rank, world, inputs, target)
        wrapped.zero_grad(set_to_none=True)

    return run


def torchrun(directory: Path, args: argparse.Namespace) -> dict[str, dict]:
    """The ranks' turns over ``directory``'s plans; rank 0's figures per system."""
    options = ["--directory", str(directory), "--warmup", str(args.warmup)]
    result = run_ranks(PROCS, __file__, "--worker", *options, "--repeats", str(args.repeats),
                       timeout=WAIT_S)  # fmt: skip
    found = [json.loads(ln[7:]) for ln in result.stdout.splitlines() if ln.startswith("RESULT ")]
    if result.returncode or len(found) != 1:
        raise SystemExit(result.stdout[-3000:] + result.stderr[-3000:])
    return found[0]


def searched(model: Path, root: Path) -> dict:
    """The plan pipecompile's plan search picks for ``model`` on 2 devices, and the plans it
    ranked best (its table: devices used, stages, shape, schedule, micro-batches, step)."""
    pipecompile_done(str(model), "--devices", str(PROCS), "-q", "-o", str(root))
    record = json.loads((root / "manifest.json").read_text())["plan"]
    ranked = [
        {key: row.get(key) for key in ("devices_used", "stages", "schedule", "microbatches",
                                       "predicted_step_s")} | {"graph": bool(row.get("graph"))}
        for row in [record, *record.get("runners_up", [])]
    ]  # fmt: skip
    return plan_of(root) | {"ranked": ranked}


def ranked_lines(chosen: dict) -> list[str]:
    """The search's best plans, one a line."""
    return [
        f"  {r['devices_used']} device(s), {r['stages']} stages"
        + (" (a stage graph)" if r["graph"] else "")
        + f", {r['schedule']}, {r['microbatches']} micro-batch(es): "
        f"{r['predicted_step_s'] * 1e3:.1f} ms predicted"
        for r in chosen["ranked"]
    ]


def described(plan: dict) -> str:
    """A plan in a line: its stages, schedule, micro-batches, shape and stage -> device map."""
    declared = plan["declared_shape"]
    said = f"shape {declared}" if declared is not None else "shape: unknown (no manifest field)"
    devices = " ".join(map(str, plan["stage_device"]))
    return (f"{plan['stages']} stages, {plan['schedule']}, {plan['microbatches']} "
            f"micro-batch(es), {said}, edges make a {plan['shape']}, stage -> device: "
            f"{devices}")  # fmt: skip


def timing(figures: dict) -> str:
    """A system's median step, its min-max and interquartile range, in a table's cell."""
    return (f"{figures['median'] * 1e3:.1f} ({figures['min'] * 1e3:.1f}-"
            f"{figures['max'] * 1e3:.1f}; IQR {figures['q1'] * 1e3:.1f}-"
            f"{figures['q3'] * 1e3:.1f})")  # fmt: skip


def measure(root: Path, sizes: Sizes, args: argparse.Namespace) -> dict:
    """Compile each M's plans, time them, print the table; every figure, for --json."""
    model = write_model(root, sizes)
    rows, plans = [], {}
    for micro in sizes.micro:
        log(f"compiling M = {micro} (graph, chain) ...")
        compile_both(model, micro, root / f"m{micro}")
        plans[micro] = {s: plan_of(root / f"m{micro}" / s) for s in ("graph", "chain")}
    for micro in sizes.micro:
        log(f"timing M = {micro} ...")
        figures = torchrun(root / f"m{micro}", args)
        graph, chain, theirs = (figures[s]["median"] for s in SYSTEMS)
        rows.append({"microbatches": micro, **figures, "graph_over_chain": graph / chain,
                     "graph_over_pipelining": graph / theirs,
                     "turns_graph_over_chain": per_turn(figures, "chain"),
                     "turns_graph_over_pipelining": per_turn(figures, "pipelining")})  # fmt: skip
    print("\nstep times in ms: median (min-max; IQR) of the slowest rank's, "
          f"{args.repeats} timed steps after {args.warmup} untimed\n")  # fmt: skip
    print("| M | graph step | chain step | pipelining step | graph/chain | graph/pipelining |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['microbatches']} | {timing(r['graph'])} | {timing(r['chain'])} "
              f"| {timing(r['pipelining'])} | {r['graph_over_chain']:.2f} "
              f"| {r['graph_over_pipelining']:.2f} |")  # fmt: skip
    print("\nthe median of each turn's ratio (the three steps taken one after another, so a "
          "slow spell of the machine slows all three):")  # fmt: skip
    for r in rows:
        print(f"M = {r['microbatches']}: graph/chain {r['turns_graph_over_chain']:.2f}, "
              f"graph/pipelining {r['turns_graph_over_pipelining']:.2f}")  # fmt: skip
    print()
    for micro, each in plans.items():
        for system, plan in each.items():
            print(f"M = {micro}, {system} plan: {described(plan)}")
        if each["graph"]["shape"] == "chain":
            print(f"note: at M = {micro} the default compile gave a chain, so the graph "
                  "column times a chain too")  # fmt: skip
    return {"rows": rows, "plans": {str(m): p for m, p in plans.items()}}


def main() -> None:
    args = torchrun_options(__doc__.splitlines()[0], "tiny towers, M = 1", 25, json=True)
    if args.worker:
        worker(args)
        return
    sizes = QUICK if args.quick else Sizes()
    announce()
    print(f"model: TwoTowers(width={sizes.width}, depth={sizes.depth}), mini-batch "
          f"{sizes.batch}, {PROCS} processes (one thread each), gloo, CPU")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        results = measure(root, sizes, args)
        # the plan search on the timed model itself: does it choose the graph unprompted?
        model = root / "model.py"
        log(f"searching plans of {model.name} on {PROCS} devices ...")
        chosen = searched(model, root / "searched")
    shown = f"the timed towers' model file ({sizes.batch} rows)"
    print(f"\nplan search, `pipecompile {shown} --devices {PROCS}`: {described(chosen)}")
    print("its best plans:")
    print("\n".join(ranked_lines(chosen)))
    if args.json:
        record = {"machine": machine(), "command": command(), "sizes": asdict(sizes),
                  "warmup": args.warmup, "repeats": args.repeats, **results,
                  "searched": chosen}  # fmt: skip
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
