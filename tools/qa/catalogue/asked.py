"""Runs that must do exactly what was asked, or say why not: data hooks, --steps and epochs, losses
and optimizers, options that would be ignored."""

from __future__ import annotations

from catalogue.case import (
    CHECK,
    COMPILE,
    LOSS,
    RUN,
    Case,
    compiled,
    mlp_variant,
    nothing,
    ran,
    write,
)


def hook(source: str) -> tuple[str, str]:
    """An mlp_variant edit adding ``source`` (hooks, helpers) before loss_fn."""
    return ("def loss_fn(", f"{source}\n\n\ndef loss_fn(")


PAIR = "(example_inputs(), example_targets())"
ONE_SHOT = hook(f"_ONCE = ({PAIR} for _ in range(3))\n\n\ndef train_batches():\n    return _ONCE")
EMPTY = hook("def train_batches():\n    return []")
EMPTY_ITERATOR = hook("def train_batches():\n    return iter([])")


def sized(length: int, count: int) -> tuple[str, str]:
    """A hook whose object says ``len() == length`` but yields ``count`` batches."""
    return hook(
        f"class Sized:\n    def __len__(self):\n        return {length}\n\n"
        f"    def __iter__(self):\n        return iter([{PAIR}] * {count})\n\n\n"
        "def train_batches():\n    return Sized()"
    )


SHORT_TARGETS = hook(
    f"def train_batches():\n    bad = (example_inputs(), (torch.zeros(6, OUT_FEATURES),))\n"
    f"    return [{PAIR}, {PAIR}, bad]"
)
EVAL_WRONG_SHAPE = hook(
    "def eval_batches():\n    return [((torch.ones(BATCH_SIZE, 16),), example_targets())]"
)
FRESH_GENERATOR = hook(f"def train_batches():\n    for _ in range(3):\n        yield {PAIR}")

TOKENS = '''"""A tiny language model whose second batch holds a token id beyond its vocabulary."""
import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 32


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, 16)
        self.mid = nn.Linear(16, 16)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, idx):
        return self.head(torch.tanh(self.mid(self.tok(idx))))


def build_model():
    torch.manual_seed(0)
    return Tiny()


def _batch(high):
    g = torch.Generator().manual_seed(high)
    return (torch.randint(0, high, (8, 6), generator=g),), torch.randint(0, VOCAB, (8, 6))


def example_inputs():
    return _batch(VOCAB)[0]


def example_targets():
    return (_batch(VOCAB)[1],)


def train_batches():
    return [_batch(VOCAB), _batch(VOCAB + 8)]  # ids up to 39 in a 32-row embedding


def loss_fn(output, target):
    return F.cross_entropy(output.reshape(-1, VOCAB), target.reshape(-1))
'''

SAVED = ran("run", "out", "-q", "--steps", "3", "--save", "ck")
NPROC = ("--nproc", "2")
ON_RANKS = {"max_lines": 4, "own_process": True, "timeout": 240.0}  # a hang must not block

DATA_CASES = [
    Case("hook-one-shot", "train_batches() returns the same generator each epoch; --steps 10",
         mlp_variant(ONE_SHOT), (*RUN, "--model", "model.py", "--steps", "10"),
         r"train_batches\(\) of model\.py yielded no batches in epoch 2 \(epoch 1 gave 3\).*"
         r"return a fresh iterable on each call"),
    Case("hook-one-shot-nproc", "the same one-shot generator under --nproc 2",
         mlp_variant(ONE_SHOT), (*RUN, "--model", "model.py", "--steps", "10", *NPROC),
         r"rank \d: error: train_batches\(\) of model\.py yielded no batches in epoch 2",
         **ON_RANKS),
    Case("hook-empty-list", "train_batches() returns an empty list",
         mlp_variant(EMPTY), (*RUN, "--model", "model.py"),
         r"train_batches\(\) of model\.py yielded no batches; it must give at least one"),
    Case("hook-empty-iterator", "train_batches() returns an empty iterator",
         mlp_variant(EMPTY_ITERATOR), (*RUN, "--model", "model.py", "--steps", "5"),
         r"train_batches\(\) of model\.py yielded no batches; it must give at least one"),
    Case("hook-empty-nproc", "train_batches() returns an empty list; --nproc 2",
         mlp_variant(EMPTY), (*RUN, "--model", "model.py", *NPROC),
         r"rank \d: error: train_batches\(\) of model\.py yielded no batches", **ON_RANKS),
    Case("hook-len-short", "train_batches()' __len__ says 2, __iter__ yields 5",
         mlp_variant(sized(2, 5)), (*RUN, "--model", "model.py", "--epochs", "1"),
         r"yielded 5 batches in epoch 1 but its len\(\) is 2; make __len__ return"),
    Case("hook-len-long", "train_batches()' __len__ says 5, __iter__ yields 2",
         mlp_variant(sized(5, 2)), (*RUN, "--model", "model.py", "--steps", "8"),
         r"yielded 2 batches in epoch 1 but its len\(\) is 5; make __len__ return"),
    Case("hook-len-short-nproc", "__len__ says 2, __iter__ yields 5; --nproc 2",
         mlp_variant(sized(2, 5)), (*RUN, "--model", "model.py", "--epochs", "1", *NPROC),
         r"rank \d: error: .*yielded 5 batches in epoch 1 but its len\(\) is 2", **ON_RANKS),
    Case("hook-targets-batch", "train_batches()' third batch has 6 targets for 8 inputs",
         mlp_variant(SHORT_TARGETS), (*RUN, "--model", "model.py", "--steps", "3"),
         r"train_batches\(\) of model\.py, batch 2 \(step 3\).*target 0 has shape \(6, 10\).*"
         r"batch is 8"),
    Case("hook-token-out-of-range", "a batch holds token id 39 for a 32-row embedding",
         compiled(write("model.py", TOKENS)), (*RUN, "--steps", "2"),
         r"train_batches\(\) of model\.py, batch 1 \(step 2\): input 'idx' holds ids \d+\.\.39: "
         r"beyond embedding 'tok' \(32 rows: ids 0\.\.31\)", base=None),
    Case("hook-fresh-generator", "train_batches() is a generator function; --steps 7 (works)",
         mlp_variant(FRESH_GENERATOR), (*RUN, "--model", "model.py", "--steps", "7"), r"^$",
         status=0),
    Case("eval-hook-wrong-shape", "eval_batches() yields inputs of 16 features, not 32",
         mlp_variant(EVAL_WRONG_SHAPE), (*RUN, "--model", "model.py", "--steps", "20"),
         r"eval_batches\(\) of model\.py, batch 0 \(checked before training\): input 'x' has "
         r"shape \(8, 16\)"),
    Case("eval-hook-wrong-shape-nproc", "eval_batches() yields 16 features; --nproc 2",
         mlp_variant(EVAL_WRONG_SHAPE), (*RUN, "--model", "model.py", "--steps", "20", *NPROC),
         r"rank 0: error: eval_batches\(\) of model\.py, batch 0 \(checked before training\)",
         **ON_RANKS),
    Case("eval-hook-empty", "eval_batches() returns an empty list",
         mlp_variant(hook("def eval_batches():\n    return []")),
         (*RUN, "--model", "model.py", "--steps", "20"),
         r"eval_batches\(\) of model\.py yielded no batches"),
]  # fmt: skip

LOSS_CASES = [
    Case("loss-constant", "loss_fn returns torch.tensor(1.0): nothing could train",
         mlp_variant((LOSS, "return torch.tensor(1.0)")), (*RUN, "--model", "model.py"),
         r"loss_fn \(model\.py:\d+\) returned a loss that does not require grad.*from the output"),
    Case("loss-detached", "loss_fn returns the loss .detach()ed",
         mlp_variant((LOSS, 'return F.mse_loss(output, target, reduction="mean").detach()')),
         (*RUN, "--model", "model.py"), r"loss_fn \(model\.py:\d+\) returned a loss that does "
         r"not require grad"),
    Case("loss-item", "loss_fn returns the loss as a Python float (.item())",
         mlp_variant((LOSS, 'return F.mse_loss(output, target, reduction="mean").item()')),
         (*RUN, "--model", "model.py"), r"loss_fn \(model\.py:\d+\) returned a float; it must "
         r"return a scalar tensor"),
    Case("loss-constant-nproc", "loss_fn returns torch.tensor(1.0); --nproc 2",
         mlp_variant((LOSS, "return torch.tensor(1.0)")), (*RUN, "--model", "model.py", *NPROC),
         r"rank 1: error: .*loss_fn \(model\.py:\d+\) returned a loss that does not require "
         r"grad", **ON_RANKS),
]  # fmt: skip

NOTHING_TO_DO_CASES = [
    Case("resume-without-steps", "run --resume ck (at step 3) without --steps: nothing to do",
         SAVED, (*RUN, "--resume", "ck"),
         r"--resume ck: the saved step is 3.*pass --steps greater than 3"),
    Case("resume-epochs-done", "run --resume ck (at step 3) --epochs 1 (one batch an epoch)",
         SAVED, (*RUN, "--resume", "ck", "--epochs", "1"),
         r"the saved step is 3 and the run ends at step 1.*--steps greater than 3"),
    Case("lr-zero", "run --lr 0: no weight would change", nothing, (*RUN, "--lr", "0"),
         r"--lr: '0' is not a finite number above 0"),
    Case("warmup-beyond-run", "run --steps 3 --warmup-steps 10: --lr never reached", nothing,
         (*RUN, "--steps", "3", "--warmup-steps", "10"),
         r"--warmup-steps 10 is longer than the run \(3 steps\).*never reach --lr"),
    Case("eval-every-without-eval", "run --eval-every 2 on a model file without eval_batches()",
         nothing, (*RUN, "--eval-every", "2", "--steps", "4"),
         r"--eval-every 2: there is no eval_batches\(\).*drop --eval-every"),
]  # fmt: skip

IGNORED_CASES = [
    Case("check-precision", "run --check --precision bf16 (the check was fp32)", nothing,
         (*CHECK, "--precision", "bf16"), r"--check .* cannot honour --precision: it compares "
         r"fp32.*drop it"),
    Case("check-accumulate", "run --check --accumulate 4", nothing, (*CHECK, "--accumulate", "4"),
         r"cannot honour --accumulate: it compares one mini-batch"),
    Case("check-steps", "run --check --steps 5", nothing, (*CHECK, "--steps", "5"),
         r"cannot honour --steps: it runs one step"),
    Case("check-save", "run --check --save ck", nothing, (*CHECK, "--save", "ck"),
         r"cannot honour --save: it trains nothing to save"),
    Case("check-resume", "run --check --resume ck", SAVED, (*CHECK, "--resume", "ck"),
         r"cannot honour --resume: it checks the compiled weights"),
    Case("check-several", "run --check --epochs 2 --lr-schedule cosine --metrics m.jsonl",
         nothing, (*CHECK, "--epochs", "2", "--lr-schedule", "cosine", "--metrics", "m.jsonl"),
         r"cannot honour --epochs: .*; --lr-schedule: .*; --metrics: .*; drop them"),
    Case("check-nproc-precision", "run --check --nproc 2 --precision bf16", nothing,
         (*CHECK, *NPROC, "--precision", "bf16"), r"cannot honour --precision"),
    Case("timeout-without-nproc", "run --timeout 5 without --nproc", nothing,
         (*RUN, "--timeout", "5"), r"--timeout applies to the ranks of --nproc N.*drop --timeout"),
    Case("device-without-nproc", "run --device cuda without --nproc", nothing,
         (*RUN, "--device", "cuda"), r"--device applies to the ranks of --nproc N"),
    Case("dp-without-nproc", "run --dp 2 without --nproc", nothing,
         (*RUN, "--dp", "2"), r"--dp applies to the ranks of --nproc N.*drop --dp"),
    Case("dp-not-dividing", "run --nproc 3 --dp 2 (a 2-stage program)", nothing,
         (*RUN, "--nproc", "3", "--dp", "2"),
         r"--dp 2 does not divide --nproc 3: each of the 2 copies of the pipeline needs 2 "
         r"ranks; run --nproc 4"),
    Case("shard-grads-split-backward", "run --nproc 4 --dp 2 --shard grads of a zb1p program",
         compiled(mlp_variant(), flags=("--schedule", "zb1p")),
         (*RUN, "--nproc", "4", "--dp", "2", "--shard", "grads"),
         r"--shard grads: zb1p splits each backward in two \(I and W\).*--shard optimizer"),
    Case("shard-grads-replicated", "run --nproc 6 --dp 2 --shard grads of --replicate 2,1",
         compiled(mlp_variant(), flags=("--replicate", "2,1")),
         (*RUN, "--nproc", "6", "--dp", "2", "--shard", "grads"),
         r"--shard grads: the program replicates stages \(--replicate, replicas \[2, 1\]\)"),
    Case("shard-params-compile", "run --nproc 4 --dp 2 --shard params --compile eager", nothing,
         (*RUN, "--nproc", "4", "--dp", "2", "--shard", "params", "--compile", "eager"),
         r"--shard params: the stages' forwards run through torch.compile.*--compile off"),
    Case("shard-grads-one-batch",
         "train_batches() gives 1 batch; --epochs 1 --nproc 4 --dp 2 --shard grads",
         mlp_variant(hook(f"def train_batches():\n    return [{PAIR}]")),
         (*RUN, "--model", "model.py", "--epochs", "1", "--nproc", "4", "--dp", "2", "--shard",
          "grads"),
         r"rank \d: error: --dp 2 --shard: the data ended before copy 1 had a batch.*at least "
         r"2 batches", **ON_RANKS),
    Case("shard-without-dp", "run --nproc 2 --shard optimizer (one copy)", nothing,
         (*RUN, "--nproc", "2", "--shard", "optimizer"),
         r"--shard optimizer shards across the data-parallel copies, and there is one; add --dp"),
    Case("atol-without-check", "run --atol 1e-3 without --check", nothing,
         (*RUN, "--atol", "1e-3"), r"--atol is a tolerance of --check"),
    Case("trace-steps-without-trace", "run --trace-steps 2 without --trace", nothing,
         (*RUN, "--trace-steps", "2"),
         r"--trace-steps 2 is how many steps --trace FILE traces, and this run traces none"),
    Case("check-trace", "run --check --trace t.json", nothing, (*CHECK, "--trace", "t.json"),
         r"cannot honour --trace: it compares one step, it does not time one"),
    Case("run-recompute", "run --recompute always (a compile option)", nothing,
         (*RUN, "--recompute", "always"),
         r"--recompute is an option of compiling, which fixes the program `run` runs: recompile"),
    Case("init-seed-real-weights", "compile --init-seed 3 of a model built with its weights",
         nothing, (*COMPILE, "--init-seed", "3", "-o", "o2"),
         r"--init-seed 3 seeds the initialisation of a model built on the meta device, but MLP "
         r"was built with its weights"),
    Case("export-shard-size-file", "export -o w.safetensors --shard-size 1GB (one file)", nothing,
         ("export", "out", "-o", "w.safetensors", "--shard-size", "1GB"),
         r"--shard-size applies to a directory export; -o w\.safetensors is one"),
    Case("export-shard-size-zero", "export -o hf --shard-size 0", nothing,
         ("export", "out", "-o", "hf", "--shard-size", "0"),
         r"--shard-size: '0' is no size to write a shard of"),
]  # fmt: skip

ASKED: list[Case] = [*DATA_CASES, *LOSS_CASES, *NOTHING_TO_DO_CASES, *IGNORED_CASES]
