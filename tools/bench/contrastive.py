"""Contrastive models trained exactly: CLIP's and SigLIP's losses over the whole batch.

Four model files: examples/clip.py (an image and a text encoder side by side, CLIP's loss in
``loss_fn``), the same with SigLIP's sigmoid loss, and Hugging Face's CLIPModel (its logits
computed in the model, the loss in ``loss_fn``) and SiglipModel (``return_loss=True``: logits
and loss in the model) from tiny configs. Each is compiled at 2 and 4 stages and 4
micro-batches and trained 20 SGD steps with `pipecompile run` on its example batch, in one
process and on ranks (`--nproc`). The reference is the eager model trained the same steps on
the whole batch; its noise floor, the same training in float64. Printed per run: the largest
difference of a step's loss from eager's and of a weight after the last step (over the
weight's largest magnitude), each beside eager's own from float64. Beside them, what a
pipeline computing the loss per micro-batch trains (every other pipeline's objective, and
pipecompile's before it found the coupling): its first loss and last weights against eager's.

    python tools/bench/contrastive.py            # 20 steps, 4 models, 4 runs each
    python tools/bench/contrastive.py --quick    # 3 steps, examples/clip.py, 2 stages
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from common import EXAMPLES, command, machine, pipecompile_done

from pipecompile.model.model_file import ModelSpec, load_model_file
from pipecompile.runtime.training.model_keyed import read_model_keyed
from pipecompile.runtime.training.train_state import latest_step_dir

LR = 0.1
MICROBATCHES = 4
SIGLIP_LOSS = f'''"""examples/clip.py with SigLIP's loss: a sigmoid over every image-text pair."""
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
TOWERS = dict(
    text=dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=2, max_position_embeddings=16),
    vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, image_size=16, patch_size=8),
)  # fmt: skip
HF = '''"""Hugging Face's {cls} from a tiny config ({how})."""
import torch
import torch.nn.functional as F
from torch import nn
from transformers import {cls}, {config}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.m = {cls}({config}(text_config={text}, vision_config={vision}))

    def forward(self, input_ids, pixel_values):
        return self.m(input_ids=input_ids, pixel_values=pixel_values, return_loss={returns})


def build_model():
    torch.manual_seed(0)
    return Model()


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return {{"input_ids": torch.randint(0, 100, (16, 7), generator=g),
            "pixel_values": torch.randn(16, 3, 16, 16, generator=g)}}


def example_targets():
    return ()


def loss_fn(output):
    {loss}
'''
CLIP_LOSS = """logits = output.logits_per_image
    labels = torch.arange(len(logits))
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2"""


def model_files(root: Path, quick: bool) -> dict[str, Path]:
    """The model files, written where they are not examples."""
    files = {"CLIP (examples/clip.py)": EXAMPLES / "clip.py"}
    if quick:
        return files
    texts = {
        "SigLIP loss (examples/clip.py)": SIGLIP_LOSS,
        "HF CLIPModel, logits in the model": HF.format(
            cls="CLIPModel", config="CLIPConfig", how="the loss in loss_fn", returns=False,
            loss=CLIP_LOSS, **TOWERS,
        ),
        "HF SiglipModel, return_loss=True": HF.format(
            cls="SiglipModel", config="SiglipConfig", how="its own loss", returns=True,
            loss="return output.loss", **TOWERS,
        ),
    }  # fmt: skip
    for k, (name, text) in enumerate(texts.items()):
        path = root / f"model_{k}.py"
        path.write_text(text)
        files[name] = path
    return files


def eager(
    spec: Callable[[], ModelSpec], steps: int, *, parts: int = 1, dtype: torch.dtype | None = None
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The eager model's losses over ``steps`` SGD steps on the example batch and its weights
    after them; ``parts`` > 1: the loss of each of that many parts averaged (what a pipeline
    computing the loss per micro-batch trains); ``dtype``: in that dtype."""
    fresh = spec()
    model, inputs = fresh.model, fresh.inputs
    if dtype is not None:
        model = model.to(dtype)
        inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        chunks = [{k: v.chunk(parts)[n] for k, v in inputs.items()} for n in range(parts)]
        loss = sum(fresh.loss_fn(model(**c)) for c in chunks) / parts
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def pipelined(
    out: Path, model_file: Path, stages: int, nproc: int, steps: int
) -> tuple[list[float], dict[str, torch.Tensor], str]:
    """Compile ``model_file`` at ``stages`` stages and 4 micro-batches into ``out``, train
    ``steps`` steps; its losses, its weights after them and its summary's coupling lines
    with the plan's shape last (a chain, or a stage graph)."""
    shown = pipecompile_done(
        str(model_file), "--stages", str(stages), "--microbatches", str(MICROBATCHES), "-o",
        str(out),
    ).stdout  # fmt: skip
    coupling = [line for line in shown.splitlines() if line.startswith("batch coupling")]
    balance = json.loads((out / "manifest.json").read_text()).get("balance") or {}
    coupling.append(f"shape {balance.get('shape', 'chain')}")  # a chain, or a stage graph
    ranks = ("--nproc", str(nproc)) if nproc > 1 else ()
    saved = out.with_name(out.name + "-ck")
    pipecompile_done(
        "run", str(out), "-q", "--steps", str(steps), "--optimizer", "sgd", "--lr", str(LR),
        "--save", str(saved), "--metrics", str(out / "m.jsonl"), *ranks,
    )  # fmt: skip
    records = [json.loads(line) for line in (out / "m.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r.get("kind") == "train"]
    kept = read_model_keyed(latest_step_dir(saved))
    weights = {k.removeprefix("model."): v for k, v in kept.items() if k.startswith("model.")}
    return losses, weights, " / ".join(coupling)


def gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest difference of a weight (absolute: a weight that starts at zero, a bias,
    has no magnitude to be relative to)."""
    return max(
        float((a[k].double() - b[k].double()).abs().max()) for k in b if b[k].is_floating_point()
    )


def loss_gap(a: list[float], b: list[float]) -> float:
    """The largest difference of a step's loss, over that loss (the runs report their losses
    summed over the ranks in float32: about 1e-7 of the loss)."""
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 steps, one model, one run")
    args = parser.parse_args()
    steps = 3 if args.quick else 20
    runs = [(2, 1)] if args.quick else [(2, 1), (4, 1), (2, 2), (4, 4)]
    print(f"# {command()}\n# {machine()}")
    said = f"batch 16, {MICROBATCHES} micro-batches, SGD lr {LR}, {steps} steps"
    print(f"# {said}; losses: max |diff| / loss; weights: max |diff|; noise floor: fp64")
    print("model | stages (the plan's shape) | ranks | max loss diff, rel (noise floor) "
          "| max weight diff (noise floor) | per micro-batch: first loss off by, weights off "
          "by")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for k, (name, path) in enumerate(model_files(root, args.quick).items()):

            def spec(path: Path = path) -> ModelSpec:
                return load_model_file(str(path))

            want_losses, want = eager(spec, steps)
            exact_losses, exact = eager(spec, steps, dtype=torch.float64)
            naive_losses, naive = eager(spec, steps, parts=MICROBATCHES)
            floor = (loss_gap(want_losses, exact_losses), gap(want, exact))
            naive_gap = (abs(naive_losses[0] - want_losses[0]), gap(naive, want))  # absolute
            for stages, nproc in runs:
                out = root / f"out-{k}-{stages}-{nproc}"
                got_losses, got, coupling = pipelined(out, path, stages, nproc, steps)
                assert "exactly" in coupling, coupling
                shape = coupling.rsplit("shape ", 1)[1]
                print(
                    f"{name} | {stages} ({shape}) | {nproc} | "
                    f"{loss_gap(got_losses, want_losses):.1e} "
                    f"({floor[0]:.1e}) | {gap(got, want):.1e} ({floor[1]:.1e}) | "
                    f"{naive_gap[0]:.3f}, {naive_gap[1]:.1e}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
