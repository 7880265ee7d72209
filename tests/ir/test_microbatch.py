"""Splitting and joining micro-batches, and the messages for inputs, targets and outputs that
do not fit."""

from __future__ import annotations

import re

import pytest
import torch

from pipecompile.errors import InputError, MicrobatchError
from pipecompile.ir.graph.microbatch import (
    check_target_rows,
    input_mismatch,
    join_microbatches,
    split_microbatches,
)

COMPILED = {"x": ((4, 32), "float32")}  # per micro-batch


def test_split_and_join_round_trip():
    x = torch.randn(8, 3)
    parts = split_microbatches({"x": x}, 2)
    assert [p["x"].shape for p in parts] == [(4, 3), (4, 3)]
    assert torch.equal(join_microbatches([(p["x"],) for p in parts])[0], x)


def test_a_scalar_output_cannot_be_joined():
    parts = [(torch.ones(4, 2), torch.tensor(1.0))] * 2
    with pytest.raises(MicrobatchError, match=r"output 1 \(mean\) is a scalar"):
        join_microbatches(parts, names=["fc", "mean"])


@pytest.mark.parametrize(
    ("x", "message"),
    [
        (torch.randn(8, 16), r"input 'x' has shape \(8, 16\) but out was compiled for \(8, 32\) "
                             r"\(2 micro-batches of \(4, 32\), batch first\); pass inputs"),
        (torch.randn(32), r"has shape \(32,\) .*: it lacks the batch dimension"),
        (torch.randn(8, 32, dtype=torch.float64),
         r"input 'x' has dtype float64 but out was compiled for float32"),
    ],
    ids=["features", "no-batch-dim", "dtype"],
)  # fmt: skip
def test_input_mismatch_names_the_input_and_both_shapes(x, message):
    problem = input_mismatch({"x": x}, COMPILED, 2, where="out")
    assert problem is not None
    assert re.search(message, problem), problem


def test_another_batch_size_fits_unless_exact():
    assert input_mismatch({"x": torch.randn(16, 32)}, COMPILED, 2) is None
    problem = input_mismatch({"x": torch.randn(16, 32)}, COMPILED, 2, exact=True)
    assert problem is not None and "its batch size differs (16, not 8)" in problem


def test_targets_need_the_inputs_or_an_outputs_batch_size():
    inputs, output = {"x": torch.randn(4, 32)}, torch.randn(4, 10)
    check_target_rows(output, (torch.randn(4, 10),), inputs, split=True)
    flat = {"x": torch.randn(4, 16)}, torch.randn(64, 10)  # (batch * seq) rows, like the output
    check_target_rows(flat[1], (torch.randn(64),), flat[0], split=True)
    check_target_rows(output, (torch.randn(3, 10),), inputs, split=False)  # nothing is split
    with pytest.raises(InputError, match=r"target 0 has shape \(6, 10\) but the inputs' "
                       r"batch is 8 \(outputs: 8\)"):  # fmt: skip
        check_target_rows(output, (torch.randn(3, 10),), inputs, split=True, scale=2)
