"""A batch that does not divide into the micro-batches splits as evenly as possible, each
micro-batch's loss weighed by its rows: every synchronous schedule's gradients equal the eager
mini-batch's, and evaluation and inference take any batch size."""

from __future__ import annotations

import pytest
import torch

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.errors import MicrobatchError
from pipecompile.ir.graph.microbatch import (
    even_sizes,
    row_shares,
    split_microbatches,
    split_targets,
)
from pipecompile.ir.graph.noise_floor import Tolerance
from pipecompile.runtime.check.step import check_step
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.schedules import SYNCHRONOUS
from tests.conftest import example_spec

LOOPED = {"interleaved", "looped_bfs"}  # two stages per device, looped


def test_even_sizes_put_the_extra_rows_first_and_shares_average_one():
    assert even_sizes(10, 4) == [3, 3, 2, 2] and even_sizes(8, 4) == [2, 2, 2, 2]
    shares = row_shares(10, 4)
    assert shares == [1.2, 1.2, 0.8, 0.8] and sum(shares) == pytest.approx(4)
    assert row_shares(8, 4) == [1.0] * 4  # exactly one: an even split is unchanged


def test_targets_split_in_step_with_the_inputs():
    ids = torch.arange(5 * 3).reshape(5, 3)
    flat = ids.reshape(-1)  # per token: 3 rows a sample
    parts = split_microbatches({"ids": ids}, 2)
    assert [p["ids"].shape[0] for p in parts] == [3, 2]
    (a,), (b,) = split_targets((flat,), 2, rows=5)
    assert torch.equal(a, parts[0]["ids"].reshape(-1))
    assert torch.equal(b, parts[1]["ids"].reshape(-1))


def test_a_batch_smaller_than_the_micro_batches_is_refused():
    with pytest.raises(MicrobatchError, match=r"3 rows along dim 0 cannot fill 4 micro-batches"):
        split_microbatches({"x": torch.zeros(3, 2)}, 4)
    with pytest.raises(MicrobatchError, match=r"target 0 .* do not split in step"):
        split_targets((torch.zeros(7),), 2, rows=5)


@pytest.mark.parametrize("schedule", sorted(SYNCHRONOUS))
def test_every_synchronous_schedule_trains_an_uneven_batch_as_eager(tmp_path, schedule):
    spec = example_spec("mlp")
    options = {"virtual_stages": 2} if schedule in LOOPED else {}
    compiled = compile_model(spec.model, spec.inputs, stages=4, microbatches=4,
                             schedule=schedule, **options)  # fmt: skip
    pipe = Pipeline.load(
        emit(compiled, tmp_path / "mlp", model=ModelRef(spec.path, spec.name, "mlp"))
    )
    inputs = {k: v[:7] for k, v in spec.inputs.items()}  # 2, 2, 2, 1 rows
    targets = tuple(t[:7] for t in spec.targets)
    report = check_step(
        pipe, spec.model, inputs, targets, spec.loss_fn, tolerance=Tolerance(1e-6, 0)
    )
    assert report.ok, str(report)


def test_a_tied_model_trains_and_infers_at_any_batch_size(compiled_examples):
    spec = example_spec("gpt")
    pipe = Pipeline.load(compiled_examples[("gpt", 2)])  # 2 micro-batches
    for rows in (3, 5):
        inputs = {k: v[:rows] for k, v in spec.inputs.items()}
        targets = tuple(t[:rows] for t in spec.targets)
        report = check_step(
            pipe, spec.model, inputs, targets, spec.loss_fn, tolerance=Tolerance(1e-6)
        )
        assert report.ok, str(report)
        spec.model.eval()
        pipe_eval = [m.eval() for m in pipe.modules if m is not None]
        with torch.no_grad():
            want = spec.model(**inputs)
        got = pipe(inputs)
        assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()
        spec.model.train()
        for m in pipe_eval:
            m.train()
