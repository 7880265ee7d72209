"""Pipelined decoding: `pipecompile generate --nproc 2` with 1, 2 and 4 lanes against Hugging
Face ``generate`` in one process, on the same cores, in one alternated run.

The model is GPT-2-shaped (12 layers, width 768, 12 heads, GPT-2's vocabulary of 50257) with
random weights, compiled from Python into 2 stages with ``generate=True`` and a 160-token cache
(``max_length``), once per lane count: 1 lane of 16 rows (a sequential pipeline: one group of
sequences goes down the stages, each stage idles while the other works), 2 lanes of 8 rows, 4
lanes of 4 rows. 16 prompts of 32-96 random tokens each get 64 new tokens, greedy.

- **Tokens/s**: the 1024 new tokens over the time from the stages being built to the last
  token (the rate line of `pipecompile generate`, so a fresh interpreter's start-up is not
  counted; the peer is timed around its ``generate`` call alone). Hugging Face batches the 16
  prompts left-padded with an attention mask, on all the cores; each pipecompile rank gets its
  share (one core each here). Goals: 4 lanes >= 1.5x one lane, >= 1.2x Hugging Face.
- **Time to first token**: the first new token of any sequence, measured, beside the one
  predicted from the compile's cost model (each stage's forward cost for the example's tokens,
  scaled to the first lane's prompt tokens: the attention's quadratic part and Python's
  overhead are not in it).
- **KV-cache bytes per stage**: the manifest's ``cache_bytes`` (predicted) beside the bytes of
  the key and value tensors the decode stages allocate (measured); and the bytes of weights
  each rank of `--nproc` holds (its decoding stage, built from the stage files with only its
  own tensors) against the whole model's.
- **In one process**: `pipecompile generate` without ``--nproc`` (the fewest lanes: in one
  process the stages take turns anyway, and each lane's turn reads the weights once), on the
  same cores as Hugging Face.
- **Splits**: the decode split (balanced on the decode step's FLOPs) and the training split,
  each with its slowest stage's share of a token's FLOPs.
- **Compile time**: ``pipecompile.compile`` with and without ``generate=True`` on the same
  model (the median of 3, under ``--quick`` of 1, after one not counted); goal under 1.5x.

On a GPU (``--device cuda``): every pipecompile run with ``--device cuda`` (`--nproc 2` on one
GPU: two processes sharing it, the hidden states through host memory; on two GPUs by NCCL),
Hugging Face on the same GPU with its static cache (``cache_implementation="static"``), and
the compile timed on the CPU as before.

The tokens of every lane count, in one process and on ranks, must be the same (else the
script exits non-zero).

Rerun with::

    python tools/bench/generate.py            # the figures in docs/BENCHMARKS.md
    python tools/bench/generate.py --quick    # a 2-layer model, 4 short prompts, 2 lanes
    python tools/bench/generate.py --device cuda   # on a GPU
"""

from __future__ import annotations

import argparse
import copy
import math
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from common import command, log, machine, pipecompile_done, timed

import pipecompile


@dataclass(frozen=True)
class Setup:
    layers: int
    width: int
    heads: int
    vocab: int
    prompts: int
    shortest: int
    longest: int
    new: int
    repeats: int


FULL = Setup(12, 768, 12, 50257, 16, 32, 96, 64, repeats=3)
QUICK = Setup(2, 64, 4, 1000, 4, 8, 16, 8, repeats=1)
LANES = (1, 2, 4)  # --quick: 2


def _model(s: Setup) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=s.layers, n_embd=s.width, n_head=s.heads, vocab_size=s.vocab,
        n_positions=1024, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    model = GPT2LMHeadModel(config).eval()
    model.config.use_cache = False  # the compile traces the plain forward
    return model


def _prompts(s: Setup) -> list[list[int]]:
    r = random.Random(0)
    lengths = [r.randint(s.shortest, s.longest) for _ in range(s.prompts)]
    return [[r.randrange(1, s.vocab) for _ in range(n)] for n in lengths]


def _compile(model: torch.nn.Module, s: Setup, lanes: int, root: Path) -> Path:
    out = root / f"lanes{lanes}"
    example = {"input_ids": torch.randint(0, s.vocab, (2, s.longest))}
    log(f"compiling: 2 stages, {lanes} lane(s) of {math.ceil(s.prompts / lanes)} rows")
    rows = math.ceil(s.prompts / lanes)
    pipecompile.compile(
        model, example, stages=2, generate=True, max_length=s.longest + s.new, lanes=lanes,
        lane_rows=rows, directory=out,
    )  # fmt: skip
    return out


_RATE = re.compile(r"in ([\d.]+) s: [\d.]+ tokens/s, first token after (\d+) ms")


def _ours(
    directory: Path, prompts_file: Path, s: Setup, nproc: int | None, device: str
) -> tuple[float, float, list[str]]:
    """(tokens/s, first token in ms, the printed sequences) of one `generate --nproc 2` (or
    in one process: ``nproc`` None) on ``device``."""
    argv = ["generate", str(directory), "--prompts", str(prompts_file), "--device", device]
    argv += ["--nproc", str(nproc)] if nproc else []
    done = pipecompile_done(*argv, "--max-new-tokens", str(s.new))
    found = _RATE.search(done.stderr)
    assert found, done.stderr
    seconds, first = float(found.group(1)), float(found.group(2))
    lines = sorted(x for x in done.stdout.splitlines() if x.startswith("["))
    return s.prompts * s.new / seconds, first, lines


def _peer(
    model: torch.nn.Module, prompts: list[list[int]], new: int, device: str
) -> tuple[float, float]:
    """(tokens/s, first token in ms) of Hugging Face ``generate``, the prompts left-padded;
    on a GPU with its static cache."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    static = {"cache_implementation": "static"} if device != "cpu" else {}

    def run(tokens: int) -> torch.Tensor:
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                do_sample=False, pad_token_id=0, use_cache=True, **static,
            )  # fmt: skip
        if device != "cpu":
            torch.cuda.synchronize()
        return out

    first, _ = timed(run, 1)
    seconds, out = timed(run, new)
    assert out.shape[1] == width + new
    return len(prompts) * new / seconds, first * 1000


def _predicted_first_ms(directory: Path, first_lane_tokens: int) -> float:
    """The cost model's time to first token: every stage's forward for the example's tokens,
    scaled to the first lane's prompt tokens."""
    m = pipecompile.load(directory).manifest
    example_tokens = math.prod(m.input_values[0].shape)  # one micro-batch of the example
    compute = sum(m.balance.stage_compute)  # ns: that micro-batch through every stage
    return compute * first_lane_tokens / example_tokens / 1e6


def _stages(directory: Path) -> list:  # the decoding stages a rank builds, each alone
    from pipecompile.generation.rank_model import WeightSource, rank_stage
    from pipecompile.generation.session import plan_of
    from pipecompile.ir.records.manifest import read_manifest

    manifest = read_manifest(directory)
    plan = plan_of(directory, manifest)
    source = WeightSource("directory", directory, manifest)
    return [rank_stage(directory, plan, k, source) for k in range(plan.stages)]


def _held_bytes(directory: Path) -> list[int]:
    """Per rank of `--nproc`: the bytes of the weights its decoding stage holds (built from
    the stage files, given only its own tensors)."""
    held = []
    for stage in _stages(directory):
        module = stage.modules["decode"]
        tensors = {id(t): t for t in module.state_dict(keep_vars=True).values()}
        held.append(sum(t.nbytes for t in tensors.values()))
    return held


def _cache_bytes(directory: Path) -> list[tuple[int, int]]:
    """Per stage: (predicted bytes from the manifest, bytes the decode stages allocate)."""
    from pipecompile.generation.session import plan_of
    from pipecompile.ir.records.manifest import read_manifest

    plan = plan_of(directory, read_manifest(directory))
    return [(plan.cache_bytes(k), st.cache_bytes) for k, st in enumerate(_stages(directory))]


def _splits(directory: Path) -> list[str]:
    """The decode split and the training split, as `show` prints them."""
    from pipecompile.generation.session import plan_of
    from pipecompile.ir.records.manifest import read_manifest

    plan = plan_of(directory, read_manifest(directory))
    return [line.strip() for line in plan.lines() if "split:" in line]


def _compile_times(model: torch.nn.Module, s: Setup, root: Path) -> tuple[float, float]:
    """Seconds of a plain compile and of one with ``generate=True`` (the median of
    ``s.repeats``, each written to its own directory; the first compile of the run is not
    counted)."""
    example = {"input_ids": torch.randint(0, s.vocab, (2, s.longest))}
    times: dict[bool, list[float]] = {False: [], True: []}
    for k in range(s.repeats + 1):
        for generate in (False, True):
            start = time.perf_counter()
            cache = {"max_length": s.longest + s.new} if generate else {}
            pipecompile.compile(
                model, example, stages=2, generate=generate, directory=root / f"timed{k}{generate}",
                **cache,
            )  # fmt: skip
            if k:
                times[generate].append(time.perf_counter() - start)
    return statistics.median(times[False]), statistics.median(times[True])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model: every path, fast")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where both decode (default cpu)"
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no GPU here")
    s = QUICK if args.quick else FULL
    tried = LANES[1:2] if args.quick else LANES
    torch.set_num_threads(2 if (torch.get_num_threads() >= 2) else 1)
    model = _model(s)
    prompts = _prompts(s)
    with tempfile.TemporaryDirectory(prefix="pipecompile-bench-generate-") as tmp:
        root = Path(tmp)
        prompts_file = root / "prompts.txt"
        prompts_file.write_text("\n".join(",".join(map(str, p)) for p in prompts) + "\n")
        dirs = {lanes: _compile(model, s, lanes, root) for lanes in tried}
        peer = copy.deepcopy(model).to(args.device)  # the compile traced the model on the CPU
        runs = ["hf", "local", *map(str, tried)]
        rates: dict[str, list[float]] = {k: [] for k in runs}
        firsts: dict[str, list[float]] = {k: [] for k in runs}
        printed: dict[str, list[str]] = {}
        local = tried[0]  # in one process: the fewest lanes (its stages take turns anyway, and
        # a lane's turn reads the weights once: the most rows a turn)
        for r in range(s.repeats):
            log(f"round {r + 1} of {s.repeats}")
            rate, first = _peer(peer, prompts, s.new, args.device)
            rates["hf"].append(rate)
            firsts["hf"].append(first)
            for key, lanes, nproc in [("local", local, None), *((str(k), k, 2) for k in tried)]:
                done = _ours(dirs[lanes], prompts_file, s, nproc, args.device)
                rate, first, printed[key] = done
                rates[key].append(rate)
                firsts[key].append(first)
        same = all(printed[k] == printed["local"] for k in printed)
        predicted = {k: _predicted_first_ms(dirs[k], _first_lane(prompts, k)) for k in tried}
        caches = {k: _cache_bytes(dirs[k]) for k in tried}
        held = _held_bytes(dirs[tried[0]])
        splits = _splits(dirs[tried[0]])
        log("timing the compile with and without generate=True")
        plain, generating = _compile_times(model, s, root)
    whole = sum({id(t): t.nbytes for t in model.state_dict(keep_vars=True).values()}.values())
    _report(s, rates, firsts, predicted, caches, same, local, args.device)
    print(f"weights each rank holds (bytes): {', '.join(map(str, held))} of the model's {whole}")
    print("splits at 2 stages, decode FLOPs per token:")
    print("\n".join(f"  {line}" for line in splits))
    print(
        f"compile: {plain:.2f} s plain, {generating:.2f} s with generate=True "
        f"({generating / plain:.2f}x; goal under 1.5x)"
    )
    return 0 if same else 1


def _first_lane(prompts: list[list[int]], lanes: int) -> int:
    """The prompt tokens of the first lane's prefill: its rows take the first prompts."""
    rows = math.ceil(len(prompts) / lanes)
    return sum(len(p) for p in prompts[:rows])


def _versus(med: dict[str, float], key: str, base: str) -> str:
    """``key``'s rate over ``base``'s, or a dash where ``base`` did not run (--quick)."""
    return f"{med[key] / med[base]:.2f}x" if base in med else "-"


def _report(
    s: Setup,
    rates: dict[str, list[float]],
    firsts: dict[str, list[float]],
    predicted: dict[int, float],
    caches: dict[int, list[tuple[int, int]]],
    same: bool,
    local: int,
    device: str,
) -> None:
    med = {k: statistics.median(v) for k, v in rates.items()}
    first = {k: statistics.median(v) for k, v in firsts.items()}
    print(f"machine: {machine()}")
    print(f"command: {command()}")
    print(
        f"model: GPT-2-shaped, {s.layers} layers, width {s.width}, vocabulary {s.vocab}; "
        f"{s.prompts} prompts of {s.shortest}-{s.longest} tokens, {s.new} new each, greedy; "
        f"median of {s.repeats} alternated round(s); on {device}"
    )
    print()
    print("| run | tokens/s | vs 1 lane | vs Hugging Face | first token (ms) | predicted (ms) |")
    print("|---|---|---|---|---|---|")
    print(f"| Hugging Face generate, 1 process | {med['hf']:.1f} | | 1.00x | {first['hf']:.0f} | |")
    print(
        f"| pipecompile, 1 process, {local} lane(s) | {med['local']:.1f} | | "
        f"{med['local'] / med['hf']:.2f}x | {first['local']:.0f} | |"
    )
    for k in predicted:
        name = f"pipecompile --nproc 2, {k} lane(s)"
        print(
            f"| {name} | {med[str(k)]:.1f} | {_versus(med, str(k), '1')} | "
            f"{med[str(k)] / med['hf']:.2f}x | {first[str(k)]:.0f} | {predicted[k]:.0f} |"
        )
    print()
    print("| lanes | stage | KV cache predicted (bytes) | allocated (bytes) |")
    print("|---|---|---|---|")
    for k, per in caches.items():
        for stage, (want, got) in enumerate(per):
            print(f"| {k} | {stage} | {want} | {got} |")
    print()
    said = "yes" if same else "NO"
    print(f"the same tokens at every lane count, in one process and on ranks: {said}")
    if not same:
        print("pipecompile: the lane counts generated different tokens", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
