"""Benchmark drawing the pictures of a compiled pipeline (``pipecompile viz``).

A randomly initialised Hugging Face GPT-2 with 24 layers (n_embd 256, 8 heads, the example's
vocabulary of 128 and input_ids (8, 16)) is compiled into 4 stages, 8 micro-batches, 1F1B,
and emitted once (not timed). Then, ``--repeats`` times, ``write_pictures`` draws
``stages.svg`` and ``schedule.svg`` into a fresh directory; the median is reported with its
parts: building each DOT source (the schedule's includes simulating the program) and each
Graphviz run (``dot`` for the stages, ``neato -n2`` for the schedule).

Rerun with::

    python tools/bench/viz.py                            # 3 repeats
    python tools/bench/viz.py --copy-to docs/pictures     # also refresh the committed pictures
    python tools/bench/viz.py --quick                     # 4 layers of width 32, one repeat

Without Graphviz's ``dot`` the two rendering rows are skipped with a note (and ``--copy-to``
is refused): the DOT sources are still built and timed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

from common import command, machine, timed, use_examples

STAGES, MICROBATCHES, SCHEDULE = 4, 8, "1f1b"
FULL, QUICK = (24, 256, 8), (4, 32, 2)  # GPT-2 layers, n_embd, heads


def compile_gpt2(out: Path, layers: int, width: int, heads: int) -> Path:
    """Compile and emit the GPT-2 into ``out``."""
    use_examples()
    from hf_gpt2 import build_gpt2, example_inputs

    from pipecompile.codegen.emit import ModelRef, emit
    from pipecompile.compiler import compile_model

    model = build_gpt2(n_layer=layers, n_embd=width, n_head=heads, n_positions=128)
    compiled = compile_model(model, example_inputs(), stages=STAGES, microbatches=MICROBATCHES,
                             schedule=SCHEDULE)  # fmt: skip
    label = f"hf_gpt2.py:build_gpt2(n_layer={layers})"
    return emit(compiled, out, model=ModelRef(None, label, label))


def schedule_source(manifest: object, program: object) -> object:
    from pipecompile.reports.pictures.schedule_picture import schedule_dot, simulated_timeline

    timeline, unit = simulated_timeline(manifest, program)  # type: ignore[arg-type]
    return schedule_dot(timeline, program, unit=unit)  # type: ignore[arg-type]


def measure(directory: Path, scratch: Path, repeats: int, draw: bool) -> dict[str, float]:
    """Median seconds of the whole and of each part over ``repeats`` runs; the Graphviz runs
    only if ``draw``."""
    from pipecompile.reports.pictures.pictures import write_pictures
    from pipecompile.reports.pictures.render import render
    from pipecompile.reports.pictures.stage_picture import stage_dot
    from pipecompile.runtime.load import read_manifest, read_program

    manifest = read_manifest(directory)
    program = read_program(directory / manifest.program)
    runs: dict[str, list[float]] = {}

    def add(name: str, fn: Callable[[], object]) -> None:
        runs.setdefault(name, []).append(timed(fn)[0])

    for k in range(repeats):
        whole = "write_pictures (both, svg)" if draw else "write_pictures (DOT sources only)"
        add(whole, lambda: write_pictures(directory, out=scratch))
        add("  stage DOT source", lambda: stage_dot(manifest, program))
        add("  simulate + schedule DOT source", lambda: schedule_source(manifest, program))
        if not draw:
            continue
        stages, schedule = stage_dot(manifest, program), schedule_source(manifest, program)
        add("  dot -Tsvg stages", partial(render, stages, scratch / f"s{k}.svg"))
        add(
            "  neato -n2 -Tsvg schedule",
            partial(render, schedule, scratch / f"t{k}.svg", engine="neato"),
        )
    return {name: statistics.median(values) for name, values in runs.items()}


def graphviz_version() -> str:
    if shutil.which("dot") is None:
        return "no Graphviz"
    return subprocess.run(["dot", "-V"], capture_output=True, text=True).stderr.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--copy-to", type=Path, help="also copy the two SVGs here")
    parser.add_argument("--json", type=Path, help="write the medians as JSON")
    parser.add_argument("--quick", action="store_true", help="a 4-layer GPT-2, one repeat")
    if parser.parse_known_args()[0].quick:  # smaller defaults; options given still count
        parser.set_defaults(repeats=1)
    args = parser.parse_args()
    draw = shutil.which("dot") is not None
    if args.copy_to and not draw:
        print("Graphviz's `dot` is not installed (apt-get install graphviz): no pictures to "
              "copy", file=sys.stderr)  # fmt: skip
        return 2
    layers, width, heads = QUICK if args.quick else FULL
    print(f"command: {command()}")
    print(f"machine: {machine(graphviz_version())}")
    if not draw:
        print(
            "note: Graphviz's `dot` is not installed (apt-get install graphviz): the two "
            "rendering rows are skipped; write_pictures writes the DOT sources only"
        )
    with tempfile.TemporaryDirectory() as tmp:
        directory = compile_gpt2(Path(tmp) / "gpt2", layers, width, heads)
        medians = measure(directory, Path(tmp) / "scratch", args.repeats, draw)
        manifest = json.loads((directory / "manifest.json").read_text())  # as a user reads it
        nodes = sum(len(s["layers"]) for s in manifest["stages"])
        print(f"model: GPT-2 {layers} layers, n_embd {width}, {STAGES} stages, {MICROBATCHES} "
              f"micro-batches, {SCHEDULE}; {nodes} layer nodes")  # fmt: skip
        print(f"| step | median of {args.repeats} (ms) |\n|---|---:|")
        for name, seconds in medians.items():
            print(f"| {name} | {seconds * 1000:.1f} |")
        if args.copy_to:
            args.copy_to.mkdir(parents=True, exist_ok=True)
            for name in ("stages", "schedule"):
                shutil.copy(Path(tmp) / "scratch" / f"{name}.svg",
                            args.copy_to / f"gpt2_{layers}_{name}.svg")  # fmt: skip
            print(f"copied the pictures to {args.copy_to}")
    if args.json:
        args.json.write_text(json.dumps(medians, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
