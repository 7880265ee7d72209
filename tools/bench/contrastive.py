"""Contrastive models trained exactly: CLIP's and SigLIP's losses over the whole batch.

examples/clip.py (an image and a text encoder side by side) is compiled with its own CLIP loss
and with SigLIP's sigmoid loss (a model file written beside it), at 2 and 4 stages and 4
micro-batches, and trained 20 SGD steps with `pipecompile run` on the example batch, in one
process and on ranks (`--nproc`). The reference is the eager model trained the same 20 steps
on the whole batch. Printed per run: the largest difference of a step's loss from eager's and
of a weight after the last step (relative to the weight's largest magnitude). Beside them, what
a pipeline that computes the loss per micro-batch and averages the parts trains (the objective
every other pipeline trains, and pipecompile did before it found the coupling): its first loss
and last weights against eager's.

    python tools/bench/contrastive.py            # 20 steps, both losses, 4 runs each
    python tools/bench/contrastive.py --quick    # 3 steps, CLIP's loss, 2 stages, one process
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from common import EXAMPLES, command, machine, pipecompile_done, use_examples

from pipecompile.runtime.training.model_keyed import read_model_keyed
from pipecompile.runtime.training.train_state import latest_step_dir

use_examples()
import clip  # noqa: E402  (examples/clip.py)

LR = 0.1
MICROBATCHES = 4
SIGLIP_FILE = f'''"""examples/clip.py with SigLIP's loss: a sigmoid over every image-text pair."""
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, {str(EXAMPLES)!r})
from clip import build_model, example_inputs, example_targets  # noqa: E402,F401


def loss_fn(output):
    image, text = output
    logits = image @ text.t() * 10.0 - 10.0
    labels = 2 * torch.eye(len(image), device=image.device) - 1
    return -F.logsigmoid(labels * logits).sum() / len(image)
'''


def siglip_loss(output: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The same loss as SIGLIP_FILE's, for the eager reference."""
    image, text = output
    logits = image @ text.t() * 10.0 - 10.0
    labels = 2 * torch.eye(len(image)) - 1
    return -F.logsigmoid(labels * logits).sum() / len(image)


LOSSES = {"CLIP": clip.loss_fn, "SigLIP": siglip_loss}


def eager(loss_fn, steps: int, parts: int = 1) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The eager model's losses over ``steps`` SGD steps on the example batch, and its
    weights after them; ``parts`` > 1: the loss of each of that many parts averaged (what a
    pipeline computing the loss per micro-batch trains)."""
    model, inputs = clip.build_model(), clip.example_inputs()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        chunks = [{k: v.chunk(parts)[n] for k, v in inputs.items()} for n in range(parts)]
        loss = sum(loss_fn(model(**c)) for c in chunks) / parts
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def pipelined(
    root: Path, model_file: Path, stages: int, nproc: int, steps: int
) -> tuple[list[float], dict[str, torch.Tensor], str]:
    """Compile ``model_file`` at ``stages`` stages and 4 micro-batches, train ``steps``
    steps; its losses, its weights after them and its summary's batch coupling line."""
    out = root / f"{model_file.stem}-{stages}-{nproc}"
    shown = pipecompile_done(
        str(model_file), "--stages", str(stages), "--microbatches", str(MICROBATCHES), "-o",
        str(out),
    ).stdout  # fmt: skip
    coupling = next(line for line in shown.splitlines() if line.startswith("batch coupling"))
    ranks = ("--nproc", str(nproc)) if nproc > 1 else ()
    pipecompile_done(
        "run", str(out), "-q", "--steps", str(steps), "--optimizer", "sgd", "--lr", str(LR),
        "--save", str(out.with_name(out.name + "-ck")), "--metrics", str(out / "m.jsonl"), *ranks,
    )  # fmt: skip
    records = [json.loads(line) for line in (out / "m.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r.get("kind") == "train"]
    saved = read_model_keyed(latest_step_dir(out.with_name(out.name + "-ck")))
    weights = {k.removeprefix("model."): v for k, v in saved.items() if k.startswith("model.")}
    return losses, weights, coupling


def gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest difference of a weight, over that weight's largest magnitude."""
    return max(
        float((a[k].float() - b[k].float()).abs().max()) / max(float(b[k].abs().max()), 1e-12)
        for k in b
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 steps, one run")
    args = parser.parse_args()
    steps = 3 if args.quick else 20
    runs = [(2, 1)] if args.quick else [(2, 1), (4, 1), (2, 2), (4, 4)]
    losses = {"CLIP": LOSSES["CLIP"]} if args.quick else LOSSES
    print(f"# {command()}\n# {machine()}")
    print(f"# examples/clip.py, batch {clip.BATCH_SIZE}, {MICROBATCHES} micro-batches, "
          f"SGD lr {LR}, {steps} steps")  # fmt: skip
    print("loss | stages | ranks | max loss diff | max weight diff (rel) | per-micro-batch: "
          "first loss off by | its weights off by (rel)")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        siglip_file = root / "siglip.py"
        siglip_file.write_text(SIGLIP_FILE)
        files = {"CLIP": EXAMPLES / "clip.py", "SigLIP": siglip_file}
        for name, loss_fn in losses.items():
            want_losses, want = eager(loss_fn, steps)
            naive_losses, naive = eager(loss_fn, steps, MICROBATCHES)
            for stages, nproc in runs:
                got_losses, got, coupling = pipelined(root, files[name], stages, nproc, steps)
                assert "computed once a step" in coupling, coupling
                loss_diff = max(abs(a - b) for a, b in zip(got_losses, want_losses))
                print(
                    f"{name} | {stages} | {nproc} | {loss_diff:.2e} | {gap(got, want):.2e} | "
                    f"{abs(naive_losses[0] - want_losses[0]):.3f} | {gap(naive, want):.2e}"
                )


if __name__ == "__main__":
    main()
