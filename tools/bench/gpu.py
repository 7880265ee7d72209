"""The CUDA path on one GPU: exactness, bf16/fp16 training and throughput against
torch.distributed.pipelining and eager PyTorch.

One GPU holds every stage: the programs are compiled with ``--schedule interleaved
--virtual-stages 2`` (two stages on one device) and run with ``run --nproc 1 --device cuda``,
one rank on NCCL. Three parts:

1. check: examples/gpt.py, examples/resnet.py and examples/hf_gpt2.py, ``run --check``: the
   stages on the GPU against the eager model on the CPU, by the noise-floor rule.
2. precision: examples/gpt.py, 20 AdamW steps with ``--precision bf16`` and ``fp16``, against
   the same steps of the eager model on the same GPU under ``torch.autocast`` (fp16 with
   ``torch.amp.GradScaler``).
3. throughput: a GPT (``--width``, ``--layers``, ``--batch``, ``--tokens``; 8 micro-batches),
   samples/s (median step) of ``run --nproc 1 --device cuda`` against
   torch.distributed.pipelining's ScheduleInterleaved1F1B over the same model split at its
   middle block (one rank, two stages), and eager PyTorch on the whole batch; fp32 and bf16.
   Every system runs AdamW; the peer and eager steps end with ``torch.cuda.synchronize()``.
4. profile: the throughput GPT's bf16 training under ``torch.profiler``, pipecompile's one rank
   (in a process of its own) and the eager model: per step, the wall time, the time the GPU
   (or, on the CPU, the operators) was busy, the matrix products by dtype, and the ten
   operators that took the most time. Tells a launch- or Python-bound step from a GPU-bound
   one, and shows whether the stages' matrix products ran in bf16.

Rerun with::

    python tools/bench/gpu.py            # the figures in docs/BENCHMARKS.md (needs a GPU)
    python tools/bench/gpu.py --part profile   # the profile alone
    python tools/bench/gpu.py --quick    # GPT example only, 2 steps, throughput in fp32 and the
                                         # profile in bf16 (one step) at tiny sizes; on the CPU
                                         # (gloo) where torch sees no GPU, so every path runs in
                                         # the test suite
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import (
    EXAMPLES,
    log,
    machine,
    pipecompile_command,
    pipecompile_done,
    run_checked,
    use_examples,
)
from torch.autograd import DeviceType

use_examples()

CHECKED = ("gpt", "resnet", "hf_gpt2")
PARTS = ("check", "precision", "throughput", "profile")
MODEL_FILE = '''"""The throughput benchmark's GPT (tools/bench/gpu.py writes this file)."""
import sys
sys.path.insert(0, {examples!r})
import torch
from gpt import build_gpt, loss_fn  # noqa: F401

SIZES = {sizes!r}


def build_model():
    return build_gpt(n_layer=SIZES["layers"], n_embd=SIZES["width"], n_head=SIZES["heads"],
                     vocab_size=SIZES["vocab"], block_size=SIZES["tokens"])


def _stream():
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, SIZES["vocab"], (SIZES["batch"], SIZES["tokens"] + 1), generator=g)


def example_inputs():
    return (_stream()[:, :-1].contiguous(),)


def example_targets():
    return (_stream()[:, 1:].contiguous(),)
'''


def one_gpu_compile(model: str, out: Path, micro: int, *extra: str) -> None:
    """Two stages on one device (interleaved, two virtual stages), ``micro`` micro-batches."""
    pipecompile_done(model, "--stages", "2", "--schedule", "interleaved", "--virtual-stages",
                     "2", "--microbatches", str(micro), "-q", "-o", str(out), *extra)  # fmt: skip


def compiled_example(root: Path, name: str) -> Path:
    """examples/NAME.py on one device, 4 micro-batches, compiled once per benchmark run."""
    out = root / f"example-{name}"
    if not out.exists():
        one_gpu_compile(str(EXAMPLES / f"{name}.py"), out, 4)
    return out


def train_losses(out: Path, steps: int) -> list[dict]:
    lines = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r["kind"] == "train"][-steps:]


def check(root: Path, device: str, quick: bool) -> None:
    print(f"\n## run --check on one {device} rank (2 stages on one device)\n")
    print("| model | result | largest gradient error (noise floors) |")
    print("|---|---|---:|")
    for name in ("gpt",) if quick else CHECKED:
        out = compiled_example(root, name)
        done = run_checked(pipecompile_command("run", str(out), "--nproc", "1", "--device",
                                               device, "--check"), check=False)  # fmt: skip
        text = done.stdout + done.stderr
        ratios = [float(x) for x in re.findall(r"\(([\d.]+)x the noise floor\)", text)]
        worst = f"{max(ratios):.2f}" if ratios else "within 8 ulps"
        result = "passed" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
        print(f"| {name} | {result} | {worst} |")
        if done.returncode:
            print("\n```\n" + text[-2500:] + "\n```\n")


def eager_curve(device: str, precision: str, steps: int) -> list[float]:
    """The eager GPT example's losses over ``steps`` AdamW steps under autocast."""
    import gpt  # examples/gpt.py

    model = gpt.build_model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    scaler = torch.amp.GradScaler(device, enabled=precision == "fp16")
    (idx,), (target,) = gpt.example_inputs(), gpt.example_targets()
    losses = []
    for _ in range(steps):
        with torch.autocast(device, dtype=dtype):
            loss = gpt.loss_fn(model(idx.to(device)), target.to(device))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def precision(root: Path, device: str, quick: bool) -> None:
    steps = 2 if quick else 20
    out = compiled_example(root, "gpt")
    kinds = ("bf16", "fp16") if device == "cuda" else ("bf16",)  # fp16 needs a GPU
    print(f"\n## --precision on one {device} rank, GPT example, {steps} AdamW steps\n")
    print("| precision | pipecompile loss step 1 | last step | eager autocast last step "
          "| largest relative gap |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    for kind in kinds:
        pipecompile_done("run", str(out), "--nproc", "1", "--device", device, "--steps",
                         str(steps), "--precision", kind, "--lr", "1e-3", "--optimizer", "adamw",
                         "-q")  # fmt: skip
        ours = [r["loss"] for r in train_losses(out, steps)]
        eager = eager_curve(device, kind, steps)
        gap = max(abs(a - b) / abs(b) for a, b in zip(ours, eager))
        print(f"| {kind} | {ours[0]:.5f} | {ours[-1]:.5f} | {eager[-1]:.5f} | {gap:.2e} |")


def _autocast(device: str, dtype: torch.dtype | None) -> torch.autocast:
    """``torch.autocast`` to ``dtype`` on ``device``, or off for None (fp32)."""
    return torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None)


def eager_step(
    module: object,
    where: torch.device,
    idx: torch.Tensor,
    target: torch.Tensor,
    dtype: torch.dtype | None,
    micro: int = 1,
) -> object:
    """One AdamW step of the eager model, as a closure: on the whole batch, or its gradients
    accumulated over ``micro`` micro-batches (the pipeline's kernel sizes, without it)."""
    model = module.build_model().to(where)  # type: ignore[attr-defined]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        for part, wanted in zip(idx.chunk(micro), target.chunk(micro)):
            with _autocast(where.type, dtype):
                loss = module.loss_fn(model(part), wanted) / micro  # type: ignore[attr-defined]
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _load(model_file: Path) -> object:
    """The benchmark's model file as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_bench_model", model_file)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def peer_and_eager(model_file: Path, device: str, steps: int, micro: int, kind: str) -> dict:
    """Median samples/s of torch.distributed.pipelining (one rank, two stages) and of eager
    (whole batch, and accumulated over the micro-batches)."""
    import torch.distributed as dist
    from torch.distributed.pipelining import ScheduleInterleaved1F1B, SplitPoint, pipeline

    module = _load(model_file)
    where = torch.device(device)
    (idx,), (target,) = module.example_inputs(), module.example_targets()
    idx, target = idx.to(where), target.to(where)
    dtype = torch.bfloat16 if kind == "bf16" else None

    def timed_steps(step: object) -> float:
        times = []
        for _ in range(steps):
            began = time.perf_counter()
            step()  # type: ignore[operator]
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - began)
        return idx.shape[0] / statistics.median(times[2:] or times)

    eager = timed_steps(eager_step(module, where, idx, target, dtype))
    accumulated = timed_steps(eager_step(module, where, idx, target, dtype, micro))
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = module.build_model()
        middle = len(model.h) // 2
        pipe = pipeline(model, mb_args=(idx.chunk(micro)[0].cpu(),),
                        split_spec={f"h.{middle}": SplitPoint.BEGINNING})  # fmt: skip
        stages = [pipe.build_stage(i, where) for i in range(pipe.num_stages)]
        params = [p for s in stages for p in s.submod.parameters()]
        optimizer = torch.optim.AdamW(params, lr=1e-4)
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=micro, loss_fn=module.loss_fn)

        def peer_step() -> None:
            with _autocast(device, dtype):
                schedule.step(idx, target=target, losses=[])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        try:
            peer: float | str = timed_steps(peer_step)
        except RuntimeError as err:  # gloo cannot send a rank's stage to its own next stage
            peer = f"refused: {str(err).splitlines()[0][:120]}"
    finally:
        dist.destroy_process_group()
    return {"peer": peer, "eager": eager, "accumulated": accumulated}


def throughput(root: Path, device: str, quick: bool, sizes: dict) -> None:
    steps, micro = (2, 2) if quick else (20, 8)
    model_file = root / "gpu_bench_model.py"
    model_file.write_text(MODEL_FILE.format(examples=str(EXAMPLES), sizes=sizes))
    out = root / "throughput"
    one_gpu_compile(str(model_file), out, micro, "--no-verify")  # the check part proves
    print(f"\n## Training throughput on one {device}, GPT {sizes}, {micro} micro-batches, "
          f"{steps} AdamW steps (median step)\n")  # fmt: skip
    print("| precision | pipecompile samples/s | torch.distributed.pipelining | eager | "
          f"eager, {micro} micro-batches accumulated | pipecompile / pipelining | "
          "pipecompile / eager | pipecompile / eager accumulated |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = [("fp32", ())] if quick else [("fp32", ()), ("bf16", ()), ("bf16", ("--compile",))]
    others: dict = {}
    for kind, extra in rows:
        pipecompile_done("run", str(out), "--nproc", "1", "--device", device, "--steps",
                         str(steps), "--precision", kind, "--lr", "1e-4", "--optimizer", "adamw",
                         "-q", *extra)  # fmt: skip
        records = train_losses(out, steps)
        ours = statistics.median(r["samples_per_s"] for r in records[2:] or records)
        if kind not in others:  # the --compile row shares the eager and peer figures
            others[kind] = peer_and_eager(model_file, device, steps, micro, kind)
        peer, eager, accumulated = (others[kind][k] for k in ("peer", "eager", "accumulated"))
        versus = f"{ours / peer:.2f}x" if isinstance(peer, float) else "-"
        shown = f"{peer:.1f}" if isinstance(peer, float) else peer
        name = " ".join((kind, *extra))
        print(f"| {name} | {ours:.1f} | {shown} | {eager:.1f} | {accumulated:.1f} | {versus} | "
              f"{ours / eager:.2f}x | {ours / accumulated:.2f}x |")  # fmt: skip


MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
PROFILE_RANK = """# One pipecompile rank under torch.profiler: gpu.py --part profile runs
# this as `python -c` with the summary's path, then the worker's own arguments.
import json, os, sys
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, {bench!r})
from gpu import profile_summary
from pipecompile.runtime.distributed import worker

class Ended(BaseException):
    pass

def ended(code):  # the worker ends its process with os._exit: keep the profile first
    raise Ended(code)

leave, os._exit = os._exit, ended
gpu = torch.cuda.is_available()
with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * gpu,
             record_shapes=True) as prof:
    try:
        worker.main(sys.argv[2:])
    except Ended as end:
        code = end.args[0]
with open(sys.argv[1], "w") as f:
    json.dump(profile_summary(prof, gpu), f)
sys.stdout.flush()
leave(code)
"""


def profile_summary(prof: torch.profiler.profile, gpu: bool) -> dict:
    """What a profile says: the time the GPU's kernels took (the CPU operators' own time where
    there is no GPU), the matrix products' count and time by dtype, and the ten operators that
    took the most of it (milliseconds over the whole profile)."""
    own = "self_device_time_total" if gpu else "self_cpu_time_total"
    total = "device_time_total" if gpu else "cpu_time_total"
    averages = prof.key_averages()
    if gpu:  # the kernels' rows alone: an operator's own device time counts its kernels again
        averages = [e for e in averages if e.device_type == DeviceType.CUDA]
    busy = sum(getattr(e, own) for e in averages) / 1e3
    launched = sum(1 for e in prof.events() if e.name.startswith("aten::") and not _nested(e))
    matmuls: dict[str, list[float]] = {}
    for event in prof.events():
        if event.name in MATMULS:  # torch before 2.12 records no input_dtypes: "?"
            tensors = [d for d in getattr(event, "input_dtypes", None) or [] if d and d != "Scalar"]
            dtype = tensors[-1].removeprefix("c10::") if tensors else "?"
            row = matmuls.setdefault(dtype, [0, 0.0])
            row[0] += 1
            row[1] += getattr(event, total) / 1e3
    top = sorted(averages, key=lambda e: getattr(e, own), reverse=True)[:10]
    return {"busy_ms": busy, "matmuls": matmuls, "operators": launched,
            "top": [(e.key, e.count, getattr(e, own) / 1e3) for e in top]}  # fmt: skip


def _nested(event: object) -> bool:
    """Whether a profiled operator ran inside another aten operator (not called by Python)."""
    parent = event.cpu_parent  # type: ignore[attr-defined]
    return parent is not None and parent.name.startswith("aten::")


def profile_eager(model_file: Path, device: str, steps: int) -> dict:
    """The eager model's bf16 AdamW steps under the profiler (one warm-up step outside it)."""
    from torch.profiler import ProfilerActivity, profile

    module = _load(model_file)
    where = torch.device(device)
    (idx,), (target,) = module.example_inputs(), module.example_targets()
    step = eager_step(module, where, idx.to(where), target.to(where), torch.bfloat16)
    step()  # type: ignore[operator]
    gpu = device == "cuda"
    activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * gpu
    times = []
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(steps):
            began = time.perf_counter()
            step()  # type: ignore[operator]
            if gpu:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - began)
    return {**profile_summary(prof, gpu), "steps": steps, "step_ms": statistics.median(times) * 1e3}


def free_port() -> int:
    """A TCP port nobody listens on now, for the profiled rank's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def profile_ours(root: Path, model_file: Path, device: str, steps: int, micro: int) -> dict:
    """pipecompile's bf16 steps on one rank, profiled whole (its start-up too) in a process of
    its own; the step time is the median of its metrics."""
    out = root / "throughput"
    if not out.exists():
        one_gpu_compile(str(model_file), out, micro, "--no-verify")
    summary = root / "profile.json"
    script = PROFILE_RANK.format(bench=str(Path(__file__).resolve().parent))
    run_checked([sys.executable, "-c", script, str(summary), str(out), "--device", device,
                 "--steps", str(steps), "--precision", "bf16", "--lr", "1e-4", "--optimizer",
                 "adamw", "-q", "--metrics", str(out / "metrics.jsonl")],
                RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))  # fmt: skip
    records = train_losses(out, steps)
    step_ms = statistics.median(r["step_ms"] for r in records[1:] or records)
    return {**json.loads(summary.read_text()), "steps": steps, "step_ms": step_ms}


def profile(root: Path, device: str, quick: bool, sizes: dict) -> None:
    steps, micro = (1, 2) if quick else (6, 8)
    model_file = root / "gpu_bench_model.py"
    model_file.write_text(MODEL_FILE.format(examples=str(EXAMPLES), sizes=sizes))
    runs = {"pipecompile": profile_ours(root, model_file, device, steps, micro),
            "eager": profile_eager(model_file, device, steps)}  # fmt: skip
    busy = "GPU kernels" if device == "cuda" else "operators (own CPU time)"
    print(f"\n## Profile: bf16 training on one {device}, GPT {sizes}, {micro} micro-batches\n")
    print(f"pipecompile is profiled whole ({steps} steps and its start-up), eager over {steps} "
          "steps after a warm-up; times in ms.\n")  # fmt: skip
    print(f"| system | step (median) | {busy} per step | operators called per step | "
          "matrix products per step by dtype |")  # fmt: skip
    print("|---|---:|---:|---:|---|")
    for name, run in runs.items():
        per = run["steps"]
        products = ", ".join(f"{dtype}: {n / per:.0f} ({ms / per:.1f} ms)"
                             for dtype, (n, ms) in sorted(run["matmuls"].items()))  # fmt: skip
        print(f"| {name} | {run['step_ms']:.1f} | {run['busy_ms'] / per:.1f} | "
              f"{run['operators'] / per:.0f} | {products} |")  # fmt: skip
    for name, run in runs.items():
        print(f"\n{name}, what took the most {busy} (ms per step):\n")
        print("| kernel or operator | calls per step | ms per step |\n|---|---:|---:|")
        for key, count, ms in run["top"]:
            print(f"| `{key[:90]}` | {count / run['steps']:.0f} | {ms / run['steps']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 steps")
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        help="default: cuda (--quick: cuda if torch sees one, else cpu)",
    )
    parser.add_argument("--part", action="append", choices=PARTS,
                        help="run only this part (repeatable; default all)")  # fmt: skip
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=512)
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    device = args.device or ("cuda" if gpu or not args.quick else "cpu")
    if device == "cuda" and not gpu:
        raise SystemExit("gpu.py: torch sees no GPU; pass --quick (runs on the CPU) or "
                         "--device cpu")  # fmt: skip
    sizes = {"width": args.width, "layers": args.layers, "heads": max(args.width // 64, 1),
             "vocab": 8192, "batch": args.batch, "tokens": args.tokens}  # fmt: skip
    if args.quick:
        sizes = {"width": 32, "layers": 2, "heads": 2, "vocab": 64, "batch": 4, "tokens": 8}
    extra = [f"GPU {torch.cuda.get_device_name()}", f"CUDA {torch.version.cuda}"] if gpu else []
    print(f"machine: {machine(*extra)}")
    if device == "cpu":
        print("(no GPU: the CPU stands in for it, gloo for NCCL)")
    with tempfile.TemporaryDirectory() as tmp:
        for part in args.part or PARTS:
            log(f"gpu.py: {part}")
            if part in ("throughput", "profile"):
                {"throughput": throughput, "profile": profile}[part](
                    Path(tmp), device, args.quick, sizes
                )
            else:
                {"check": check, "precision": precision}[part](Path(tmp), device, args.quick)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
