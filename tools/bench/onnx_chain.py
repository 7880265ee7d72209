"""Benchmark ONNX export: every example at 2 and 4 stages, exported and chained in onnxruntime.

For each example and stage count: compile (2 micro-batches) into a temporary directory,
``export_onnx`` it (timed: every stage through ``torch.onnx.export(dynamo=True)``, the name
fix-up and ``onnx.checker``), run one micro-batch through ``run_onnx_chain`` and compare its
outputs with

* the original model in eval mode (eager PyTorch), and
* the emitted PyTorch stages (``stage_<j>.py``, eval mode) chained by name.

One untimed export comes first, so the exporter's one-time import is not in the first row.
Differences are max |a - b| over every output element. Prints a Markdown table with the
machine and the command. Rerun with::

    python tools/bench/onnx_chain.py                    # every example, 2 and 4 stages
    python tools/bench/onnx_chain.py --examples gpt mlp --stages 2
    python tools/bench/onnx_chain.py --quick            # the MLP at 2 stages: a few seconds
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from common import EXAMPLES, command, log, machine
from torch.utils import _pytree as pytree

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.interop.onnx_chain import run_onnx_chain
from pipecompile.interop.onnx_export import export_onnx
from pipecompile.ir.graph.microbatch import split_microbatches
from pipecompile.model.model_file import load_model_file
from pipecompile.runtime.load import load_stages, read_manifest

EXAMPLE_NAMES = ["mlp", "resnet", "gpt", "two_towers", "hf_gpt2", "hf_bert", "hf_llama"]
MICROBATCHES = 2


@dataclass(frozen=True)
class Row:
    example: str
    stages: int
    export_s: float
    slowest_stage_s: float
    onnx_mb: float
    vs_eager: float
    vs_stages: float
    stages_vs_eager: float


def measure(name: str, stages: int, root: Path) -> Row:
    """Compile, export and chain one example; the differences are max |a - b| over outputs."""
    spec = load_model_file(str(EXAMPLES / f"{name}.py"))
    compiled = compile_model(spec.model, spec.inputs, stages=stages, microbatches=MICROBATCHES)
    ref = ModelRef(spec.path, spec.name, name)
    directory = emit(compiled, root / f"{name}_{stages}", model=ref)
    lines: list[str] = []
    start = time.perf_counter()
    paths = export_onnx(directory, progress=lines.append)
    export_s = time.perf_counter() - start
    slowest = max(float(line.split()[-2]) for line in lines) / 1000

    micro = split_microbatches(spec.inputs, MICROBATCHES)[0]
    spec.model.eval()
    with torch.no_grad():
        eager = [t.numpy() for t in pytree.tree_leaves(spec.model(**micro))]
    staged = [t.numpy() for t in _chain_stages(directory, micro)]
    onnx = run_onnx_chain(directory, micro)
    return Row(
        name, stages, export_s, slowest, sum(p.stat().st_size for p in paths) / 2**20,
        _max_diff(onnx, eager), _max_diff(onnx, staged), _max_diff(staged, eager),
    )  # fmt: skip


def _chain_stages(directory: Path, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The emitted PyTorch stages in eval mode, chained by name (as tests/standalone_chain.py)."""
    manifest = read_manifest(directory)
    values = dict(inputs)
    with torch.no_grad():
        for entry, stage in zip(manifest.stages, load_stages(directory, manifest)):
            outputs = stage.eval()(*[values[n] for n in entry.inputs])
            values.update(zip(entry.outputs, outputs))
    return [values[n] for n in manifest.outputs]


def _max_diff(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    assert len(got) == len(want)
    return max(float(np.abs(g.astype(np.float64) - w).max()) for g, w in zip(got, want))


def versions() -> list[str]:
    """The ONNX libraries' versions, for the machine line."""
    import onnx
    import onnxruntime
    import onnxscript

    return [f"{m.__name__} {m.__version__}" for m in (onnx, onnxscript, onnxruntime)]


def table(rows: list[Row]) -> str:
    lines = [
        "| example | stages | export s (slowest stage) | ONNX MiB | ONNX vs eager "
        "| ONNX vs PyTorch stages | PyTorch stages vs eager |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.example} | {r.stages} | {r.export_s:.2f} ({r.slowest_stage_s:.2f}) | "
            f"{r.onnx_mb:.1f} | {r.vs_eager:.1e} | {r.vs_stages:.1e} | {r.stages_vs_eager:.1e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", nargs="+", default=EXAMPLE_NAMES, choices=EXAMPLE_NAMES)
    parser.add_argument("--stages", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--quick", action="store_true", help="the MLP at 2 stages")
    if parser.parse_known_args(argv)[0].quick:  # smaller defaults; options given still count
        parser.set_defaults(examples=["mlp"], stages=[2])
    args = parser.parse_args(argv)
    print(f"machine: {machine(*versions())}")
    print(f"command: {command(argv)}")
    print()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.quick:  # the exporter's imports, untimed (in --quick the same call runs)
            measure("mlp", 2, Path(tmp) / "warmup")
        rows = []
        for name in args.examples:
            for stages in args.stages:
                rows.append(measure(name, stages, Path(tmp)))
                log(f"  {name} {stages} stages done")
    print(table(rows))


if __name__ == "__main__":
    main()
