"""What the proof at the end of a compile costs, against the compile itself, over the model zoos.

    python tools/bench/proof_cost.py                   # 12 models of each zoo, evenly spaced
    python tools/bench/proof_cost.py --sample 0        # every model of every zoo
    python tools/bench/proof_cost.py --zoo hf --sample 5
    python tools/bench/proof_cost.py --quick           # one model (what the test suite runs)

Each model file is written by the zoo sweep's own templates (tools/qa/zoos: random weights,
dropout off; torchvision and timm installed into ``.zoo/`` as tools/qa/zoo.py says) and compiled
once into 2 stages and 2 micro-batches, one model at a time, with the progress output on. The
compile's time is the sum of its pass lines (trace to insert_replication) and ``emit``; the
proof's is its ``verify`` line; the command's is the wall time of the whole ``pipecompile MODEL``
process (Python's start-up, building the model, the passes, the proof, writing the directory).
Printed per zoo and over all: the median and the worst of verify / compile and of verify /
command, and each model's figures.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, command, log, machine, pipecompile_command, run_checked

sys.path.insert(0, str(ROOT / "tools" / "qa"))  # the zoos package of tools/qa/zoo.py

from zoos import hf_models, install, timm_models, torchvision_models  # noqa: E402
from zoos.common import sample  # noqa: E402

ZOOS = {"torchvision": torchvision_models, "timm": timm_models, "hf": hf_models}
LINE = re.compile(r"^  (\S[\w ]*?)\s+([\d.]+) ms$")  # a progress line: name and milliseconds
NOT_COMPILE = ("verify", "pictures", "schedule")  # lines outside trace .. emit


def timings(stderr: str) -> dict[str, float]:
    """The progress lines of one compile: name -> milliseconds."""
    found = {}
    for line in stderr.splitlines():
        match = LINE.match(line)
        if match:
            found[match.group(1).strip()] = float(match.group(2))
    return found


def measure(model_file: Path, out: Path) -> tuple[float, float, float]:
    """(compile ms, verify ms, the command's wall ms) of one compile of ``model_file``."""
    began = time.perf_counter()
    done = run_checked(
        pipecompile_command(
            str(model_file), "--stages", "2", "--microbatches", "2", "-o", str(out)
        ),
        timeout=900,
        PIPECOMPILE_VERIFY="on",  # what is measured (the test suite turns it off)
    )
    wall = (time.perf_counter() - began) * 1e3
    lines = timings(done.stderr)
    if "verify" not in lines:
        raise SystemExit(f"{model_file}: no verify line in the compile's output")
    compiled = sum(ms for name, ms in lines.items() if name not in NOT_COMPILE)
    return compiled, lines["verify"], wall


def summary(label: str, ratios: list[tuple[float, float]]) -> str:
    """The zoo's row: median and worst of verify / compile, then of verify / command."""
    cells = []
    for k in (0, 1):
        found = [r[k] for r in ratios]
        cells += [f"{100 * statistics.median(found):.1f}%", f"{100 * max(found):.1f}%"]
    return f"| {label} | {len(ratios)} | {' | '.join(cells)} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", default=",".join(ZOOS), help="torchvision,timm,hf")
    parser.add_argument("--sample", type=int, default=12, help="models per zoo (0: all)")
    parser.add_argument("--zoo-dir", type=Path, default=ROOT / ".zoo")
    parser.add_argument("--quick", action="store_true", help="one Hugging Face model")
    args = parser.parse_args()
    zoos = ["hf"] if args.quick else args.zoo.split(",")
    if any(z != "hf" for z in zoos) and install.ensure(args.zoo_dir) is not None:
        log("torchvision and timm cannot be installed here: measuring the Hugging Face zoo")
        zoos = ["hf"]
    print(f"machine: {machine()}\ncommand: {command()}\n")
    rows, ratios = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for zoo in zoos:
            module = ZOOS[zoo]
            names = (
                list(module.QUICK)
                if args.quick
                else sample(module.names(str(args.zoo_dir)), args.sample)
            )
            for name in names:
                folder = Path(tmp) / f"{zoo}-{name}"
                folder.mkdir()
                model_file = folder / "model.py"
                model_file.write_text(module.model(name, str(args.zoo_dir)).source)
                compiled, verify, wall = measure(model_file, folder / "out")
                ratios.setdefault(zoo, []).append((verify / compiled, verify / wall))
                shares = f"{100 * verify / compiled:.1f}% | {100 * verify / wall:.1f}%"
                rows.append(f"| {zoo} | {name} | {compiled:.0f} | {verify:.0f} | {wall:.0f} | "
                            f"{shares} |")  # fmt: skip
                log(rows[-1])
    print("| zoo | models | median verify / compile | worst | median verify / command | worst |")
    print("|---|---:|---:|---:|---:|---:|")
    for zoo, found in ratios.items():
        print(summary(zoo, found))
    print(summary("all", [r for found in ratios.values() for r in found]))
    print("\n| zoo | model | compile ms | verify ms | command ms | verify / compile "
          "| verify / command |\n|---|---|---:|---:|---:|---:|---:|")  # fmt: skip
    print("\n".join(rows))


if __name__ == "__main__":
    main()
