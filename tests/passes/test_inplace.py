"""In-place ops: each stays in the stage that made the value it writes, so every stage count
and schedule compiles and matches eager (modules with inplace=True, tensor methods, `+=`,
item assignment, writes to a model input and to a value several stages read, and the aten
ops of a torch.export graph)."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.fx as fx
from torch import nn

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.errors import BalanceError
from pipecompile.ir.graph.mutation import mutated_inputs
from pipecompile.ir.graph.noise_floor import Tolerance
from pipecompile.runtime.check.step import check_step
from pipecompile.runtime.pipeline import Pipeline
from tests.conftest import SAMPLED_OUT


class ReluInplace(nn.Module):
    """Linear -> ReLU(inplace) twice, as in every torchvision ResNet block."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 4)
        self.act, self.act2 = nn.ReLU(inplace=True), nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.a(x))
        h = self.act2(self.b(h))
        return self.c(h)


class Methods(nn.Module):
    """Tensor methods, `+=` and item assignment writing values in place."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h.mul_(0.5)
        g = self.b(h)
        g += h
        g[:, :4] = 0.0
        return self.c(torch.tanh(g))


class WritesInput(nn.Module):
    """Writes its model input in place, and a later layer reads the input again."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)
        h = torch.relu(self.a(x))
        h = torch.relu(self.b(h))
        return self.c(torch.cat([h, x], dim=1))


class SharedThenWritten(nn.Module):
    """A value read by several later layers, one of which writes it in place first."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.d = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        k = self.b(torch.sigmoid(x)) + h  # reads h before the write (add saves nothing)
        h.relu_()  # eager: every later reader of h sees the written value
        m = self.c(k) + h
        return self.d(m * h)


MODELS = {"relu_inplace": ReluInplace, "methods": Methods, "writes_input": WritesInput,
          "shared_then_written": SharedThenWritten}  # fmt: skip
SCHEDULES = [
    {"schedule": "gpipe"},
    {"schedule": "1f1b"},
    {"schedule": "zb1p"},
    {"schedule": "gpipe", "recompute": "always"},
]


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((out - y) ** 2).mean()


def _check(model: nn.Module, stages: int, tmp_path, **options) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    compiled = compile_model(copy.deepcopy(model), {"x": x.clone()}, stages=stages,
                             microbatches=4 if stages > 1 else 2, **options)  # fmt: skip
    out = tmp_path / f"s{stages}"
    emit(compiled, out, model=ModelRef(None, "m", "m"))
    pipe = Pipeline.load(out)
    report = check_step(pipe, model, {"x": x}, (y,), _loss, tolerance=Tolerance(1e-6, 1e-5))
    assert report.ok, str(report)


def _cases() -> list[object]:
    """Each model under two schedules and each schedule on two models in the default run (a
    Latin square's two diagonals); the other pairs repeat a path a kept pair covers, and are
    sampled out for time."""
    names = sorted(MODELS)
    cases = []
    for i, name in enumerate(names):
        for j, options in enumerate(SCHEDULES):
            kept = (j - i) % len(SCHEDULES) in (0, 1)
            case_id = f"{name}-{'-'.join(options.values())}"
            marks = () if kept else (SAMPLED_OUT,)
            cases.append(pytest.param(name, options, marks=marks, id=case_id))
    return cases


@pytest.mark.parametrize(("name", "options"), _cases())
def test_inplace_models_match_eager_at_every_stage_count(name, options, tmp_path):
    model = MODELS[name]()
    done = 0
    for stages in (1, 2, 3, 4):
        if options["schedule"] == "zb1p" and stages == 1:
            continue
        try:
            _check(model, stages, tmp_path, **options)
        except BalanceError as err:  # fewer places to cut than stages: a clear refusal
            assert "writing a value in place" in str(err)
            break
        done += 1
    assert done >= 2


def test_writer_stays_with_the_producer(tmp_path):
    compiled = compile_model(ReluInplace(), {"x": torch.randn(8, 16)}, stages=3, microbatches=1)
    for stage in compiled.graph.stages:
        for node in stage.module.graph.nodes:
            for written in mutated_inputs(node):
                assert written.op != "placeholder", f"{node} writes a received value"


class Writers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h.mul_(0.5)
        g = h * 2
        g += h
        k = torch.nn.functional.relu(g, inplace=True)
        return self.act(k) + torch.relu(x)


def test_mutations_are_recognised():
    module = fx.symbolic_trace(Writers())
    written = {n.name: [w.name for w in mutated_inputs(n)] for n in module.graph.nodes}
    assert written["mul_"] == ["a"]  # torch.fx records `g += h` as an out-of-place add
    assert written["relu"] == ["add"] and written["act"] == ["relu"]
    assert written["relu_1"] == [] and written["a"] == [] and written["x"] == []
    graph = fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    add_ = graph.call_function(torch.ops.aten.add_.Tensor, (x, y))
    item = graph.call_function(operator.setitem, (y, 0, x))
    add = graph.call_function(torch.ops.aten.add.Tensor, (x, y))
    assert mutated_inputs(add_) == [x] and mutated_inputs(item) == [y]
    assert mutated_inputs(add) == []


class ExportOnly(nn.Module):
    """Untraceable by torch.fx (data-dependent Python), so it goes through torch.export, whose
    graph keeps aten in-place ops."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:  # a shape check torch.fx cannot trace through a Proxy's len()
            raise ValueError("x must be 2-d")
        h = self.a(x)
        for _ in range(len(x.shape) - 1):
            h.relu_()
        h = self.b(h).add_(1.0)
        return self.c(h)


def test_torch_export_graphs_with_aten_inplace_ops(tmp_path):
    model = ExportOnly()
    compiled = compile_model(copy.deepcopy(model), {"x": torch.randn(2, 16)}, stages=3)
    targets = [str(n.target) for s in compiled.graph.stages for n in s.module.graph.nodes]
    assert compiled.graph.tracer in ("torch.export", "torch.fx")
    if compiled.graph.tracer == "torch.export":
        assert any(t.endswith("_.default") or t.endswith("_.Tensor") for t in targets), targets
    for stages in (2, 3):
        _check(model, stages, tmp_path)
