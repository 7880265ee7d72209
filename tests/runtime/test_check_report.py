"""The check's report: a difference no noise floor bounds (shapes that differ, NaN) reads as
such, never as the ratio of the values that did compare."""

from __future__ import annotations

import torch

from pipecompile.runtime.check.step import CheckReport, compare


def test_a_shape_mismatch_is_beyond_any_noise_floor():
    report = CheckReport("eager model")
    exact = torch.ones(3, dtype=torch.float64)
    compare(report, "output 0", torch.ones(3), torch.ones(3), None, None, exact, "outputs")
    assert "x the noise floor" in str(report).splitlines()[2]  # compared: a ratio
    compare(report, "output 1", torch.ones(2), torch.ones(3), None, None, exact, "outputs")
    line = str(report).splitlines()[2]
    assert "beyond any noise floor" in line and "x the noise floor" not in line, line
    assert not report.ok and "shape (2,) vs eager (3,)" in report.failures[0]


def test_nan_is_beyond_any_noise_floor():
    report = CheckReport("eager model")
    nan = torch.tensor([float("nan")])
    compare(report, "loss", nan, torch.zeros(1), None, None, torch.zeros(1).double(), "loss")
    assert "beyond any noise floor" in str(report).splitlines()[1] and not report.ok
