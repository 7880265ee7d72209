"""Benchmark models bigger than one process should hold: meta compile, per-stage memory, HF shards.

Three parts, each selectable with ``--parts``; every command runs in a subprocess, as a user
runs it (``python -m pipecompile ...``), next to torch.distributed.pipelining where it has a
counterpart.

1. ``compile7b``: wall time and peak RSS of the whole command ``python -m pipecompile
   examples/llama7b_meta.py --stages 8 --microbatches 8 -o TMP -q`` (a Llama-2-7B-shaped
   LlamaForCausalLM built on the meta device; goal: under 30 s and 2 GiB), and the size in
   bytes of the directory it writes. The peer, side by side: a generated script that builds
   the same meta model and calls ``pipeline(model, mb_args=(ids[:1],), split_spec=
   {"model.layers.4": SplitPoint.BEGINNING, ...})`` (a split every 4 layers: 8 stages), with
   one real 1 x 128 micro-batch of token ids as its example. Peak RSS is measured exactly:
   each command runs under a wrapper process of its own (``python -c``) that runs it with
   ``subprocess`` and prints ``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` once it has
   exited: the largest RSS any process of the command reached.

2. ``train_memory``: a GPT-2 of about 1.1 GB of fp32 parameters (``build_gpt2(n_layer=20,
   n_embd=1024, n_head=16, vocab_size=32000, n_positions=128)``, 284.8 M parameters, 1.14 GB) in a
   generated model file whose ``build_model()`` builds it under ``torch.device("meta")``;
   ``example_inputs`` is a batch of 4 x 64 tokens. ``python -m pipecompile MODEL --stages 4
   --microbatches 4 -q -o OUT``, then ``python -m pipecompile run OUT --nproc 4 --steps 3 -q``
   (AdamW, lr 1e-3); each rank's peak RSS is what it records itself (``getrusage``'s
   ``ru_maxrss``, the ``peak_memory`` of the metrics file's last step record: the ranks are
   forked from one starter process, so /proc cannot tell them apart by command line; the
   fork's peak includes the starter's own). Eager reference: the same
   model built for real on the CPU in one process, 3 AdamW steps (lr 1e-3) on the same batch,
   measured under the wrapper. Printed: per rank its peak RSS and its ratio to the eager
   process's (goal: at most 0.4), and both commands' wall times (process start to exit).
   The peer: torch.distributed.pipelining's documented flow, where every rank builds the
   whole model (for real) and splits it: ``pipeline(model, mb_args=(one micro-batch,),
   split_spec=...)`` (a split every 5 layers), ``pipe.build_stage(rank, cpu)``, the model and
   the pipe then deleted, 3 steps of ``ScheduleGPipe(stage, n_microbatches=4, loss_fn=...)``
   with AdamW over the stage's parameters (gloo), launched with ``python -m
   torch.distributed.run --standalone --nproc-per-node=4`` and its ranks polled the same way.
   Its weights are GPT-2's own initialisation, pipecompile's its per-stage recipes: the
   memory and times compare, the losses would not.

3. ``hf_shards``: a randomly initialised ``examples/hf_gpt2.build_gpt2()`` (parameters drawn
   from uniform(-0.1, 0.1)) saved with ``save_pretrained(CK, max_shard_size="300KB")`` (3
   shards); ``python -m pipecompile META_MODEL --stages 4 --weights CK -o OUT -q`` for a model
   file whose ``build_model()`` builds ``build_gpt2()`` on the meta device (example batch
   8 x 16); ``pipecompile.load(OUT)`` (in this process, where transformers is already
   imported, which registers the output type the directory's output spec names) run on an
   (8, 16) batch of token ids against ``GPT2LMHeadModel.from_pretrained(CK)`` in eval mode
   (max |diff| of the logits, ``torch.equal``); then ``python -m pipecompile export OUT -o
   EXPORTED --shard-size 300KB`` and ``GPT2LMHeadModel.from_pretrained(EXPORTED)
   .state_dict()`` compared bit for bit with the saved model's. The time of each step is
   printed.

With ``--quick`` (figures not judged) the commands of one process, the compiles, the export,
the eager reference and the peer's split, run in this process, saving a fresh interpreter's
imports of torch and transformers each; the runs of several ranks still start their processes.
A summary table per part comes last. The exit status is 0 unless a part failed (a pipecompile
command exited non-zero, or a part raised); a failing peer is reported, not a failure. All
temporary directories are removed. Rerun with::

    python tools/bench/big_models.py            # every part: ~7 minutes on 2 cores; the
                                                # training part peaks at ~13 GB in all
    python tools/bench/big_models.py --parts compile7b hf_shards
    python tools/bench/big_models.py --quick    # every part on tiny sizes (llama_meta.py in 2
                                                # stages, a 2-layer GPT-2 on 2 ranks, 1 step,
                                                # the checkpoint compiled into 2 stages)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import runpy
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from common import (
    EXAMPLES,
    ROOT,
    command,
    log,
    machine,
    pipecompile_command,
    pipecompile_here,
    timed,
    torchrun_command,
    use_examples,
)

PARTS = ("compile7b", "train_memory", "hf_shards")
MARKER = "BENCH_BIG_MODELS_RUN"  # in the environment of every process of one polled run
POLL_S = 0.1
WAIT_S = 3600  # the most one command of the full benchmark may take
GIB, MIB = 2**30, 2**20
TMP_SHOWN = [""]  # the running part's temporary directory, shown as TMP

# Runs a command given as JSON; once it has exited, prints its status, its wall time and the
# largest RSS (KiB on Linux) any of its processes reached. One wrapper per measurement, so
# RUSAGE_CHILDREN covers exactly that command.
WRAPPER = (
    "import json, resource, subprocess, sys, time\n"
    "command = json.loads(sys.argv[1])\n"
    "start = time.perf_counter()\n"
    "code = subprocess.run(command).returncode\n"
    "wall = time.perf_counter() - start\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "print('BENCH_CHILD ' + json.dumps({'rc': code, 'wall': wall, 'peak_kib': peak}), "
    "flush=True)\n"
)


# --------------------------------------------------------------------------- sizes


@dataclass(frozen=True)
class CompileSizes:
    """Part 1: which meta model, how many stages, where the peer splits."""

    model: str = "llama7b_meta.py"
    stages: int = 8
    microbatches: int = 8
    every: int = 4  # the peer splits before every ``every``-th decoder layer
    quick: bool = False  # figures meaningless: no goal is judged


@dataclass(frozen=True)
class TrainSizes:
    """Part 2: the GPT-2, the batch and the run."""

    layers: int = 20
    width: int = 1024
    heads: int = 16
    vocab: int = 32000
    positions: int = 128
    batch: int = 4
    tokens: int = 64
    stages: int = 4
    microbatches: int = 4
    steps: int = 3
    lr: float = 1e-3
    # Stages balanced on parameter bytes, as for a model that is bound by memory: balanced
    # on FLOPs (the default), stage 0 gets the embeddings and most of six blocks, 398 MiB of
    # parameters against 272 MiB, and its rank peaked at 0.43 x eager (2026-11-23).
    balance: str = "params"
    quick: bool = False


@dataclass(frozen=True)
class ShardSizes:
    """Part 3: the checkpoint's shards and the compile."""

    shard_size: str = "300KB"
    shards: int = 3  # what save_pretrained is expected to make of build_gpt2() at that size
    stages: int = 4
    quick: bool = False


QUICK_COMPILE = CompileSizes(model="llama_meta.py", stages=2, microbatches=2, every=1, quick=True)
QUICK_TRAIN = TrainSizes(layers=2, width=64, heads=4, vocab=128, tokens=16, stages=2,
                         microbatches=2, steps=1, quick=True)  # fmt: skip
QUICK_SHARDS = ShardSizes(stages=2, quick=True)
NOT_JUDGED = "not judged (--quick)"


# --------------------------------------------------------------------------- results


@dataclass
class Measured:
    """One command's outcome."""

    command: list[str]
    rc: int
    wall: float
    peak_kib: int | None  # wrapper-measured peak RSS; None when not measured that way
    stdout: str
    stderr: str

    def first_error(self) -> str:
        """The line that says what went wrong: a ``PEER_ERROR``/``pipecompile:`` line, else
        the last line of stderr."""
        for line in (self.stdout + "\n" + self.stderr).splitlines():
            if line.startswith("PEER_ERROR "):
                return line[len("PEER_ERROR ") :]
        lines = [ln for ln in self.stderr.splitlines() if ln.strip()]
        ours = [ln for ln in lines if ln.startswith("pipecompile:")]
        return (ours or lines or [f"exit status {self.rc}, no output"])[-1][:300]


@dataclass
class PartResult:
    """A part's summary rows and whether it failed."""

    name: str
    rows: list[tuple[str, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


class PipecompileFailed(Exception):
    """A pipecompile command exited non-zero: the part cannot go on."""


# --------------------------------------------------------------------------- processes


def measured(command: list[str], cwd: Path, timeout: float = WAIT_S) -> Measured:
    """Run ``command`` under a wrapper of its own; its wall time and exact peak RSS."""
    wrapped = [sys.executable, "-c", WRAPPER, json.dumps(command)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(wrapped, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=cwd, env=env, start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:  # timed out, or we were interrupted: nothing of it stays
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    lines = stdout.splitlines()
    found = [json.loads(ln[12:]) for ln in lines if ln.startswith("BENCH_CHILD ")]
    if not found:  # the wrapper itself failed
        return Measured(command, proc.returncode or 1, 0.0, None, stdout, stderr)
    stdout = "\n".join(ln for ln in lines if not ln.startswith("BENCH_CHILD "))
    info = found[-1]
    return Measured(command, info["rc"], info["wall"], info["peak_kib"], stdout, stderr)


def measured_unless_quick(
    command: list[str], cwd: Path, quick: bool, here: Callable[[], str]
) -> Measured:
    """``command`` under the wrapper: its wall time and peak RSS. With --quick, whose figures are
    not judged, ``here()`` does the same work in this process instead (wall time only): a fresh
    interpreter would spend most of a quick run importing torch and transformers."""
    if not quick:
        return measured(command, cwd)
    start = time.perf_counter()
    try:
        stdout, rc, stderr = here(), 0, ""
    except Exception as failed:
        stdout, rc, stderr = "", 1, f"{type(failed).__name__}: {failed}"
    except SystemExit as failed:
        stdout, rc, stderr = "", 1, str(failed)
    return Measured(command, rc, time.perf_counter() - start, None, stdout, stderr)


def pipecompile_measured(cwd: Path, quick: bool, *args: str) -> Measured:
    """``pipecompile ARGS``, measured (see ``measured_unless_quick``)."""
    return measured_unless_quick(
        pipecompile_command(*args), cwd, quick, lambda: pipecompile_here(*args)
    )


def script_here(script: Path, *args: str) -> str:
    """``python SCRIPT ARGS`` in this process, as ``__main__``; its stdout."""
    out, argv = io.StringIO(), sys.argv
    sys.argv = [str(script), *args]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    return out.getvalue()


def shown(command: list[str]) -> str:
    """``command`` as a user would type it: ``python``, paths under the repository relative,
    the part's temporary directory as TMP."""
    text = (
        shlex.join(["python", *command[1:]])
        if command[0] == sys.executable
        else shlex.join(command)
    )
    if TMP_SHOWN[0]:
        text = text.replace(TMP_SHOWN[0], "TMP")
    return text.replace(f"{ROOT}/", "")


def require(result: Measured, what: str, part: PartResult) -> None:
    """Stop the part when a pipecompile command failed, saying which and why."""
    if result.rc == 0:
        return
    tail = "\n".join(result.stderr.strip().splitlines()[-15:])
    message = f"{what} failed (exit {result.rc}): {shown(result.command)}"
    print(f"\nFAILED: {message}\n{tail}\n", flush=True)
    part.failures.append(f"{message}: {result.first_error()}")
    raise PipecompileFailed(message)


def rank_pids(tag: str, needle: str) -> dict[int, int]:
    """Rank -> pid of the live processes of run ``tag`` whose command line holds ``needle``
    and whose environment sets ``RANK`` (the ranks, not their launchers)."""
    marker, where = f"{MARKER}={tag}".encode(), needle.encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if where not in cmdline or b"torch.distributed.run" in cmdline:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if marker not in environ:
            continue
        ranks = [v[5:] for v in environ if v.startswith(b"RANK=")]
        if ranks:
            found[int(ranks[0])] = int(entry.name)
    return found


def vm_hwm_kib(pid: int) -> int | None:
    """The process's peak RSS so far (``VmHWM``, KiB), or None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def polled(command: list[str], needle: str, cwd: Path, timeout: float = WAIT_S) -> tuple:
    """Run ``command``; poll its ranks' ``VmHWM`` every 0.1 s. Returns (Measured, rank ->
    latest VmHWM in KiB)."""
    tag = uuid.uuid4().hex
    env = {**os.environ, MARKER: tag, "PYTHONUNBUFFERED": "1"}
    peaks: dict[int, int] = {}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err, cwd=cwd, env=env,
                                start_new_session=True)  # fmt: skip
        try:
            while proc.poll() is None:
                if time.perf_counter() - start > timeout:
                    raise subprocess.TimeoutExpired(command, timeout)
                for rank, pid in rank_pids(tag, needle).items():
                    hwm = vm_hwm_kib(pid)
                    if hwm is not None:
                        peaks[rank] = max(hwm, peaks.get(rank, 0))
                time.sleep(POLL_S)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        return Measured(command, proc.returncode, wall, None, out.read(), err.read()), peaks


def directory_bytes(path: Path) -> tuple[int, int]:
    """Total bytes and number of the files under ``path``."""
    files = [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def gib(kib: int | None) -> str:
    return "n/a" if kib is None else f"{kib * 1024 / GIB:.2f} GiB"


# --------------------------------------------------------------------------- generated files

PEER_SPLIT = '''"""pipelining's pipeline() on a meta model (tools/bench/big_models.py)."""

import importlib.util
import sys
import time

import torch
from torch.distributed.pipelining import SplitPoint, pipeline

path, stages, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sys.path.insert(0, str(__import__("pathlib").Path(path).parent))
spec = importlib.util.spec_from_file_location("model_file", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
model = module.build_model()
micro = module.example_inputs()["input_ids"][:1]  # one real micro-batch, 1 x T tokens
split = {f"model.layers.{k * every}": SplitPoint.BEGINNING for k in range(1, stages)}
start = time.perf_counter()
try:
    pipe = pipeline(model, mb_args=(micro,), split_spec=split)
except Exception as err:  # reported by the benchmark, not a crash
    first = (str(err).strip().splitlines() or [""])[0][:250]
    print(f"PEER_ERROR {type(err).__name__}: {first}", flush=True)
    sys.exit(3)
print(f"PEER_STAGES {pipe.num_stages} {time.perf_counter() - start:.3f}", flush=True)
'''

TRAIN_MODEL = '''"""A GPT-2 on the meta device, generated by tools/bench/big_models.py."""

import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, @EXAMPLES@)
from hf_gpt2 import build_gpt2  # noqa: E402

S = @SIZES@


def build_real() -> nn.Module:
    """The model with real weights (GPT-2's own initialisation)."""
    return build_gpt2(n_layer=S["layers"], n_embd=S["width"], n_head=S["heads"],
                      vocab_size=S["vocab"], n_positions=S["positions"])


def build_model() -> nn.Module:
    with torch.device("meta"):
        return build_real()


def _tokens() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, S["vocab"], (S["batch"], S["tokens"] + 1), generator=g)


def example_inputs() -> dict[str, torch.Tensor]:
    return {"input_ids": _tokens()[:, :-1].contiguous()}


def example_targets() -> tuple[torch.Tensor, ...]:
    return (_tokens()[:, 1:].contiguous(),)


def logits_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))


def loss_fn(output, target: torch.Tensor) -> torch.Tensor:
    return logits_loss(output.logits, target)
'''

EAGER_TRAIN = '''"""The eager reference: the whole model, AdamW (tools/bench/big_models.py)."""

import sys
import time

import torch

sys.path.insert(0, sys.argv[1])
import train_model as m  # noqa: E402

start = time.perf_counter()
model = m.build_real()
built = time.perf_counter()
optimizer = torch.optim.AdamW(model.parameters(), lr=m.S["lr"])
inputs, targets = m.example_inputs(), m.example_targets()
for _ in range(m.S["steps"]):
    loss = m.loss_fn(model(**inputs), *targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
print(f"EAGER build {built - start:.3f} steps {time.perf_counter() - built:.3f} "
      f"loss {loss.item():.4f}", flush=True)
'''

PEER_TRAIN = '''"""torch.distributed.pipelining's documented flow (tools/bench/big_models.py):
every rank builds the whole model, pipeline() splits it, build_stage() keeps its stage."""

import gc
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline

sys.path.insert(0, sys.argv[1])
import train_model as m  # noqa: E402

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
S = m.S
try:
    times = {}
    start = time.perf_counter()
    model = m.build_real()  # the whole model, on every rank
    times["build"] = time.perf_counter() - start
    ids, target = m.example_inputs()["input_ids"], m.example_targets()[0]
    micro = ids[: S["batch"] // S["microbatches"]]
    per = S["layers"] // world
    split = {f"transformer.h.{k * per}": SplitPoint.BEGINNING for k in range(1, world)}
    start = time.perf_counter()
    pipe = pipeline(model, mb_args=(micro,), split_spec=split)
    stage = pipe.build_stage(rank, torch.device("cpu"))
    times["split"] = time.perf_counter() - start
    del model, pipe
    gc.collect()
    schedule = ScheduleGPipe(stage, n_microbatches=S["microbatches"], loss_fn=m.logits_loss)
    optimizer = torch.optim.AdamW(stage.submod.parameters(), lr=S["lr"])
    start = time.perf_counter()
    for _ in range(S["steps"]):
        losses = []
        if rank == 0:
            schedule.step(ids)
        elif rank == world - 1:
            schedule.step(target=target, losses=losses)
        else:
            schedule.step()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    times["steps"] = time.perf_counter() - start
    if rank == 0:
        print("PEER_TIMES " + " ".join(f"{k} {v:.3f}" for k, v in times.items()), flush=True)
except Exception as err:  # reported by the benchmark, not a crash
    first = (str(err).strip().splitlines() or [""])[0][:250]
    print(f"PEER_ERROR rank {rank}: {type(err).__name__}: {first}", flush=True)
    raise
dist.destroy_process_group()
'''

SHARD_MODEL = '''"""examples/hf_gpt2.build_gpt2() on the meta device (tools/bench/big_models.py)."""

import sys

import torch
from torch import nn

sys.path.insert(0, @EXAMPLES@)
from hf_gpt2 import build_gpt2, example_inputs, example_targets, loss_fn  # noqa: E402,F401


def build_model() -> nn.Module:
    with torch.device("meta"):
        return build_gpt2()
'''


def fill(template: str, **values: object) -> str:
    for key, value in values.items():
        template = template.replace(f"@{key}@", repr(value))
    return template


# --------------------------------------------------------------------------- part 1


def part_compile7b(tmp: Path, sizes: CompileSizes, part: PartResult) -> None:
    """Compile the meta Llama with pipecompile and split it with pipeline(): time, RSS."""
    model = EXAMPLES / sizes.model
    out = tmp / "out"
    log(f"compile7b: pipecompile {sizes.model} --stages {sizes.stages} ...")
    split = ["--stages", str(sizes.stages), "--microbatches", str(sizes.microbatches)]
    ours = pipecompile_measured(ROOT, sizes.quick, str(model), *split, "-o", str(out), "-q")
    print(f"\n## compile7b: {sizes.model} on the meta device into {sizes.stages} stages\n")
    print(f"pipecompile: {shown(ours.command)}")
    require(ours, "pipecompile compile", part)
    size, count = directory_bytes(out)
    weights = json.loads((out / "manifest.json").read_text()).get("weights", {})

    script = tmp / "peer_split.py"
    script.write_text(PEER_SPLIT)
    log("compile7b: pipeline() ...")
    here = partial(script_here, script, str(model), str(sizes.stages), str(sizes.every))
    theirs = measured_unless_quick([sys.executable, *map(str, here.args)], ROOT, sizes.quick, here)
    split = [ln.split() for ln in theirs.stdout.splitlines() if ln.startswith("PEER_STAGES ")]
    if theirs.rc == 0 and split:
        peer_note = f"{split[0][1]} stages (pipeline() itself {float(split[0][2]):.1f} s)"
    else:
        peer_note = f"FAILED: {theirs.first_error()}"
    print(
        f"pipelining:  pipeline(model, mb_args=(1 x T ids,), split_spec=a split every "
        f"{sizes.every} layer(s)), model built on meta: {peer_note}\n"
    )
    print("| system | wall (s) | peak RSS | written |\n|---|---:|---:|---|")
    print(f"| pipecompile | {ours.wall:.1f} | {gib(ours.peak_kib)} | {size} bytes in {count} "
          f"files (weights: {weights.get('source')}) |")  # fmt: skip
    print(f"| torch.distributed.pipelining | {theirs.wall:.1f} | {gib(theirs.peak_kib)} "
          f"| nothing (in memory) |")  # fmt: skip
    goal = "met" if ours.wall < 30 and (ours.peak_kib or 0) * 1024 < 2 * GIB else "NOT met"
    goal = NOT_JUDGED if sizes.quick else goal
    print(f"\ngoal (under 30 s and 2 GiB): {goal}")
    part.rows += [
        ("pipecompile", f"{ours.wall:.1f} s, peak RSS {gib(ours.peak_kib)}, {size} bytes "
                        f"written; goal {goal}"),
        ("pipelining", f"{theirs.wall:.1f} s, peak RSS {gib(theirs.peak_kib)}; {peer_note}"),
    ]  # fmt: skip


# --------------------------------------------------------------------------- part 2


def parameter_count(sizes: TrainSizes) -> int:
    """GPT-2's parameters (the LM head is tied to the token embedding)."""
    d, v = sizes.width, sizes.vocab
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    return v * d + sizes.positions * d + sizes.layers * block + 2 * d


def part_train_memory(tmp: Path, sizes: TrainSizes, part: PartResult) -> None:
    """Per-rank peak RSS of ``run --nproc`` against the eager process and the peer's ranks."""
    (tmp / "train_model.py").write_text(fill(TRAIN_MODEL, EXAMPLES=str(EXAMPLES),
                                             SIZES=asdict(sizes)))  # fmt: skip
    params = parameter_count(sizes)
    out = tmp / "out"
    print(f"\n## train_memory: GPT-2 ({sizes.layers} layers, n_embd {sizes.width}, vocab "
          f"{sizes.vocab}): {params / 1e6:.1f} M parameters, {params * 4 / 1e9:.2f} GB fp32; "
          f"batch {sizes.batch} x {sizes.tokens}, {sizes.microbatches} micro-batches, "
          f"{sizes.stages} stages balanced on {sizes.balance}, {sizes.steps} AdamW step(s) "
          f"(lr {sizes.lr:g})\n")  # fmt: skip
    log("train_memory: compiling ...")
    split = ["--stages", str(sizes.stages), "--microbatches", str(sizes.microbatches)]
    split += ["--balance", sizes.balance]
    model = str(tmp / "train_model.py")
    compiled = pipecompile_measured(tmp, sizes.quick, model, *split, "-q", "-o", str(out))
    print(f"compile: {shown(compiled.command)}: {compiled.wall:.1f} s, peak RSS "
          f"{gib(compiled.peak_kib)}")  # fmt: skip
    require(compiled, "pipecompile compile", part)

    log("train_memory: pipecompile run --nproc ...")
    # each rank records its own peak RSS (getrusage) in the metrics file's step records: the
    # ranks are forked from one starter, so /proc cannot tell them from it by command line
    metrics = tmp / "train_metrics.jsonl"
    run = measured(pipecompile_command("run", str(out), "--nproc", str(sizes.stages), "--steps",
                                       str(sizes.steps), "--lr", str(sizes.lr), "-q",
                                       "--metrics", str(metrics)), tmp)  # fmt: skip
    print(f"run:     {shown(run.command)}: {run.wall:.1f} s")
    require(run, "pipecompile run --nproc", part)
    steps = [json.loads(ln) for ln in metrics.read_text().splitlines()]
    last = [r for r in steps if r["kind"] == "train"][-1]
    ours = {rank: peak // 1024 for rank, peak in enumerate(last["peak_memory"])}

    reference = tmp / "eager.py"
    reference.write_text(EAGER_TRAIN)
    log("train_memory: eager ...")
    here = partial(script_here, reference, str(tmp))
    eager = measured_unless_quick([sys.executable, *map(str, here.args)], tmp, sizes.quick, here)
    if eager.rc:
        raise RuntimeError(f"the eager reference failed: {eager.first_error()}")
    detail = next((ln[6:] for ln in eager.stdout.splitlines() if ln.startswith("EAGER ")), "")
    print(f"eager:   one process, the whole model: {eager.wall:.1f} s ({detail}), peak RSS "
          f"{gib(eager.peak_kib)}")  # fmt: skip

    script = tmp / f"peer_train_{uuid.uuid4().hex[:8]}.py"
    script.write_text(PEER_TRAIN)
    log("train_memory: torch.distributed.pipelining ...")
    peer, theirs = polled(torchrun_command(sizes.stages, str(script), str(tmp)), script.name, tmp)
    peer_times = next((ln[11:] for ln in peer.stdout.splitlines()
                       if ln.startswith("PEER_TIMES ")), "")  # fmt: skip
    peer_note = f"ok, rank 0: {peer_times}" if peer.rc == 0 else f"FAILED: {peer.first_error()}"
    print(
        f"peer:    torchrun --nproc-per-node={sizes.stages} (every rank builds the whole "
        f"model, pipeline(), build_stage(), ScheduleGPipe): {peer.wall:.1f} s; {peer_note}"
    )

    base = eager.peak_kib or 0
    print("\n| rank | pipecompile peak RSS | / eager (goal ≤ 0.4) | pipelining peak RSS "
          "| / eager |\n|---:|---:|---:|---:|---:|")  # fmt: skip
    for rank in range(sizes.stages):
        a, b = ours.get(rank), theirs.get(rank)
        ra = f"{a / base:.2f}" if a and base else "n/a"
        rb = f"{b / base:.2f}" if b and base else "n/a"
        print(f"| {rank} | {gib(a)} | {ra} | {gib(b)} | {rb} |")
    print(f"| eager (1 process) | {gib(base)} | 1.00 | | |")
    print(f"\nwall time: pipecompile run {run.wall:.1f} s, eager {eager.wall:.1f} s, "
          f"pipelining {peer.wall:.1f} s (each the whole command)")  # fmt: skip
    worst = max(ours.values(), default=0) / base if base else float("nan")
    goal = "met" if worst <= 0.4 and len(ours) == sizes.stages else "NOT met"
    goal = NOT_JUDGED if sizes.quick else goal
    if len(ours) != sizes.stages:
        print(f"note: polling saw {len(ours)} of {sizes.stages} pipecompile ranks")
    print(f"largest pipecompile rank / eager: {worst:.2f}: goal (≤ 0.4) {goal}")
    part.rows += [
        ("pipecompile run", f"{run.wall:.1f} s; largest rank {gib(max(ours.values(), default=0))}"
                            f" = {worst:.2f} x eager; goal {goal}"),
        ("eager", f"{eager.wall:.1f} s, peak RSS {gib(eager.peak_kib)}"),
        ("pipelining", f"{peer.wall:.1f} s; largest rank "
                       f"{gib(max(theirs.values(), default=0))}; "
                       f"{'ok' if peer.rc == 0 else peer_note}"),
    ]  # fmt: skip


# --------------------------------------------------------------------------- part 3


def step(steps: dict[str, float], name: str, fn: Callable[[], object]) -> object:
    """``fn()``, its seconds kept in ``steps`` under ``name``."""
    steps[name], value = timed(fn)
    return value


def part_hf_shards(tmp: Path, sizes: ShardSizes, part: PartResult) -> None:
    """Sharded HF checkpoint -> meta compile with --weights -> inference -> export."""
    import torch
    from transformers import GPT2LMHeadModel

    import pipecompile

    use_examples()
    from hf_gpt2 import build_gpt2, example_inputs

    steps: dict[str, float] = {}
    ck, out, exported = tmp / "ck", tmp / "out", tmp / "exported"
    print(f"\n## hf_shards: build_gpt2() from a sharded HF checkpoint, {sizes.stages} stages\n")

    def save() -> torch.nn.Module:
        model = build_gpt2()
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.uniform_(-0.1, 0.1, generator=g)
        model.save_pretrained(ck, max_shard_size=sizes.shard_size)
        return model

    log("hf_shards: save_pretrained ...")
    saved = step(steps, "save_pretrained", save)
    shards = sorted(p.name for p in ck.glob("model-*.safetensors"))
    print(
        f"save_pretrained(max_shard_size={sizes.shard_size!r}): {len(shards)} shards "
        f"({'as expected' if len(shards) == sizes.shards else f'expected {sizes.shards}'})"
    )
    (tmp / "gpt2_meta.py").write_text(fill(SHARD_MODEL, EXAMPLES=str(EXAMPLES)))
    log("hf_shards: compiling ...")
    model = str(tmp / "gpt2_meta.py")
    split = ["--stages", str(sizes.stages), "--weights", str(ck)]
    compiled = pipecompile_measured(tmp, sizes.quick, model, *split, "-o", str(out), "-q")
    steps["compile --weights"] = compiled.wall
    print(f"compile: {shown(compiled.command)}: {compiled.wall:.1f} s")
    require(compiled, "pipecompile compile --weights", part)
    weights = json.loads((out / "manifest.json").read_text()).get("weights", {})
    print(f"manifest weights: source {weights.get('source')}, "
          f"{len(weights.get('shards', []))} shards read")  # fmt: skip

    ids = example_inputs()["input_ids"]
    pipe = step(steps, "pipecompile.load", lambda: pipecompile.load(out))
    got = step(steps, "pipeline inference", lambda: pipe(input_ids=ids).logits)  # type: ignore[attr-defined]
    ref_model = step(steps, "from_pretrained(ck)",
                      lambda: GPT2LMHeadModel.from_pretrained(ck).eval())  # fmt: skip
    with torch.no_grad():
        want = ref_model(input_ids=ids).logits  # type: ignore[operator]
    diff = (got - want).abs().max().item()
    same = torch.equal(got, want)
    print(f"inference on {tuple(ids.shape)} ids vs from_pretrained(ck).eval(): max |diff| "
          f"{diff:.3g}, torch.equal {same}")  # fmt: skip
    part.rows.append(("inference", f"max |diff| {diff:.3g}, torch.equal {same}"))
    if not same and diff > 1e-5:
        part.failures.append(f"logits differ from from_pretrained(ck): max |diff| {diff:.3g}")

    log("hf_shards: export ...")
    export = pipecompile_measured(
        tmp, sizes.quick, "export", str(out), "-o", str(exported), "--shard-size", sizes.shard_size
    )
    steps["export"] = export.wall
    print(f"export:  {shown(export.command)}: {export.wall:.1f} s")
    try:
        require(export, "pipecompile export", part)
    finally:
        print_steps(steps)
    written = sorted(p.name for p in exported.glob("model-*.safetensors"))
    back = step(steps, "from_pretrained(exported)",
                 lambda: GPT2LMHeadModel.from_pretrained(exported).state_dict())  # fmt: skip
    original = saved.state_dict()  # type: ignore[attr-defined]
    equal = sum(k in back and torch.equal(back[k], v) for k, v in original.items())  # type: ignore[operator]
    extra = sorted(set(back) - set(original))  # type: ignore[arg-type]
    print(f"exported {len(written)} shards; from_pretrained(exported).state_dict() == the saved "
          f"model's: {equal}/{len(original)} tensors bit for bit"
          f"{f', {len(extra)} extra' if extra else ''}")  # fmt: skip
    if equal != len(original):
        part.failures.append(f"export round trip: {equal}/{len(original)} tensors equal")
    print_steps(steps)
    part.rows.append(("export", f"{len(written)} shards; {equal}/{len(original)} tensors equal"))


def print_steps(steps: dict[str, float]) -> None:
    print("\n| step | seconds |\n|---|---:|")
    for name, seconds in steps.items():
        print(f"| {name} | {seconds:.2f} |")


# --------------------------------------------------------------------------- main


def run_part(name: str, body: Callable[[Path, PartResult], None]) -> PartResult:
    """Run one part in a temporary directory of its own; a crash is reported, not raised."""
    part = PartResult(name)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"bench-big-models-{name}-") as tmp:
        TMP_SHOWN[0] = tmp
        try:
            body(Path(tmp), part)
        except PipecompileFailed:
            pass  # already reported, with the command and its error
        except Exception as err:
            traceback.print_exc()
            part.failures.append(f"crashed: {type(err).__name__}: {err}")
    part.seconds = time.perf_counter() - start
    print(f"\n({name}: {part.seconds:.0f} s)", flush=True)
    return part


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every part on tiny sizes")
    parser.add_argument(
        "--parts",
        nargs="+",
        default=list(PARTS),
        metavar="PART",
        help=f"which parts to run, of {', '.join(PARTS)} (default: all)",
    )
    args = parser.parse_args()
    parts = [p for item in args.parts for p in item.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if not sys.platform.startswith("linux"):
        print("this benchmark reads /proc: Linux only", file=sys.stderr)
        return 2
    compile_sizes = QUICK_COMPILE if args.quick else CompileSizes()
    train_sizes = QUICK_TRAIN if args.quick else TrainSizes()
    shard_sizes = QUICK_SHARDS if args.quick else ShardSizes()
    bodies = {
        "compile7b": lambda tmp, part: part_compile7b(tmp, compile_sizes, part),
        "train_memory": lambda tmp, part: part_train_memory(tmp, train_sizes, part),
        "hf_shards": lambda tmp, part: part_hf_shards(tmp, shard_sizes, part),
    }
    print(f"machine: {machine()}")
    print(f"command: {command()}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results = [run_part(name, bodies[name]) for name in PARTS if name in parts]
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\n## Summary\n\n| part | seconds | what | result |\n|---|---:|---|---|")
    for part in results:
        for what, figures in part.rows:
            print(f"| {part.name} | {part.seconds:.0f} | {what} | {figures} |")
        for failure in part.failures:
            print(f"| {part.name} | {part.seconds:.0f} | FAILED | {failure} |")
    failed = [p.name for p in results if p.failures]
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
