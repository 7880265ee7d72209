"""How good are the balancer's predictions and splits? Predicted vs measured stage times, and
step times of time-, flops- and params-balanced splits.

For every example model, compile to ``--stages`` stages with each cost source (``--balance
time`` profiles every op on this machine first) and links assumed free (one process has no
communication to predict), then run ``--steps`` training steps on the local backend after
two warm-ups. Reported:

1. ``--balance time``: each stage's predicted forward + backward time per micro-batch (the
   sum of its ops' profiled times) against the time the runtime measured for that stage's
   F and B instructions (the fastest of the steps, as the profile keeps each op's fastest).
2. For each cost source: the pipelined step time those measured stage times give on one
   device per stage (the schedule simulated with the measured forward and backward times),
   and the slowest stage.
3. With ``--nproc``: the same splits for 2 stages run for real on 2 gloo processes (one
   thread each), slowest rank's step time, median over the steps.

Rerun with ``python tools/bench/balance_quality.py`` (add ``--nproc`` for part 3;
``--quick``: the MLP, 2 stages, one step, ``--balance time`` only, part 3 included).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from common import EXAMPLES, command, machine, pipecompile_command

EXAMPLE_NAMES = ["mlp", "resnet", "gpt", "two_towers", "hf_gpt2", "hf_bert", "hf_llama"]
COSTS = ("time", "flops", "params")


def compile_to(name: str, cost: str, stages: int, micro: int, directory: Path) -> None:
    from pipecompile.codegen.emit import ModelRef, emit
    from pipecompile.compiler import compile_model
    from pipecompile.ir.programs.cost_model import CostModel
    from pipecompile.model.model_file import load_model_file

    path = EXAMPLES / f"{name}.py"
    spec = load_model_file(str(path))
    compiled = compile_model(
        spec.model, spec.inputs, stages=stages, microbatches=micro, balance=cost,
        machine=CostModel(bandwidth=math.inf),
    )  # fmt: skip
    emit(compiled, directory, model=ModelRef(path, "build_model", f"{path.name}:build_model"))


def measure(directory: Path, steps: int) -> tuple[list[float], list[float], list[float]]:
    """Fastest forward and backward ns per micro-batch per stage, and predicted compute ns."""
    from pipecompile.model.model_file import recorded_model
    from pipecompile.runtime.load import read_manifest
    from pipecompile.runtime.pipeline import Pipeline

    manifest = read_manifest(directory)
    spec = recorded_model(None, directory, manifest)
    pipe = Pipeline.load(directory)
    pipe.set_optimizer(lambda ps: torch.optim.SGD(ps, lr=1e-4))
    m = pipe.program.microbatches
    forward: list[list[float]] = []
    backward: list[list[float]] = []
    for step in range(steps + 2):
        pipe.train_step(spec.inputs, spec.targets, spec.loss_fn)
        stats = pipe.last.stats
        assert stats is not None
        if step >= 2:
            forward.append([stats.forward_ns[j] / m for j in sorted(stats.forward_ns)])
            backward.append([stats.backward_ns[j] / m for j in sorted(stats.backward_ns)])
    balance = manifest.balance
    assert balance is not None and balance.stage_compute is not None
    return (
        [min(col) for col in zip(*forward)],  # noise only adds time: the fastest step
        [min(col) for col in zip(*backward)],
        [float(x) for x in balance.stage_compute],
    )


def pipelined_step(directory: Path, forward: list[float], backward: list[float]) -> float:
    """The simulated step time (ns) of the program with the measured stage times."""
    from pipecompile.ir.programs.simulate import Costs, simulate
    from pipecompile.ir.programs.topology import topology_from_manifest
    from pipecompile.runtime.load import read_manifest, read_program

    manifest = read_manifest(directory)
    program = read_program(directory / manifest.program)
    costs = Costs(tuple(forward), tuple(backward))
    return simulate(program, topology_from_manifest(manifest), costs).makespan


def distributed_step(directory: Path, steps: int) -> float:
    """Median step time (ms) of a real 2-process gloo run, one thread per process."""
    env = {"OMP_NUM_THREADS": "1", "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"}
    run = pipecompile_command("run", str(directory), "--nproc", "2", "--steps", str(steps + 2))
    run += ["--optimizer", "sgd", "--lr", "1e-4"]
    result = subprocess.run(run, capture_output=True, text=True, env=env, check=True, timeout=600)
    times = [float(t) for t in re.findall(r"\(([0-9.]+) ms\)", result.stdout)][2:]
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--examples", default=",".join(EXAMPLE_NAMES))
    parser.add_argument("--nproc", action="store_true", help="also time 2 stages on 2 ranks")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--costs", default=",".join(COSTS), help="cost sources to compare")
    parser.add_argument("--quick", action="store_true", help="the MLP, 2 stages, one step")
    if parser.parse_known_args()[0].quick:  # smaller defaults; options given still count
        parser.set_defaults(examples="mlp", stages=2, steps=1, nproc=True, costs="time")
    args = parser.parse_args()
    args.costs = args.costs.split(",")
    torch.set_num_threads(args.threads)  # one thread: far steadier timings on a small machine
    print(f"machine: {machine()}")
    print(f"command: {command()}\n")
    names = args.examples.split(",")
    with tempfile.TemporaryDirectory() as cache:  # profile afresh: no timings from other runs
        os.environ["XDG_CACHE_HOME"] = cache
        run(args, names)


def run(args: argparse.Namespace, names: list[str]) -> None:
    errors: dict[str, list[float]] = {}
    steps: dict[str, dict[str, tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            steps[name] = {}
            for cost in args.costs:
                directory = Path(tmp) / f"{name}-{cost}"
                compile_to(name, cost, args.stages, args.microbatches, directory)
                fwd, bwd, predicted = measure(directory, args.steps)
                measured = [f + b for f, b in zip(fwd, bwd)]
                if cost == "time":
                    errors[name] = [100 * (p / x - 1) for p, x in zip(predicted, measured)]
                    print(f"{name}: predicted/measured us per micro-batch: " + ", ".join(
                        f"{p / 1e3:.0f}/{x / 1e3:.0f}" for p, x in zip(predicted, measured)
                    ), flush=True)  # fmt: skip
                steps[name][cost] = (pipelined_step(directory, fwd, bwd), max(measured))
        print("\n| example | stage error, predicted vs measured (%) | largest |")
        print("|---|---|---:|")
        for name, errs in errors.items():
            worst = max(abs(e) for e in errs)
            print(f"| {name} | {', '.join(f'{e:+.1f}' for e in errs)} | {worst:.1f} |")
        costs = " / ".join(args.costs)
        print(f"\n| example | pipelined step (ms) {costs} | slowest stage (ms) {costs} |\n"
              "|---|---|---|")  # fmt: skip
        for name, row in steps.items():
            step = " / ".join(f"{row[c][0] / 1e6:.2f}" for c in args.costs)
            slow = " / ".join(f"{row[c][1] / 1e6:.2f}" for c in args.costs)
            print(f"| {name} | {step} | {slow} |")
        if args.nproc:
            print(f"\n| example | 2 ranks, measured step (ms) {costs} |\n|---|---|")
            for name in names:
                cells = []
                for cost in args.costs:
                    directory = Path(tmp) / f"{name}-{cost}-2"
                    compile_to(name, cost, 2, args.microbatches, directory)
                    cells.append(f"{distributed_step(directory, args.steps):.1f}")
                print(f"| {name} | {' / '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
