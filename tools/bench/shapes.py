"""Benchmark batches of any shape: useful tokens/s training on windows of varying length,
unpadded (``--dynamic``), against the same windows padded to the longest, and what dynamic
dimensions cost a run whose batches all have the compiled shape.

Three parts. The first two each run in one 2-rank torchrun whose runs take turns step by step
(every rank builds each run's pipeline on the distributed backend, as `run --nproc 2` does; a
step's time is the slowest rank's):

1. **Varying lengths.** examples/char_lm_varlen.py (char_lm's GPT, 4 layers, n_embd 128,
   positions for 128), 2 stages, 4 micro-batches, 1f1b, batches of 16 windows of a length
   uniform in [16, 128]. Three runs see the same batches: pipecompile compiled with the file's
   ``dynamic_shapes()`` on them unpadded; pipecompile compiled for the fixed shape on them
   padded to 128 (targets -100, which the loss ignores); and torch.distributed.pipelining's
   Schedule1F1B over PipelineStage wrappers of the padded compile's stage modules on them
   padded (its stages take one shape). Useful tokens/s = the batches' real tokens over the
   summed step times.
2. **Fixed shapes.** examples/char_lm.py (16 x 64), compiled with and without ``--dynamic
   batch,seq``, on the same fixed-shape batches: the median step of each.
3. **Gradients at every shape, every synchronous schedule.** char_lm_varlen without dropout,
   compiled for 2 devices (2 stages; 4 in a loop or a V where the schedule places two a
   device) and 4 micro-batches: ``run --check --batch-shapes 16x128,7x40,5x17`` locally (the
   gradients' largest difference from eager at each shape, 7 rows splitting 2, 2, 2, 1) and
   with ``--nproc 2`` (from the local backend's).

Rerun with::

    python tools/bench/shapes.py            # the figures in docs/BENCHMARKS.md
    python tools/bench/shapes.py --quick    # a 1-layer model, one timed step of each, one
                                            # compile probed, and the local gradient check
                                            # of gpipe alone
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from common import (
    EXAMPLES,
    command,
    log,
    machine,
    pipecompile_command,
    pipecompile_done,
    run_checked,
    use_examples,
)
from distributed import Passing, alternate, live_sets, pipelining_step, rank_pipeline
from forked import run_ranks

from pipecompile.surfaces.cli import main as pipecompile

use_examples()

WAIT_S = 900
PADDED = '''"""char_lm_varlen's batches padded to its longest window: one shape for every batch."""
import sys

sys.path.insert(0, {examples!r})
from char_lm_varlen import (  # noqa: E402,F401
    build_model,
    example_inputs,
    example_targets,
    loss_fn,
    padded_train_batches as train_batches,
)
'''


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 1-layer model, one step")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--directory", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=None, help="steps of each run (default 30)")
    args = parser.parse_args()
    args.steps = args.steps or (1 if args.quick else 30)
    return args


def compile_all(root: Path, quick: bool) -> None:
    """The five compiles, 2 stages x 4 micro-batches, 1f1b (``--quick``: 1 layer)."""
    (root / "padded.py").write_text(PADDED.format(examples=str(EXAMPLES)))
    factory = ":build_model_1" if quick else ""
    if quick:  # a 1-layer twin of each model, in model files of their own
        for name in ("char_lm_varlen", "char_lm"):
            source = (EXAMPLES / f"{name}.py").read_text()
            extra = "\n\ndef build_model_1():\n    return build_char_gpt(n_layer=1"
            extra += ", block_size=LONGEST)\n" if name == "char_lm_varlen" else ")\n"
            (root / f"{name}.py").write_text(source + extra)
        source = (root / "padded.py").read_text().replace("build_model,", "build_model_1,")
        (root / "padded.py").write_text(source.replace(repr(str(EXAMPLES)), repr(str(root))))
    where = root if quick else EXAMPLES
    common = ["--stages", "2", "--microbatches", "4", "--schedule", "1f1b", "-q"]
    models = {
        "varying": (f"{where / 'char_lm_varlen.py'}{factory}", []),
        "padded": (f"{root / 'padded.py'}{':build_model_1' if quick else ''}", []),
        "fixed": (f"{where / 'char_lm.py'}{factory}", ["--dynamic", "none"]),
        "default": (f"{where / 'char_lm.py'}{factory}", []),
        "fixed-dynamic": (f"{where / 'char_lm.py'}{factory}", ["--dynamic", "batch,seq"]),
    }
    for name, (model, extra) in models.items():
        status = pipecompile([model, *common, *extra, "-o", str(root / name)])
        if status:
            raise SystemExit(f"compiling {model} exited {status}")


def _batches(source: object, steps: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches of ``source`` (a data hook's result), again and again."""
    while True:
        for k, ((idx,), (target,)) in enumerate(source):  # type: ignore[attr-defined]
            if k == steps:
                break
            yield idx, target


def ours(directory: Path, batches: Iterator) -> Callable[[], None]:
    """A pipecompile training step on the next batch (every rank reads it; the first stage's
    rank feeds the inputs, the last's the targets)."""
    from char_lm import loss_fn

    from pipecompile.runtime.load import load_stage, read_manifest

    rank = dist.get_rank()
    manifest = read_manifest(directory)
    module = load_stage(directory, manifest.stages[rank])
    pipe, _ = rank_pipeline(directory, manifest, module, rank)

    def run() -> None:
        idx, target = next(batches)
        pipe.train_step({"idx": idx}, (target,) if rank == 1 else None, loss_fn)
        module.zero_grad(set_to_none=True)

    return run


def theirs(directory: Path, batches: Iterator) -> Callable[[], None]:
    """torch.distributed.pipelining's 1F1B step over this rank's stage of ``directory``."""
    from char_lm import loss_fn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from pipecompile.runtime.load import load_stage, read_manifest

    rank, world = dist.get_rank(), dist.get_world_size()
    manifest = read_manifest(directory)
    module = load_stage(directory, manifest.stages[rank])
    sets = [[*manifest.inputs], *live_sets(manifest), []]
    entry = manifest.stages[rank]
    wrapped = Passing(module, list(entry.inputs), list(entry.outputs), sets[rank],
                      sets[rank + 1], rank == world - 1)  # fmt: skip
    stage = PipelineStage(wrapped, rank, world, torch.device("cpu"))
    steps = Schedule1F1B(stage, n_microbatches=manifest.microbatches, loss_fn=loss_fn)

    def run() -> None:
        idx, target = next(batches)
        pipelining_step(steps, rank, world, idx, target)
        wrapped.zero_grad(set_to_none=True)

    return run


def sizing_cost(directory: Path, repeats: int = 2000) -> float:
    """Microseconds a step spends sizing its messages from a batch under ``--dynamic``: the
    batch's sizes, each micro-batch's, and every edge's shape for each micro-batch."""
    import char_lm

    from pipecompile.runtime.load import read_manifest

    manifest = read_manifest(directory)
    dynamic, count = manifest.dynamic, manifest.microbatches
    (idx,), _ = next(iter(char_lm.train_batches()))
    start = time.perf_counter()
    for _ in range(repeats):
        sizes = dynamic.per_microbatch(dynamic.sizes_of({"idx": idx}), count)
        for edge in manifest.edges:
            for i in range(count):
                dynamic.shape_of(edge.value, edge.shape, sizes[i])
    return (time.perf_counter() - start) / repeats * 1e6


def probe_cost(quick: bool) -> tuple[float, float]:
    """Seconds the ``dynamic_dims`` pass takes in a compile of char_lm (as above) that lets
    the batch vary, and the whole compile's: the median of 5 compiles (``--quick``: one)."""
    import statistics

    import char_lm

    from pipecompile.compiler import compile_model

    model = char_lm.build_char_gpt(n_layer=1) if quick else char_lm.build_model()
    (idx,) = char_lm.example_inputs()
    probes, wholes = [], []
    for _ in range(1 if quick else 5):
        start = time.perf_counter()
        compiled = compile_model(model, {"idx": idx}, stages=2, microbatches=4, schedule="1f1b")
        wholes.append(time.perf_counter() - start)
        probes.append(dict(compiled.timings)["dynamic_dims"])
    return statistics.median(probes), statistics.median(wholes)


def worker(args: argparse.Namespace) -> None:
    import char_lm
    import char_lm_varlen

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    root, steps = Path(args.directory), args.steps
    unpadded = list(_take(char_lm_varlen.train_batches(), steps + 1))
    useful = sum(idx.numel() for idx, _ in unpadded[1:])  # after the untimed first step
    varying = alternate({
        "pipecompile, unpadded (--dynamic)": ours(root / "varying", iter(unpadded)),
        "pipecompile, padded to 128": ours(root / "padded", _batches(
            char_lm_varlen.padded_train_batches(), steps + 1)),
        "pipelining, padded to 128": theirs(root / "padded", _batches(
            char_lm_varlen.padded_train_batches(), steps + 1)),
    }, 1, steps, summary=sum)  # fmt: skip
    fixed = alternate({
        "--dynamic none (every size fixed)": ours(root / "fixed", _batches(
            char_lm.train_batches(), steps + 1)),
        "no flag (the batch varies)": ours(root / "default", _batches(
            char_lm.train_batches(), steps + 1)),
        "--dynamic batch,seq": ours(root / "fixed-dynamic", _batches(
            char_lm.train_batches(), steps + 1)),
    }, 1, steps)  # fmt: skip
    if dist.get_rank() == 0:
        found = {
            "useful_tokens": useful,
            "varying": varying,
            "fixed": fixed,
            "sizing_us": sizing_cost(root / "fixed-dynamic"),
            "batch_sizing_us": sizing_cost(root / "default"),
        }
        print("RESULT " + json.dumps(found), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _take(source: object, count: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for k, ((idx,), (target,)) in enumerate(source):  # type: ignore[attr-defined]
        if k == count:
            return
        yield idx, target


SCHEDULES = {
    "gpipe": [], "1f1b": [], "zb1p": [], "zb2p": [],
    "interleaved": ["--stages", "4", "--virtual-stages", "2"],
    "looped_bfs": ["--stages", "4", "--virtual-stages", "2"],
    "zbv": ["--stages", "4"], "v_half": ["--stages", "4"], "v_min": ["--stages", "4"],
    "dualpipev": ["--stages", "4"],
}  # fmt: skip
SHAPES = "16x128,7x40,5x17"
DIFF = re.compile(r"grads +max \|diff\| ([0-9.e+-]+)")
DIST = re.compile(r"gradient max \|diff\| ([0-9.e+-]+)")


def gradient_checks(root: Path, quick: bool) -> dict[str, tuple[float, float, int]]:
    """Per schedule: the largest gradient difference from eager over the shapes (local), the
    largest distributed one from the local backend, and how many checks passed."""
    model = f"{EXAMPLES / 'char_lm_varlen.py'}:build_model_without_dropout"
    found = {}
    for schedule, extra in SCHEDULES.items():
        if quick and schedule != "gpipe":
            continue
        out = root / f"check-{schedule}"
        argv = [model, "--stages", "2", *extra, "--microbatches", "4", "--schedule", schedule]
        pipecompile_done(*argv, "-q", "-o", str(out))
        check = ["run", str(out), "--check", "--batch-shapes", SHAPES, "--atol", "1e-5"]
        local = pipecompile_done(*check).stdout
        spread = "" if quick else run_checked(pipecompile_command(*check, "--nproc", "2")).stdout
        passed = (local + spread).count("check passed")
        found[schedule] = (
            max(float(v) for v in DIFF.findall(local)),
            max((float(v) for v in DIST.findall(spread)), default=float("nan")),
            passed,
        )
        log(f"  {schedule}: {found[schedule]}")
    return found


def main() -> None:
    args = options()
    if args.worker:
        worker(args)
        return
    print(f"machine: {machine()}")
    print(f"command: {command()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        log("compiling the five layouts ...")
        compile_all(root, args.quick)
        log(f"timing {args.steps} steps of each, two ranks, taking turns ...")
        flags = ["--directory", str(root), "--steps", str(args.steps)]
        done = run_ranks(2, __file__, "--worker", *flags, timeout=WAIT_S)
        lines = [ln[7:] for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        if done.returncode or not lines:
            raise SystemExit(done.stdout[-3000:] + done.stderr[-3000:])
    found = json.loads(lines[0])
    useful = found["useful_tokens"]
    print(f"\nchar_lm_varlen, 2 stages x 2 ranks, 1f1b, {args.steps} batches of 16 windows of "
          f"16-128 characters ({useful} real tokens):")  # fmt: skip
    print("| run | seconds | useful tokens/s | vs padded pipecompile |")
    print("|---|---:|---:|---:|")
    padded = found["varying"]["pipecompile, padded to 128"]
    for name, seconds in found["varying"].items():
        print(f"| {name} | {seconds:.2f} | {useful / seconds:.0f} | {padded / seconds:.2f}x |")
    fixed = found["fixed"]
    base = fixed["--dynamic none (every size fixed)"]
    print(f"\nchar_lm (16 x 64), 2 stages x 2 ranks, median step of {args.steps}:")
    for name, seconds in fixed.items():
        print(f"  {name}: {seconds * 1000:.1f} ms ({seconds / base - 1:+.1%})")
    for name, key in (("the batch", "batch_sizing_us"), ("batch and seq", "sizing_us")):
        sizing = found[key]
        print(f"  sizing a step's messages when {name} may vary: {sizing:.1f} us "
              f"({sizing / 1e6 / base:.3%} of the fixed step)")  # fmt: skip
    probe, whole = probe_cost(args.quick)
    print(f"  probing the batch at compile (the dynamic_dims pass): {probe * 1000:.1f} ms of a "
          f"{whole * 1000:.0f} ms compile ({probe / whole:.1%}; {probe / base:.1%} of the "
          "fixed step)")  # fmt: skip
    log("checking every synchronous schedule at each shape, locally and on 2 ranks ...")
    with tempfile.TemporaryDirectory() as tmp:
        checks = gradient_checks(Path(tmp), args.quick)
    shapes = f"run --check --batch-shapes {SHAPES} (and the example's)"
    print(f"\nchar_lm_varlen without dropout, {shapes}:")
    print("| schedule | grads vs eager, max over shapes | --nproc 2 vs local | checks passed |")
    print("|---|---:|---:|---:|")
    total = 4 if args.quick else 8  # the example and 3 shapes, locally (and on 2 ranks)
    for schedule, (local, spread, passed) in checks.items():
        print(f"| {schedule} | {local:.1e} | {spread:.1e} | {passed} of {total} |")


if __name__ == "__main__":
    main()
