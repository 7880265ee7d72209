"""A model written for torch.distributed.pipelining keeps its boundaries: ``pipe_split()``
calls in forward start a stage as ``pipecompile.split_point()`` does, and the peer's
``split_spec`` (module path -> SplitPoint) is taken as ``split_at``."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.pipelining import SplitPoint, pipe_split

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.errors import SplitError
from pipecompile.ir.graph.noise_floor import Tolerance
from pipecompile.runtime.check.step import check_step
from pipecompile.runtime.pipeline import Pipeline


class Marked(nn.Module):
    """Four layers, the peer's marker after the first: flops alone would cut after the second."""

    def __init__(self, marked: bool = True) -> None:
        super().__init__()
        self.marked = marked
        self.a, self.b, self.c, self.d = (nn.Linear(16, 16) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.a(x))
        if self.marked:
            pipe_split()
        return self.d(torch.relu(self.c(torch.relu(self.b(x)))))


def _owners(compiled) -> list[list[str]]:  # type: ignore[no-untyped-def]
    """Per stage, the layers whose weights it holds."""
    return [
        sorted({name.split(".")[0] for names in s.params.values() for name in names})
        for s in compiled.graph.stages
    ]


X = torch.randn(8, 16)


def test_pipe_split_starts_a_stage_where_the_balancer_would_not():
    assert _owners(compile_model(Marked(False), {"x": X}, stages=2, microbatches=2)) == [
        ["a", "b"],
        ["c", "d"],
    ]
    assert _owners(compile_model(Marked(), {"x": X}, stages=2, microbatches=2)) == [
        ["a"],
        ["b", "c", "d"],
    ]


def test_the_peers_op_is_put_back_and_the_model_still_runs_eagerly(tmp_path):
    before = torch.ops.pippy._pipe_split
    torch.manual_seed(0)
    model = Marked()
    compiled = compile_model(model, {"x": X}, stages=2, microbatches=2)
    assert torch.ops.pippy._pipe_split is before
    assert model(X).shape == (8, 16)  # pipe_split() is a no-op outside a trace again
    pipe = Pipeline.load(emit(compiled, tmp_path / "m", model=ModelRef(None, "m", "m")))

    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((out - y) ** 2).mean()

    report = check_step(
        pipe, model, {"x": X}, (torch.randn(8, 16),), loss, tolerance=Tolerance(1e-6)
    )
    assert report.ok, str(report)


def test_the_peers_split_spec_is_taken_as_split_at():
    spec = {"c": SplitPoint.BEGINNING, "a": SplitPoint.END}
    by_spec = compile_model(Marked(False), {"x": X}, stages=3, microbatches=2, split_at=spec)
    assert _owners(by_spec) == [["a"], ["b"], ["c", "d"]]
    by_text = compile_model(
        Marked(False), {"x": X}, stages=3, microbatches=2, split_at=("before:c", "after:a")
    )
    assert _owners(by_text) == _owners(by_spec)


def test_a_split_spec_value_that_is_no_split_point_is_refused():
    with pytest.raises(SplitError, match=r"split_spec\['c'\] is 'start'; give SplitPoint"):
        compile_model(Marked(False), {"x": X}, stages=2, split_at={"c": "start"})


class Aliased(nn.Module):
    """The peer's own example shape: a matmul on a parameter, then the marker, then the same
    parameter again under a second name (an alias) and a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.mm_param = nn.Parameter(torch.randn(16, 16))
        self.mm_param2 = self.mm_param
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(torch.mm(x, self.mm_param))
        pipe_split()
        return self.lin(torch.mm(x, self.mm_param2))


def test_the_cut_falls_exactly_at_the_marker_with_an_aliased_parameter(tmp_path):
    torch.manual_seed(0)
    model = Aliased()
    compiled = compile_model(model, {"x": X}, stages=2, microbatches=2)
    ops = [
        [
            getattr(n.target, "__name__", str(n.target))
            for n in s.module.graph.nodes
            if n.op in ("call_function", "call_module")
        ]
        for s in compiled.graph.stages
    ]
    assert ops == [["mm", "relu", "send"], ["recv", "mm", "lin"]]
    pipe = Pipeline.load(emit(compiled, tmp_path / "m", model=ModelRef(None, "m", "m")))

    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((out - y) ** 2).mean()

    report = check_step(
        pipe, model, {"x": X}, (torch.randn(8, 16),), loss, tolerance=Tolerance(1e-5)
    )
    assert report.ok, str(report)
