"""A compiled pipeline given inputs, targets, a loss_fn or a reference model that do not fit:
each is a typed error naming the culprit, never a torch error from deep inside a stage."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.errors import InputError, MicrobatchError, ModelFileError
from pipecompile.runtime.check.step import check_step
from pipecompile.runtime.executor import call_loss_fn
from pipecompile.runtime.load import read_manifest, read_program
from pipecompile.runtime.pipeline import Pipeline
from tests.conftest import example_spec


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def compiled(tmp: Path, model: nn.Module, x: torch.Tensor) -> Path:
    out = tmp / type(model).__name__
    return emit(compile_model(model, {"x": x}, stages=2, microbatches=2), out,
                model=ModelRef(Path(__file__), "none", type(model).__name__))  # fmt: skip


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = example_spec("mlp")
    compiled = compile_model(spec.model, spec.inputs, stages=2, microbatches=2)
    return emit(compiled, tmp_path_factory.mktemp("errors") / "out",
                model=ModelRef(spec.path, spec.name, "mlp"))  # fmt: skip


def test_inputs_of_another_shape_are_named(mlp):
    pipe = Pipeline.load(mlp)
    with pytest.raises(InputError, match=rf"input 'x' has shape \(8, 16\) but {mlp} was "
                       r"compiled for \(8, 32\)"):  # fmt: skip
        pipe.train_step({"x": torch.randn(8, 16)}, (torch.randn(8, 10),), mse)
    with pytest.raises(InputError, match=r"has dtype float64 .* compiled for float32"):
        pipe({"x": torch.randn(8, 32, dtype=torch.float64)})
    with pytest.raises(InputError, match=r"the inputs lack 'x' \(given: 'y'\)"):
        pipe({"y": torch.randn(8, 32)})


def test_another_batch_size_runs_unless_compiled_fixed(mlp, tmp_path):
    pipe = Pipeline.load(mlp)
    loss = pipe.train_step({"x": torch.randn(16, 32)}, (torch.randn(16, 10),), mse).loss
    assert torch.isfinite(loss)
    program = read_program(mlp / "program.txt")
    rank = Pipeline(read_manifest(mlp), [pipe.modules[0], None], program, device=0)
    assert rank.input_problem({"x": torch.randn(16, 32)}, exact=True) is None  # the batch varies
    spec = example_spec("mlp")
    fixed = emit(compile_model(spec.model, spec.inputs, stages=2, microbatches=2, dynamic="none"),
                 tmp_path / "fixed", model=ModelRef(spec.path, spec.name, "mlp"))  # fmt: skip
    rank = Pipeline(read_manifest(fixed), [pipe.modules[0], None], program, device=0)
    with pytest.raises(InputError, match=r"its batch size differs \(16, not 8\), and it was "
                       r"compiled with --dynamic none; recompile without it"):  # fmt: skip
        rank.train_step({"x": torch.randn(16, 32)}, (torch.randn(16, 10),), mse)


def test_targets_of_another_batch_size_are_named(mlp):
    pipe = Pipeline.load(mlp)
    with pytest.raises(InputError, match=r"target 0 has shape \(6, 10\) but the inputs' batch"):
        pipe.train_step({"x": torch.randn(8, 32)}, (torch.randn(6, 10),), mse)


def test_loss_fn_contract():
    out, target = torch.randn(4, 3), torch.randn(4, 3)
    assert call_loss_fn(mse, out, (target,)).dim() == 0
    with pytest.raises(ModelFileError, match=r"loss_fn \(.*test_run_errors\.py:\d+\) takes 1 "
                       r"argument \(output\) but is called .* with 2"):  # fmt: skip
        call_loss_fn(lambda output: output.sum(), out, (target,))
    with pytest.raises(ModelFileError, match=r"returned a tensor of shape \(4, 3\); it must "
                       "return a scalar"):  # fmt: skip
        call_loss_fn(lambda o, t: o - t, out, (target,))
    with pytest.raises(ModelFileError, match=r"failed at .*test_run_errors\.py:\d+: "
                       "RuntimeError"):  # fmt: skip
        call_loss_fn(lambda o, t: (o @ t).sum(), out, (target,))


def test_a_loss_fn_error_in_the_pipeline_names_the_instruction(mlp):
    pipe = Pipeline.load(mlp)
    with pytest.raises(ModelFileError, match=r"instruction 1F0: loss_fn .* returned a tensor"):
        pipe.train_step({"x": torch.randn(8, 32)}, (torch.randn(8, 10),), lambda o, t: o - t)


def test_check_with_another_model_names_the_tensor(mlp):
    spec = example_spec("mlp")
    other = type(spec.model)(in_features=16)
    with pytest.raises(ModelFileError, match=r"fc1\.weight is \(64, 16\) in MLP but \(64, 32\)"):
        check_step(Pipeline.load(mlp), other, spec.inputs, spec.targets, spec.loss_fn)


class Act(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2 + 1


class Transposed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x)).t()


def test_check_of_a_model_without_parameters_passes(tmp_path):
    x, y = torch.randn(8, 6), torch.randn(8, 6)
    pipe = Pipeline.load(compiled(tmp_path, Act(), x))
    report = check_step(pipe, Act(), {"x": x}, (y,), mse)
    assert report.ok and "no trainable parameters" in str(report)


def test_check_of_an_output_with_the_batch_last_names_it(tmp_path):
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    model = Transposed()
    pipe = Pipeline.load(compiled(tmp_path, model, x))
    with pytest.raises(MicrobatchError, match=r"output 0 \(t\) has the batch in dimension 1, "
                       r"not first: it is \(3, 4\) per micro-batch and \(3, 8\)"):  # fmt: skip
        check_step(pipe, model, {"x": x}, (y,), lambda o, t: mse(o.t(), t))
