"""Within ``traces_kept`` a model compiled again with the same example is traced once; a changed
model, mode, example or option traces anew, and outside the block nothing is kept."""

from __future__ import annotations

import torch
from torch import nn

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model, driver
from pipecompile.frontend.kept_traces import traces_kept
from pipecompile.ir.graph.noise_floor import Tolerance
from pipecompile.runtime.check.step import check_step
from pipecompile.runtime.pipeline import Pipeline


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(self.norm(self.a(x)))))


def _counting(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = driver.trace

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(driver, "trace", counted)
    return calls


def _equals_eager(model: nn.Module, x: torch.Tensor, stages: int, tmp_path) -> None:
    compiled = compile_model(model, {"x": x}, stages=stages, microbatches=2)
    pipe = Pipeline.load(emit(compiled, tmp_path / str(stages), model=ModelRef(None, "Net", "Net")))
    target = torch.randn(x.shape[0], 4)
    report = check_step(
        pipe, model, {"x": x}, (target,), nn.functional.mse_loss, tolerance=Tolerance(1e-6)
    )
    assert report.ok, str(report)


def test_one_trace_serves_every_stage_count_and_each_equals_eager(monkeypatch, tmp_path):
    torch.manual_seed(0)
    model, x = Net(), torch.randn(8, 8)
    calls = _counting(monkeypatch)
    with traces_kept():
        for stages in (1, 2, 3, 4):
            _equals_eager(model, x, stages, tmp_path)
        assert len(calls) == 1
        with traces_kept():  # a nested block uses the outer one's traces
            compile_model(model, {"x": x}, stages=2, microbatches=2)
        assert len(calls) == 1


def test_compiling_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model, x = Net(), torch.randn(8, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with traces_kept():
        compile_model(model, {"x": x}, stages=2, microbatches=2)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_changed_model_example_or_option_traces_anew(monkeypatch):
    torch.manual_seed(0)
    model, x = Net(), torch.randn(8, 8)
    calls = _counting(monkeypatch)
    with traces_kept():
        compile_model(model, {"x": x}, stages=2, microbatches=2)
        compile_model(model, {"x": x}, stages=2, microbatches=4)  # another micro-batch
        assert len(calls) == 2
        compile_model(model, {"x": torch.randn(8, 8)}, stages=2, microbatches=2)  # values only
        assert len(calls) == 2
        model.b = nn.Linear(8, 8)  # a module swapped
        compile_model(model, {"x": x}, stages=2, microbatches=2)
        assert len(calls) == 3
        model.eval()  # another mode
        compile_model(model, {"x": x}, stages=2, microbatches=2)
        assert len(calls) == 4
        model.c.weight = nn.Parameter(torch.randn(4, 8))  # a parameter replaced
        compile_model(model, {"x": x}, stages=2, microbatches=2)
        assert len(calls) == 5
        model.c.register_forward_hook(lambda m, i, o: o * 2)  # a hook
        compile_model(model, {"x": x}, stages=2, microbatches=2)
        assert len(calls) == 6
        compile_model(model, {"x": x}, stages=2, microbatches=2, dynamic="none")  # an option
        assert len(calls) == 7
        compile_model(Net(), {"x": x}, stages=2, microbatches=2)  # another model
        assert len(calls) == 8


def test_outside_the_block_every_compile_traces(monkeypatch):
    model, x = Net(), torch.randn(8, 8)
    calls = _counting(monkeypatch)
    for _ in range(2):
        compile_model(model, {"x": x}, stages=2, microbatches=2)
    assert len(calls) == 2
