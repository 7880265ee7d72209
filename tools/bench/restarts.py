"""Benchmark runs that lose ranks: `run --max-restarts` under injected faults against the run
that never failed (bit for bit), beside torchrun's own restarts, and the stall of a background
save against a synchronous one.

Three parts, in one run:

1. **Soak.** A GPT (the project's example with dropout 0.1, 4 layers of width 64, a 7-batch
   data hook) trained 200 steps with ``--seed 0 --save-every 5 --max-restarts 10`` on
   ``--nproc 4`` as 4 stages, and as 2 stages x ``--dp 2`` with ``--async-save``, while
   ``PIPECOMPILE_FAULT`` injects six faults (kills, errors, a hang past ``--timeout 3``, a kill
   inside a save) at mixed ranks and steps. Each faulted run's final weights and AdamW state
   are compared with its unfailed twin's, tensor by tensor (goal: 0 differences). Per fault:
   the steps lost (done again after the restart), the time from the failure to the first new
   step (the last step record before the restart to the first after it; a hang includes its
   ``--timeout``; goal: under 10 s for the others).
2. **Peer: torchrun's elastic agent** (``torchrun --standalone --max-restarts 10``) restarting
   the same ranks (``python -m pipecompile.runtime.distributed.worker``, which resumes from
   ``--save`` after a torchrun restart) under the same faults of the 4-stage layout: its final
   weights against the unfailed run, and each restart's time, measured the same way.
3. **Background saves.** The 24-layer GPT-2-sized model of the throughput benchmarks (the
   project's GPT, width 256, 64 tokens) on 2 stages in one process, 6 steps saving after each,
   synchronous and ``--async-save`` alternating (3 runs each): the median time a step waits
   for a save (the metrics file's ``save`` records, the first save of each run left out), and
   the asynchronous one's share of the synchronous one (goal: at most 20%).

4. **Every schedule and training option.** The soak's model, 10 steps saving every 2, killed
   inside the save after step 6 (``1:6:save:kill``) and restarted: every schedule of the
   registry (2 stages on 2 ranks; the looped and V-shaped ones 4 stages on 2), and 1f1b with
   ``--accumulate 2``, ``--precision bf16``, ``--dp 2 --shard optimizer`` and ``--dp 2 --shard
   grads`` (4 ranks): the tensors that differ from the unfailed run (goal: 0 everywhere; the
   asynchronous pipedream schedules drain every step, so their saved state is all there is).

A tensor that differs from the run that never failed makes the script exit non-zero, under
``--quick`` too (its figures are not judged; its exactness is).

Rerun with::

    python tools/bench/restarts.py            # the figures in docs/BENCHMARKS.md
    python tools/bench/restarts.py --quick    # 2 ranks, 8 steps, 2 faults, a tiny model, one
                                              # case of part 4: every path, no goal judged
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from common import EXAMPLES, GPT2Sizes, command, log, machine, pipecompile_done, run_checked

from pipecompile.runtime.training.model_keyed import read_model_keyed

MODEL = """
import sys
sys.path.insert(0, {examples!r})
import torch
from gpt import build_gpt, loss_fn


def build_model():
    return build_gpt(n_layer={layers}, n_embd={width}, n_head={heads}, vocab_size={vocab},
                     block_size={tokens}, dropout={dropout})


def build_untied_model():  # PipeDream's per-stage updates refuse a tied weight
    model = build_model()
    model.lm_head.weight = torch.nn.Parameter(model.wte.weight.detach().clone())
    return model


def _tokens(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, {vocab}, (n, {batch}, {tokens} + 1), generator=g)


def example_inputs():
    return (_tokens(1, 0)[0, :, :-1],)


def example_targets():
    return (_tokens(1, 0)[0, :, 1:],)


def train_batches():
    for tokens in _tokens({batches}, 1):
        yield (tokens[:, :-1],), (tokens[:, 1:],)
"""


@dataclass(frozen=True)
class Soak:
    """One faulted run against its unfailed twin."""

    label: str
    stages: int
    nproc: int
    extra: tuple[str, ...]  # --dp, --async-save
    faults: str
    steps: int = 200
    every: int = 5


SOAKS = (
    Soak("4 stages, --nproc 4", 4, 4, (),
         "1:17:1B0:kill,3:41:3F1:raise,2:88:2F0:hang,0:120:save:kill,3:150:3B1:kill,0:176:0F1:raise"),
    Soak("2 stages x --dp 2, --async-save", 2, 4, ("--dp", "2", "--async-save"),
         "1:17:1B0:kill,2:41:0F1:raise,3:88:1F0:hang,0:120:save:kill,3:150:1B1:kill,0:176:0F1:raise"),
)  # fmt: skip
QUICK_SOAKS = (Soak("2 stages, --nproc 2", 2, 2, ("--async-save",), "1:3:1B0:kill,0:4:save:raise",
                    steps=8, every=2),)  # fmt: skip
SMALL = {"layers": 4, "width": 64, "heads": 2, "vocab": 256, "tokens": 32, "batch": 8}
TINY = {"layers": 2, "width": 32, "heads": 2, "vocab": 64, "tokens": 8, "batch": 4}
TIMEOUT = "3"


def model_file(root: Path, name: str, sizes: dict, dropout: float = 0.1) -> Path:
    path = root / f"{name}.py"
    text = MODEL.format(examples=str(EXAMPLES), dropout=dropout, batches=7, **sizes)
    path.write_text(text)
    return path


def compiled(root: Path, model: Path, stages: int) -> Path:
    out = root / f"{model.stem}_{stages}"
    if not out.exists():
        pipecompile_done(str(model), "--stages", str(stages), "--microbatches", "4", "-q",
                         "-o", str(out))  # fmt: skip
    return out


def state(step_dir: Path) -> dict[str, torch.Tensor]:
    """The saved weights and optimizer state, one entry a tensor."""

    def flat(tree: dict, prefix: str = "") -> dict:
        out: dict = {}
        for key, value in tree.items():
            if isinstance(value, dict):
                out.update(flat(value, f"{prefix}{key}."))
            else:
                out[prefix + key] = value
        return out

    return {k: v for k, v in flat(read_model_keyed(step_dir)).items() if torch.is_tensor(v)}


def differences(a: Path, b: Path) -> tuple[int, int]:
    """(tensors that differ, tensors compared) between two saved steps."""
    sa, sb = state(a), state(b)
    assert sa.keys() == sb.keys(), "the two runs saved different entries"
    return sum(not torch.equal(sa[k], sb[k]) for k in sa), len(sa)


def records(metrics: Path) -> list[dict]:
    return (
        [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    )


def restarts_of(lines: list[dict]) -> list[dict]:
    """Per restart: its record, the steps lost and the seconds from the failure (the last step
    record before it) to the first new step record."""
    found = []
    for k, record in enumerate(lines):
        if record["kind"] != "restart":
            continue
        before = [r for r in lines[:k] if r["kind"] == "train"]
        after = next((r for r in lines[k + 1 :] if r["kind"] == "train"), None)
        failed = record.get("failed_step")  # unknown to a torchrun restart
        lost = "-" if failed is None else max(0, failed - 1 - record["resumed_from"])
        gap = after["time"] - before[-1]["time"] if before and after else float("nan")
        found.append({**record, "lost": lost, "seconds": gap})
    return found


def soak(root: Path, soak: Soak, model: Path) -> dict:
    out = compiled(root, model, soak.stages)
    common = ["run", str(out), "--nproc", str(soak.nproc), "--steps", str(soak.steps), "-q",
              "--save-every", str(soak.every), "--seed", "0", "--timeout", TIMEOUT,
              *soak.extra]  # fmt: skip
    tag = soak.label.split(",")[0].replace(" ", "")
    clean, faulted = root / f"clean{tag}", root / f"faulted{tag}"
    pipecompile_done(*common, "--save", str(clean), "--metrics", str(root / f"{tag}c.jsonl"))
    os.environ["PIPECOMPILE_FAULT"] = soak.faults
    try:
        done = pipecompile_done(*common, "--save", str(faulted), "--max-restarts", "10",
                                "--metrics", str(root / f"{tag}f.jsonl"))  # fmt: skip
    finally:
        del os.environ["PIPECOMPILE_FAULT"]
    final = f"step_{soak.steps}"
    diff, total = differences(clean / final, faulted / final)
    shown = [ln for ln in done.stderr.splitlines() if "restart" in ln]
    return {"diff": diff, "total": total, "restarts": restarts_of(records(root / f"{tag}f.jsonl")),
            "lines": shown}  # fmt: skip


def peer(root: Path, soak: Soak, model: Path, faults: str) -> dict:
    """``faults`` (the soak's, or under --quick its first) restarted by torchrun's agent."""
    out = compiled(root, model, soak.stages)
    save, metrics, fired = root / "torchrun", root / "torchrun.jsonl", root / "fired"
    fired.mkdir()
    worker = ["-m", "pipecompile.runtime.distributed.worker", str(out), "--steps",
              str(soak.steps), "--save-every", str(soak.every), "--seed", "0", "--timeout",
              TIMEOUT, "--quiet", "--save", str(save), "--metrics", str(metrics),
              *soak.extra]  # fmt: skip
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={soak.nproc}",
                "--max-restarts", "10"]  # fmt: skip
    run_checked([sys.executable, *launcher, *worker], timeout=1800, OMP_NUM_THREADS="1",
                PIPECOMPILE_FAULT=faults, PIPECOMPILE_FAULT_FIRED=str(fired))  # fmt: skip
    tag = soak.label.split(",")[0].replace(" ", "")
    final = f"step_{soak.steps}"
    diff, total = differences(root / f"clean{tag}" / final, save / final)
    return {"diff": diff, "total": total, "restarts": restarts_of(records(metrics))}


def save_stalls(root: Path, quick: bool) -> dict[str, list[float]]:
    """Median stall per save (ms) of each run, synchronous and background alternating."""
    g = GPT2Sizes()
    sizes = TINY if quick else {"layers": g.layers, "width": g.width, "heads": g.heads,
                                "vocab": g.vocab, "tokens": g.tokens, "batch": 4}  # fmt: skip
    out = compiled(root, model_file(root, "gpt2_24", sizes, dropout=0.0), 2)
    steps, runs = (3, 1) if quick else (6, 3)
    got: dict[str, list[float]] = {"synchronous": [], "--async-save": []}
    for k in range(runs):
        for mode in got:
            metrics = root / f"save{mode}{k}.jsonl"
            extra = ["--async-save"] if mode != "synchronous" else []
            save = root / f"s{mode}{k}"
            pipecompile_done("run", str(out), "--steps", str(steps), "--save", str(save),
                             "--save-every", "1", "--metrics", str(metrics), "-q",
                             *extra)  # fmt: skip
            stalls = [r["stall_ms"] for r in records(metrics) if r["kind"] == "save"][1:]
            got[mode].append(statistics.median(stalls))
    return got


def matrix_cases(quick: bool) -> list[tuple[str, str, tuple[str, ...]]]:
    """(label, schedule, run options) of part 4."""
    from pipecompile.schedules import ORDER

    if quick:
        return [("gpipe, --accumulate 2 --precision bf16", "gpipe",
                 ("--accumulate", "2", "--precision", "bf16"))]  # fmt: skip
    cases = [(name, name, ()) for name in ORDER]
    cases += [(f"1f1b, {' '.join(extra)}", "1f1b", extra) for extra in (
        ("--accumulate", "2"), ("--precision", "bf16"), ("--dp", "2", "--shard", "optimizer"),
        ("--dp", "2", "--shard", "grads"))]  # fmt: skip
    return cases


def matrix(root: Path, model: Path, quick: bool) -> Iterator[tuple[str, int, int]]:
    """Per case of part 4, as it ends: its label, the tensors that differ, those compared."""
    from pipecompile.schedules import REGISTRY

    for k, (label, schedule, extra) in enumerate(matrix_cases(quick)):
        record = REGISTRY[schedule]
        stages = 2 if record.placement == "one" else 4
        builder = "" if record.synchronous else ":build_untied_model"
        out = root / f"m_{schedule}"
        if not out.exists():
            pipecompile_done(f"{model}{builder}", "--stages", str(stages), "--microbatches", "4",
                             "-q", "--schedule", schedule, "-o", str(out))  # fmt: skip
        copies = int(extra[extra.index("--dp") + 1]) if "--dp" in extra else 1
        common = ["run", str(out), "--nproc", str(2 * copies), "--steps", "10", "--save-every",
                  "2", "--seed", "0", "-q", "--timeout", TIMEOUT, *extra]  # fmt: skip
        pipecompile_done(*common, "--save", str(root / f"mc{k}"))
        os.environ["PIPECOMPILE_FAULT"] = "1:6:save:kill"
        try:
            pipecompile_done(*common, "--save", str(root / f"mf{k}"), "--max-restarts", "2")
        finally:
            del os.environ["PIPECOMPILE_FAULT"]
        yield (label, *differences(root / f"mc{k}" / "step_10", root / f"mf{k}" / "step_10"))


def report_soak(label: str, got: dict, goal: bool) -> int:
    """Print one faulted run's table; returns the tensors that differ."""
    restarts = got["restarts"]
    verdict = ("met" if got["diff"] == 0 else "NOT met") if goal else "not judged (--quick)"
    print(f"\n{label}: {len(restarts)} restarts; final state: {got['diff']} of {got['total']} "
          f"tensors differ from the unfailed run (goal 0: {verdict})")  # fmt: skip
    columns = ("restart", "failed rank", "step failed in", "resumed from", "steps lost",
               "failure -> next step")  # fmt: skip
    print(f"| {' | '.join(columns)} |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in restarts:
        rank = "-" if r["rank"] is None else r["rank"]
        failed = r.get("failed_step", "-")
        print(f"| {r['restart']} | {rank} | {failed} | {r['resumed_from']} | {r['lost']} | "
              f"{r['seconds']:.1f} s |")  # fmt: skip
    for line in got.get("lines", [])[:12]:
        print(f"    {line}")
    return got["diff"]


def report_stalls(root: Path, quick: bool) -> None:
    stalls = save_stalls(root, quick)
    sync, background = (statistics.median(v) for v in stalls.values())
    share = background / sync
    verdict = ("met" if share <= 0.2 else "NOT met") if not quick else "not judged"
    print("\n24-layer GPT-2-sized model (2 stages, one process), a save after every step:")
    for mode, values in stalls.items():
        print(f"  {mode}: median stall per save {statistics.median(values):.1f} ms "
              f"(runs: {', '.join(f'{v:.1f}' for v in values)})")  # fmt: skip
    print(f"  background / synchronous: {share:.1%} (goal at most 20%: {verdict})")


PARTS = ("soak", "peer", "matrix", "saves")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 ranks, 8 steps: every path")
    parser.add_argument("--part", choices=PARTS, action="append", help="only these parts")
    args = parser.parse_args()
    parts = set(args.part or PARTS)
    differing = 0  # a restart that changes the result fails the run, --quick or not
    print(f"machine: {machine()}")
    print(f"command: {command()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = model_file(root, "soak", TINY if args.quick else SMALL)
        soaks = QUICK_SOAKS if args.quick else SOAKS
        for case in soaks if parts & {"soak", "peer"} else ():  # the peer needs the clean run
            log(f"soak: {case.label}, {case.steps} steps, faults {case.faults} ...")
            differing += report_soak(case.label, soak(root, case, model), not args.quick)
        if "peer" in parts:
            log("the same faults restarted by torchrun's elastic agent ...")
            faults = soaks[0].faults.split(",")[0] if args.quick else soaks[0].faults
            label = f"torchrun --max-restarts 10, {soaks[0].label}"
            differing += report_soak(label, peer(root, soaks[0], model, faults), not args.quick)
        if "matrix" in parts:
            log("every schedule and training option, killed inside a save ...")
            print("\n| schedule, options | tensors differing from the unfailed run |")
            print("|---|---:|")
            for label, diff, total in matrix(root, model, args.quick):
                print(f"| {label} | {diff} of {total} |", flush=True)
                differing += diff
        if "saves" in parts:
            log("save stalls, synchronous and in the background ...")
            report_stalls(root, args.quick)
    if differing:
        raise SystemExit(f"{differing} saved tensors differ from the runs that never failed")


if __name__ == "__main__":
    main()
