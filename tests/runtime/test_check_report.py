"""The check's report: a difference no noise floor bounds (shapes that differ, NaN) reads as
such, never as the ratio of the values that did compare."""

from __future__ import annotations

import torch

from pipecompile.ir.graph.noise_floor import NOISE_RULE
from pipecompile.runtime.check.step import CheckReport, compare


def test_a_shape_mismatch_is_beyond_any_noise_floor():
    report = CheckReport("eager model")
    exact = torch.ones(3, dtype=torch.float64)
    compare(report, "output 0", torch.ones(3), torch.ones(3), NOISE_RULE, exact, "outputs")
    assert "x the noise floor" in str(report).splitlines()[2]  # compared: a ratio
    compare(report, "output 1", torch.ones(2), torch.ones(3), NOISE_RULE, exact, "outputs")
    line = str(report).splitlines()[2]
    assert "beyond any noise floor" in line and "x the noise floor" not in line, line
    assert not report.ok and "shape (2,) vs eager (3,)" in report.failures[0]


def test_nan_is_beyond_any_noise_floor():
    report = CheckReport("eager model")
    nan = torch.tensor([float("nan")])
    compare(report, "loss", nan, torch.zeros(1), NOISE_RULE, torch.zeros(1).double(), "loss")
    assert "beyond any noise floor" in str(report).splitlines()[1] and not report.ok


class _Keeps(torch.nn.Module):
    """Keeps a value of its forward on itself, as torchvision's RAFT does: a copy of the
    model after a forward is refused (a non-leaf tensor has no deepcopy)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 2)
        self.last: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last = self.a(x) * 2
        return self.last


def test_a_model_that_cannot_be_copied_leaves_the_check_its_fixed_tolerances():
    import copy

    import pipecompile
    from pipecompile.runtime.check.step import _eager_float64, eager_on_device

    model, x = _Keeps(), torch.randn(4, 4)
    pipe = pipecompile.compile(model, (x,), stages=1)
    model(x)  # its forward has run: it holds a non-leaf tensor now
    try:
        copy.deepcopy(model)
    except RuntimeError:
        pass
    else:  # the case this test is about no longer arises
        raise AssertionError("deepcopy of a module holding a non-leaf tensor succeeded")
    loss = lambda out, t: (out - t).pow(2).mean()  # noqa: E731
    targets = (torch.randn(4, 2),)
    assert _eager_float64(pipe.pipeline, model, {"x": x}, targets, loss, 1) is None
    assert (
        eager_on_device(pipe.pipeline, model, {"x": x}, targets, loss, torch.device("cpu")) is None
    )
