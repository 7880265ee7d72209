"""Models that mix the samples of a batch: a contrastive head in the model and a contrastive
loss_fn with a schedule that cannot wait for them, a coupling in the model's middle, and runs
that would split the batch such a loss needs whole (5 cases)."""

from __future__ import annotations

from catalogue.case import RUN, Case, compiled, write

TOWERS = '''"""Two towers and {what}."""
import torch
import torch.nn.functional as F


class Towers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(6, 8)

    def forward(self, x, y):
        i, t = F.normalize(self.a(x), dim=-1), F.normalize(self.b(y), dim=-1)
        {ret}


def build_model():
    torch.manual_seed(0)
    return Towers()


def example_inputs():
    return {{"x": torch.randn(8, 8), "y": torch.randn(8, 6)}}


def example_targets():
    return ()


def loss_fn(output):
    {loss}
'''
HEAD = TOWERS.format(
    what="CLIP's loss in the model",
    ret="return F.cross_entropy(i @ t.t() * 10, torch.arange(len(i)))",
    loss="return output",
)
CENTRED = TOWERS.format(
    what="the batch mean taken off before a layer",
    ret="return self.a(i - i.mean(0)) + t",
    loss="return output.pow(2).mean()",
)
CONTRASTIVE = TOWERS.format(
    what="a contrastive loss",
    ret="return i, t",
    loss="i, t = output\n    return F.cross_entropy(i @ t.t() * 10, torch.arange(len(i)))",
)
SPLIT = r"splits the batch, and loss_fn \(model\.py:\d+; .*mixes the samples\) mixes the samples"

COUPLING = [
    Case("coupling-head-1f1b", "a contrastive head in the model, --schedule 1f1b, 2 micro-batches",
         write("model.py", HEAD),
         ("model.py", "--stages", "2", "--microbatches", "2", "--schedule", "1f1b", "-q"),
         r"matmul\S* \(.*model\.py\S*, line \d+, in forward: return F\.cross_entropy\(.*\)\) "
         r"mixes the samples of the batch, and only the outputs follow it .*that tail runs once "
         r"a step.*"
         r"--schedule gpipe or looped_bfs, or --microbatches 1", base=None),
    Case("coupling-middle-split", "the batch mean taken off in the model, --microbatches 2",
         write("model.py", CENTRED), ("model.py", "--stages", "2", "--microbatches", "2", "-q"),
         r"mean \(.*model\.py\S*, line \d+, .*\) mixes the samples of the batch, and more of the "
         r"model's layers follow it", base=None),
    Case("coupling-loss-1f1b", "a contrastive loss_fn, --schedule 1f1b --microbatches 2",
         write("model.py", CONTRASTIVE),
         ("model.py", "--stages", "2", "--microbatches", "2", "--schedule", "1f1b", "-q"),
         r"loss_fn \(model\.py:\d+; .*\) is a loss over the whole batch.*1f1b starts the last "
         r"stage's backward before its last forward.*--schedule gpipe or looped_bfs", base=None),
    Case("coupling-loss-accumulate", "a contrastive loss_fn compiled exactly; run --accumulate 2",
         compiled(write("model.py", CONTRASTIVE)), (*RUN, "--accumulate", "2"),
         r"--accumulate 2 " + SPLIT, base=None),
    Case("coupling-loss-dp", "a contrastive loss_fn; run --nproc 4 --dp 2 --shard grads",
         compiled(write("model.py", CONTRASTIVE)),
         (*RUN, "--nproc", "4", "--dp", "2", "--shard", "grads"),
         r"--shard grads: loss_fn \(model\.py:\d+; .*mixes the samples\) mixes the samples "
         r"of the batch, and the --dp copies gather", base=None),
]  # fmt: skip
