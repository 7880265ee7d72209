"""Benchmark the plan search's prices against the devices offered: each model compiled with
``pipecompile MODEL --devices N`` for N = 2 to 8, as a user compiles it (a process each, this
machine's kept calibration, measured first where none is kept), and each manifest's plan
table read back (the chosen plan and its runners-up, each with the ranks it uses and its
predicted step). Prints Markdown tables:

- per model and N, the chosen plan and its predicted step, and whether it is above the best
  plan a search offered fewer devices chose (goal: never);
- per model, the plans the tables of several N show, and how far one plan's prices spread
  across the N that show it, (most - least) / least (goal: 0: a plan is priced by the
  calibration of the ranks it runs on, whatever was offered).

Models: a tiny GPT (examples/gpt.py, 4 layers, width 64, 8 x 32 tokens), a wider one (8
layers, width 128, 16 x 64 tokens), the MLP example and a ResNet (examples/resnet.py, one
block a group, width 16, 16 images of 32 x 32). Rerun with::

    python tools/bench/offered.py          # docs/BENCHMARKS.md's figures (about 5 minutes)
    python tools/bench/offered.py --quick  # the MLP at N = 2 and 3
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from common import command, log, machine, pipecompile_command, run_checked
from model_files import gpt_body, resnet_body, write_model_file

from pipecompile.ir.records.manifest import read_manifest
from pipecompile.ir.records.plan_record import PlanRow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MODELS = {
    "tiny GPT": gpt_body(4, 64, 2, 8, 32, 64),
    "GPT 8 layers": gpt_body(8, 128, 4, 16, 64, 128),
    "ResNet": resnet_body(1, 16, 16),
}

Row = tuple[str, int]  # a plan's flags and the ranks it uses


def compiled_table(model: Path, devices: int, root: Path) -> list[PlanRow]:
    """The rows of the plan table of ``model --devices devices``, the chosen plan first."""
    out = root / f"{model.stem}-{devices}"
    run_checked(pipecompile_command(str(model), "--devices", str(devices), "-o", str(out), "-q"))
    plan = read_manifest(out).plan
    assert plan is not None
    return list(plan.ranked)


def key(row: PlanRow) -> Row:
    return json.dumps(row.flags), int(row.devices_used or 0)


def label(row: PlanRow) -> str:
    looped = f", v {row.virtual_stages}" if row.virtual_stages else ""
    return row.label() + looped


def one_model(name: str, path: Path, counts: list[int], root: Path) -> tuple[int, int, float]:
    """The model's tables; (searches above a smaller one's choice, plans shown at several N,
    the largest spread of one plan's prices)."""
    chosen: dict[int, PlanRow] = {}
    prices: dict[Row, dict[int, float]] = {}
    shown: dict[Row, str] = {}
    for n in counts:
        log(f"{name}: --devices {n}")
        rows = compiled_table(path, n, root)
        chosen[n] = rows[0]
        for row in rows:
            prices.setdefault(key(row), {})[n] = row.predicted_step_s
            shown[key(row)] = label(row)
    print(f"\n### {name}\n")
    print("| --devices | chosen plan | ranks | predicted step | best chosen on fewer | above it |")
    print("|---:|---|---:|---:|---:|---|")
    above = 0
    for n in counts:
        best = chosen[n]
        fewer = [chosen[k].predicted_step_s for k in counts if k < n]
        least = min(fewer) if fewer else None
        worse = least is not None and best.predicted_step_s > least
        above += worse
        before = "" if least is None else f"{least * 1e3:.3f} ms"
        step = f"{best.predicted_step_s * 1e3:.3f} ms"
        print(f"| {n} | {label(best)} | {best.devices_used} | {step} | {before} | "
              f"{'yes' if worse else 'no'} |")  # fmt: skip
    several = {k: v for k, v in prices.items() if len(v) > 1}
    print("\n| plan | ranks | priced at --devices | least | most | spread |")
    print("|---|---:|---|---:|---:|---:|")
    widest = 0.0
    for row, by_n in sorted(several.items(), key=lambda kv: min(kv[1].values())):
        least, most = min(by_n.values()), max(by_n.values())
        spread = (most - least) / least if least else 0.0
        widest = max(widest, spread)
        print(f"| {shown[row]} | {row[1]} | {', '.join(map(str, sorted(by_n)))} | "
              f"{least * 1e3:.3f} ms | {most * 1e3:.3f} ms | {spread:.1%} |")  # fmt: skip
    return above, len(several), widest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="seconds: the MLP at N = 2, 3")
    args = parser.parse_args()
    counts = [2, 3] if args.quick else list(range(2, 9))
    print(f"Command: `{command()}`. {machine()}")
    with tempfile.TemporaryDirectory(prefix="pipecompile-offered-") as tmp:
        root = Path(tmp)
        models = {"MLP example": EXAMPLES / "mlp.py"}
        if not args.quick:
            models |= {
                name: write_model_file(root / f"{name.replace(' ', '_')}.py", body)
                for name, body in MODELS.items()
            }
        summary = [(name, *one_model(name, path, counts, root)) for name, path in models.items()]
    print("\n### Summary\n")
    print("| model | searches choosing above a smaller search's choice | plans shown at several N "
          "| widest spread of one plan's price |")  # fmt: skip
    print("|---|---:|---:|---:|")
    for name, above, several, widest in summary:
        print(f"| {name} | {above} of {len(counts) - 1} | {several} | {widest:.1%} |")


if __name__ == "__main__":
    main()
