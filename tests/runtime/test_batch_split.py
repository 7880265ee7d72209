"""`run --check` on a micro-batched pipeline: a per-sample model's float32 result may move
with the batch split (ReLU kinks) - judged against eager on the same micro-batches, with the
split measured in float64 - while a model that mixes samples is refused at compile, naming why."""

from pipecompile.surfaces.cli import main
from tests.conftest import write_model_file

MIXING = """
import torch
from torch import nn

class Centred(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 2)

    def forward(self, x):
        h = self.a(x)
        return self.b(h - h.mean(0))  # every row depends on the whole batch

def build_model():
    torch.manual_seed(0)
    return Centred()

def example_inputs():
    return (torch.randn(8, 6, generator=torch.Generator().manual_seed(1)),)

def example_targets():
    return (torch.randn(8, 2, generator=torch.Generator().manual_seed(2)),)

def loss_fn(out, target):
    return ((out - target) ** 2).mean()
"""


def test_a_model_that_mixes_samples_is_refused_naming_it(tmp_path, capfd):
    """At compile now (the batch_coupling pass), before any run: the op, its line, what to do."""
    model = write_model_file(tmp_path, MIXING)
    out = str(tmp_path / "out")
    assert main([str(model), "--stages", "2", "--microbatches", "2", "-q", "-o", out]) == 2
    err = capfd.readouterr().err
    assert "mean" in err and "h - h.mean(0)" in err and "more of the model's layers" in err
    assert "--microbatches 1" in err


def test_one_micro_batch_of_the_same_model_passes(tmp_path, capfd):
    model = write_model_file(tmp_path, MIXING)
    out = str(tmp_path / "out")
    assert main([str(model), "--stages", "2", "--microbatches", "1", "-q", "-o", out]) == 0
    assert main(["run", out, "--check"]) == 0
    assert "check passed" in capfd.readouterr().out


def test_the_split_moves_a_per_sample_model_by_rounding_only(compiled_examples):
    from pipecompile.model.model_file import load_model_file
    from pipecompile.runtime.check.step import SPLIT_FLOOR, _split_moves
    from pipecompile.runtime.pipeline import Pipeline
    from tests.conftest import EXAMPLES

    spec = load_model_file(str(EXAMPLES / "gpt.py"))
    pipe = Pipeline.load(compiled_examples[("gpt", 2)])
    moved = _split_moves(pipe, spec.model, spec.inputs, spec.targets, spec.loss_fn, 2)
    assert moved is not None and moved < SPLIT_FLOOR
