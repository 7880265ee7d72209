"""Evaluation with a replicated last stage: under ``--nproc`` each replica holds only its
micro-batches' outputs, and the eval loss is still the local run's, for batches of any rows
(``--dynamic batch``, rows that split unevenly); a batch too small to split is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipecompile.errors import PipecompileError
from pipecompile.model.data_hooks import iterable_source
from pipecompile.model.model_file import load_model_file
from pipecompile.options.run import TrainFlags
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.training.loop import train
from pipecompile.surfaces.cli import main
from tests.conftest import TINY_LM, write_model_file

EVAL_ROWS = (8, 6, 5)  # 4 micro-batches: even, then 2,2,1,1 and 2,1,1,1 rows

ROWS_LM = (
    TINY_LM.format(dropout=0.0)
    + f"""

def _batch(seed, rows):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, 7), generator=g)
    return (ids[:, :-1],), (ids[:, 1:],)


def example_inputs():
    return _batch(0, 8)[0]


def example_targets():
    return _batch(0, 8)[1]


def train_batches():
    return [_batch(seed, 8) for seed in range(1, 3)]


def eval_batches():
    return [_batch(100 + k, rows) for k, rows in enumerate({EVAL_ROWS})]
"""
)


@pytest.fixture(scope="module")
def last_replicated(tmp_path_factory):  # type: ignore[no-untyped-def]
    """The model file and its compile: 2 stages, 4 micro-batches, the last stage on 2 ranks."""
    root = tmp_path_factory.mktemp("replicated_eval")
    model = write_model_file(root, ROWS_LM, "rows_lm.py")
    out = root / "out"
    argv = [str(model), "--stages", "2", "--microbatches", "4", "--schedule", "1f1b",
            "--replicate", "1,2", "--dynamic", "batch", "-q", "-o", str(out)]  # fmt: skip
    assert main(argv) == 0
    return root, model, out


def _losses(path: Path) -> list[tuple[str, float]]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [(r["kind"], r["loss"]) for r in records if r["kind"] in ("train", "eval")]


def test_nproc_evaluates_a_replicated_last_stage_as_one_process(last_replicated):
    root, _, out = last_replicated
    runs = {}
    for name, extra in (("local", []), ("nproc", ["--nproc", "3"])):
        metrics = root / f"{name}.jsonl"
        assert main(["run", str(out), "-q", "--seed", "0", "--epochs", "1", "--metrics",
                     str(metrics), *extra]) == 0  # fmt: skip
        runs[name] = _losses(metrics)
    assert [kind for kind, _ in runs["local"]] == ["train", "train", "eval"]
    assert [kind for kind, _ in runs["nproc"]] == ["train", "train", "eval"]
    for (kind, want), (_, have) in zip(runs["local"], runs["nproc"]):
        assert have == pytest.approx(want, rel=1e-6, abs=0), kind


def test_an_eval_batch_with_fewer_rows_than_microbatches_is_named(last_replicated):
    _, model, out = last_replicated
    spec = load_model_file(str(model))
    batches = [spec.module._batch(100, 8), spec.module._batch(101, 3)]
    label = "eval_batches() of rows_lm.py"
    data = iterable_source(spec.module.train_batches(), spec.input_names, "train_batches()")
    with pytest.raises(PipecompileError) as caught:
        train(
            Pipeline.load(out),
            spec.loss_fn,
            data,
            TrainFlags(steps=1, quiet=True, metrics=out / "m.jsonl"),
            eval_data=iterable_source(batches, spec.input_names, label),
        )
    assert str(caught.value) == (
        f"{label}, batch 1 (the evaluation after step 1): input 'ids' has shape (3, 6): "
        "3 rows along dim 0 cannot fill 4 micro-batches; pass batches of at least 4 rows "
        "(drop a last, smaller batch), or compile with fewer --microbatches"
    )
