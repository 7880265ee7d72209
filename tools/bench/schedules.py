"""Benchmark the schedules: simulated bubbles, measured in-flight peaks, recomputed memory,
and the interpreter's overhead per instruction. Prints Markdown tables.

1. Simulated bubble fraction with uniform costs (F=1, B=2, I=W=1) for p=4, m=8 and 16 and
   p=8, m=32, every schedule, next to the closed form.
2. Peak in-flight micro-batches per device measured by the interpreter next to the
   simulator's prediction (a 16-layer MLP, every schedule, both shapes).
3. Peak stored activation bytes per device for a GPT (8 layers, n_embd 256, 128 tokens,
   batch 32, 4 stages, 8 micro-batches, gpipe) with --recompute never vs always:
   measured next to predicted.
4. Interpreter overhead per instruction: the dispatch loop alone (no-op handlers), and a
   whole training step of a model whose arithmetic is negligible.

Rerun with ``python tools/bench/schedules.py`` (``--quick``: every part on small sizes, p=2,
m=4 only, an 8-layer MLP, a 2-layer GPT of width 32 timed for one step, one repeat; a few
seconds).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import torch
from common import machine, use_examples
from torch import nn

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.ir.programs.memory_model import peak_stored_bytes
from pipecompile.ir.programs.simulate import Costs, simulate
from pipecompile.ir.programs.topology import Topology, topology
from pipecompile.ir.records.sizes import format_size
from pipecompile.passes import insert_communication
from pipecompile.runtime.interpreter import run_program
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.schedules import compute_program
from pipecompile.schedules.v_half import v_half_idle
from pipecompile.schedules.v_min import v_min_idle


@dataclass(frozen=True)
class Sizes:
    """Pipeline shapes (p, m) and the GPT of part 3."""

    shapes: tuple[tuple[int, int], ...] = ((4, 8), (4, 16), (8, 32))
    gpt_layers: int = 8
    gpt_width: int = 256
    gpt_tokens: int = 128
    gpt_batch: int = 32
    mlp_layers: int = 16  # part 2's MLP (a Linear and a Tanh a layer)
    timed_steps: int = 3  # part 3's steps a policy, after a warm-up


QUICK = Sizes(shapes=((2, 4),), gpt_layers=2, gpt_width=32, gpt_tokens=16, gpt_batch=8,
              mlp_layers=8, timed_steps=1)  # fmt: skip
# (label, generator name, options, closed form of the bubble fraction)
SCHEDULES = [
    ("gpipe", "gpipe", {}, lambda p, m: Fraction(p - 1, m + p - 1)),
    ("1f1b", "1f1b", {}, lambda p, m: Fraction(p - 1, m + p - 1)),
    ("pipedream", "pipedream", {}, lambda p, m: Fraction(p - 1, m + p - 1)),
    ("interleaved v=2", "interleaved", {"virtual_stages": 2},
     lambda p, m: Fraction(p - 1, 2 * m + p - 1)),
    ("interleaved v=4", "interleaved", {"virtual_stages": 4},
     lambda p, m: Fraction(p - 1, 4 * m + p - 1)),
    ("zb1p", "zb1p", {}, lambda p, m: Fraction(p - 1, 3 * m + p - 1)),
    ("zb2p", "zb2p", {}, lambda p, m: Fraction(p - 1, 3 * m + p - 1)),
    ("looped_bfs v=2", "looped_bfs", {"virtual_stages": 2},
     lambda p, m: Fraction(p - 1, 2 * m + p - 1)),
    ("zbv", "zbv", {"v_shape": True}, lambda p, m: Fraction(p - 1, 6 * m + p - 1)),
    ("v_half", "v_half", {"v_shape": True},
     lambda p, m: Fraction(v_half_idle(p), 6 * m + v_half_idle(p))),
    ("v_min", "v_min", {"v_shape": True},
     lambda p, m: Fraction(v_min_idle(p), 6 * m + v_min_idle(p))),
    ("dualpipev", "dualpipev", {"v_shape": True}, lambda p, m: Fraction(p - 1, 6 * m + p - 1)),
    ("pipedream_2bw", "pipedream_2bw", {}, lambda p, m: Fraction(p - 1, m + p - 1)),
]  # fmt: skip


def stages_of(options: dict, p: int) -> int:
    return p * (2 if options.get("v_shape") else options.get("virtual_stages", 1))


def generator_options(options: dict) -> dict:
    """The options the schedule takes (``v_shape`` only says it has two stages a device)."""
    return {k: v for k, v in options.items() if k != "v_shape"}


def bubbles(sizes: Sizes) -> None:
    print("\n### Simulated bubble fraction, uniform costs\n")
    print("| schedule | p | m | makespan | bubble (simulated) | closed form | idle clocks/device |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for p, m in sizes.shapes:
        for label, name, options, closed in SCHEDULES:
            n = stages_of(options, p)
            timeline = simulate(
                compute_program(name, n, m, **generator_options(options)),
                Topology.chain(n),
                Costs.uniform(n),
            )
            work = 3 * m * n // p
            print(
                f"| {label} | {p} | {m} | {timeline.makespan:g} | {timeline.bubble_fraction:.5f} "
                f"| {float(closed(p, m)):.5f} ({closed(p, m)}) | {timeline.makespan - work:g} |"
            )


def deep_mlp(layers: int = 16, width: int = 32) -> nn.Module:
    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*blocks)


def inflight(tmp: Path, sizes: Sizes) -> None:
    print("\n### Peak in-flight micro-batches per device: measured / predicted\n")
    print(f"{sizes.mlp_layers}-layer MLP (width 32), batch = m, one row per schedule and "
          "shape.\n")  # fmt: skip
    print("| schedule | p | m | measured | predicted (simulator) | equal |")
    print("|---|---:|---:|---|---|---|")
    model = deep_mlp(layers=sizes.mlp_layers)
    for p, m in sizes.shapes:
        x, y = torch.randn(m, 32), torch.randn(m, 32)
        for label, name, options, _ in SCHEDULES:
            n = stages_of(options, p)
            compiled = compile_model(model, {"input": x}, stages=n, microbatches=m,
                                     schedule=name, **generator_options(options))  # fmt: skip
            out = emit(compiled, tmp / f"{name}{p}{n}", model=ModelRef(None, "mlp", "mlp"))
            pipe = Pipeline.load(out)
            pipe.set_optimizer(lambda ps: torch.optim.SGD(ps, lr=1e-3))
            pipe.train_step({"input": x}, (y,), nn.functional.mse_loss)
            predicted = simulate(compiled.program, topology(compiled.graph), Costs.uniform(n))
            measured = pipe.last.stats.peak_inflight  # type: ignore[union-attr]
            print(
                f"| {label} | {p} | {m} | {list(measured)} | {list(predicted.peak_inflight)} "
                f"| {'yes' if measured == predicted.peak_inflight else 'NO'} |"
            )


def recompute_memory(tmp: Path, sizes: Sizes) -> None:
    use_examples()
    from gpt import build_gpt

    print("\n### Peak stored activation bytes per device, GPT, gpipe: never vs always\n")
    print(f"GPT: {sizes.gpt_layers} layers, n_embd {sizes.gpt_width}, {sizes.gpt_tokens} tokens, "
          f"batch {sizes.gpt_batch}, 4 stages, 8 micro-batches.\n")  # fmt: skip
    model = build_gpt(n_layer=sizes.gpt_layers, n_embd=sizes.gpt_width, n_head=8,
                      block_size=sizes.gpt_tokens, vocab_size=512)  # fmt: skip
    shape = (sizes.gpt_batch, sizes.gpt_tokens + 1)
    tokens = torch.randint(0, 512, shape, generator=torch.Generator().manual_seed(0))
    inputs, targets = {"idx": tokens[:, :-1]}, (tokens[:, 1:],)

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(out.reshape(-1, out.size(-1)), target.reshape(-1))

    rows = {}
    for policy in ("never", "always"):
        compiled = compile_model(model, inputs, stages=4, microbatches=8, recompute=policy)
        out = emit(compiled, tmp / f"gpt-{policy}", model=ModelRef(None, "gpt", "gpt"))
        pipe = Pipeline.load(out)
        pipe.set_optimizer(lambda ps: torch.optim.SGD(ps, lr=1e-3))
        pipe.train_step(inputs, targets, loss_fn, measure_memory=True)
        stats = pipe.last.stats
        seconds = []
        for _ in range(1 + sizes.timed_steps):  # a warm-up first; the median of the rest
            start = time.perf_counter()
            pipe.train_step(inputs, targets, loss_fn)
            seconds.append(time.perf_counter() - start)
        predicted = peak_stored_bytes(compiled.program, [s.saved for s in compiled.memory],
                                      [s.inputs for s in compiled.memory])  # fmt: skip
        rows[policy] = (stats.peak_stored, predicted, statistics.median(seconds[1:]))  # type: ignore[union-attr]
    print("| device | never: measured | never: predicted | always: measured | always: predicted "
          "| always / never |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|")
    for d in range(4):
        never, always = rows["never"][0][d], rows["always"][0][d]
        print(
            f"| {d} | {format_size(never)} | {format_size(rows['never'][1][d])} "
            f"| {format_size(always)} | {format_size(rows['always'][1][d])} "
            f"| {always / never:.3f} |"
        )
    total_n, total_a = sum(rows["never"][0]), sum(rows["always"][0])
    never_s, always_s = rows["never"][2], rows["always"][2]
    print(f"\nAll devices: {format_size(total_n)} -> {format_size(total_a)} "
          f"({total_a / total_n:.3f}x). Step time (median of {sizes.timed_steps} after a "
          f"warm-up): never {never_s:.2f} s, always {always_s:.2f} s.")  # fmt: skip


def overhead(tmp: Path, sizes: Sizes, repeats: int) -> None:
    print("\n### Interpreter overhead per instruction (local backend)\n")
    p, m = sizes.shapes[-1]
    program = insert_communication(compute_program("1f1b", p, m), topology=Topology.chain(p))
    count = sum(len(d) for d in program.devices)
    handlers = dict.fromkeys(
        ["F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "STEP"], lambda instr: True
    )
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run_program(program, handlers)
        times.append(time.perf_counter() - start)
    loop = statistics.median(times) / count * 1e6
    print(f"- dispatch loop alone, no-op handlers: {loop:.2f} µs per instruction "
          f"(1f1b, p={p}, m={m}, {count} instructions, median of {repeats})")  # fmt: skip

    model = deep_mlp(layers=p, width=4)
    x, y = torch.randn(m, 4), torch.randn(m, 4)
    compiled = compile_model(model, {"input": x}, stages=p, microbatches=m, schedule="1f1b")
    pipe = Pipeline.load(emit(compiled, tmp / "tiny", model=ModelRef(None, "tiny", "tiny")))
    pipe.set_optimizer(lambda ps: torch.optim.SGD(ps, lr=1e-3))
    steps = []
    for _ in range(repeats):
        start = time.perf_counter()
        pipe.train_step({"input": x}, (y,), nn.functional.mse_loss)
        steps.append(time.perf_counter() - start)
    count = sum(len(d) for d in pipe.program.devices)
    eager = []
    for _ in range(repeats):
        start = time.perf_counter()
        for xb, yb in zip(x.chunk(m), y.chunk(m)):
            (nn.functional.mse_loss(model(xb), yb) / m).backward()
        eager.append(time.perf_counter() - start)
    step, ref = statistics.median(steps), statistics.median(eager)
    print(f"- whole training step, {p}-layer MLP of width 4 (arithmetic negligible), 1f1b, "
          f"p={p}, m={m}: {step * 1e3:.2f} ms for {count} instructions = "
          f"{step / count * 1e6:.1f} µs per instruction; the same {m} micro-batches in eager "
          f"PyTorch take {ref * 1e3:.2f} ms, so pipecompile adds "
          f"{(step - ref) / count * 1e6:.1f} µs per instruction")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--repeats", type=int, default=20)
    if parser.parse_known_args()[0].quick:  # smaller defaults; options given still count
        parser.set_defaults(repeats=1)
    args = parser.parse_args()
    sizes = QUICK if args.quick else Sizes()
    torch.set_num_threads(1)
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        bubbles(sizes)
        inflight(Path(tmp), sizes)
        recompute_memory(Path(tmp), sizes)
        overhead(Path(tmp), sizes, args.repeats)


if __name__ == "__main__":
    main()
