"""Batches of any shape: ``--dynamic`` / ``dynamic_shapes()`` trace the batch size and the
sequence length as symbols; the manifest says how each message's shape follows them; the
pipeline trains, evaluates and infers at any size and length, locally and under ``--nproc``,
equal to eager; what the model or the split fixes is named with its op."""

from __future__ import annotations

import json

import pytest
import torch

from pipecompile.errors import InputError, ShapeError
from pipecompile.ir.graph.dynamic import DynamicDims
from pipecompile.ir.graph.noise_floor import Tolerance
from pipecompile.model.model_file import load_model_file
from pipecompile.runtime.check.step import check_step
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.surfaces.cli import main
from tests.conftest import SAMPLED_OUT, TINY_LM, example_spec, write_model_file

VARYING_LM = (
    TINY_LM.format(dropout=0.0)
    + """

def _batch(seed, rows=None, length=None):
    g = torch.Generator().manual_seed(seed)
    rows = rows or int(torch.randint(2, 7, (1,), generator=g))
    length = length or int(torch.randint(3, 12, (1,), generator=g))
    ids = torch.randint(0, VOCAB, (rows, length + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def example_inputs():
    return (_batch(0, 4, 8)[0],)


def example_targets():
    return (_batch(0, 4, 8)[1],)


def train_batches():
    return [_batch(seed) for seed in range(1, 7)]


def eval_batches():
    return [_batch(seed) for seed in range(100, 102)]


def dynamic_shapes():
    return {"ids": {0: "batch", 1: ("seq", 12)}}

"""
)


@pytest.fixture(scope="module")
def varying(tmp_path_factory):  # type: ignore[no-untyped-def]
    """The model file and its 2-stage compile (2 micro-batches, 1f1b)."""
    root = tmp_path_factory.mktemp("dynamic")
    model = write_model_file(root, VARYING_LM, "varying_lm.py")
    out = root / "v2"
    assert main([str(model), "--stages", "2", "--microbatches", "2", "--schedule", "1f1b",
                 "-q", "-o", str(out)]) == 0  # fmt: skip
    return root, model, out


def test_the_manifest_says_how_each_message_follows_the_symbols(varying):
    _, _, out = varying
    dynamic = DynamicDims.from_json(json.loads((out / "manifest.json").read_text())["dynamic"])
    assert dynamic.inputs == {"ids": {0: "batch", 1: "seq"}}
    assert dynamic.sizes == {"batch": 2, "seq": 8} and dynamic.split == ("batch",)
    assert dynamic.maxima == {"seq": 12}
    (value, dims), = dynamic.edges.items()  # fmt: skip
    assert dims == {0: {"batch": 1}, 1: {"seq": 1}}  # (B, T, width)
    assert dynamic.shape_of(value, (2, 8, 16), {"batch": 3, "seq": 5}) == (3, 5, 16)


def test_any_rows_and_length_train_as_eager(varying):
    _, model, out = varying
    spec = load_model_file(str(model))
    pipe = Pipeline.load(out)
    ids, target = spec.inputs["ids"], spec.targets[0]
    for rows, length in ((4, 8), (3, 5), (7, 11)):  # 3 and 7 rows split unevenly
        inputs = {"ids": ids.repeat(2, 2)[:rows, :length]}
        targets = (target.repeat(2, 2)[:rows, :length],)
        report = check_step(
            pipe, spec.model, inputs, targets, spec.loss_fn, tolerance=Tolerance(1e-6)
        )
        assert report.ok, f"{rows}x{length}\n{report}"


def test_a_batch_above_the_stated_maximum_is_named(varying):
    _, model, out = varying
    spec = load_model_file(str(model))
    long = {"ids": spec.inputs["ids"].repeat(1, 2)[:, :13]}
    with pytest.raises(InputError, match=r"its seq \(dim 1\) is 13, above the maximum of 12"):
        Pipeline.load(out).train_step(long, (long["ids"],), spec.loss_fn)


def test_nproc_trains_and_evaluates_varying_batches_as_one_process(varying):
    root, model, out = varying
    metrics = {}
    for name, extra in (("local", []), ("nproc", ["--nproc", "2"])):
        metrics[name] = root / f"{name}.jsonl"
        assert main(["run", str(out), "-q", "--seed", "0", "--epochs", "1", "--metrics",
                     str(metrics[name]), *extra]) == 0  # fmt: skip
    lines = {k: [json.loads(x) for x in v.read_text().splitlines()] for k, v in metrics.items()}
    local = [(r["kind"], r["loss"]) for r in lines["local"] if r["kind"] in ("train", "eval")]
    nproc = [(r["kind"], r["loss"]) for r in lines["nproc"] if r["kind"] in ("train", "eval")]
    assert [k for k, _ in local] == ["train"] * 6 + ["eval"] and len(nproc) == len(local)
    for (kind, want), (_, have) in zip(local, nproc):
        assert have == pytest.approx(want, rel=1e-6, abs=0), kind


@SAMPLED_OUT  # the training run above sizes every message of varying batches under --nproc
def test_nproc_check_at_several_batch_shapes(varying, capfd):
    _, _, out = varying
    assert main(["run", str(out), "--check", "--nproc", "2", "--batch-shapes", "3x5,8x11"]) == 0
    text = capfd.readouterr().out  # rank 0's
    for shape in ("4x8 (the example)", "3x5", "8x11"):
        assert f"batch shape {shape}:" in text
    assert text.count("check passed") == 3


def test_check_takes_batch_shapes(varying, capsys):
    _, _, out = varying
    assert main(["run", str(out), "--check", "--batch-shapes", "3x5,8x11"]) == 0
    text = capsys.readouterr().out
    assert "batch shape 3x5:" in text and text.count("check passed") == 3


SPECIALISED = """import torch
from torch import nn


class Fixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.b(self.a(x).view(4, 2, 4).flatten(1))


def build_model():
    return Fixed()


def example_inputs():
    return (torch.randn(8, 8),)
"""


def test_a_dimension_the_model_fixes_is_named_with_its_op(tmp_path, capsys):
    model = write_model_file(tmp_path, SPECIALISED)
    argv = [str(model), "--stages", "2", "--microbatches", "2", "--dynamic", "batch"]
    assert main([*argv, "-q", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "the model cannot take another batch (batch=8): view (File " in err, err
    assert ", in forward: return self.b(self.a(x).view(4, 2, 4).flatten(1))) fails" in err, err
    assert not (tmp_path / "o").exists()


CROSSING = """import torch
from torch import nn
from pipecompile import split_point


class Crossing(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        rows = x.size(0)
        y = self.a(x)
        split_point()
        return self.b(y) * rows


def build_model():
    return Crossing()


def example_inputs():
    return (torch.randn(4, 8),)
"""


def test_a_number_of_sizes_crossing_a_boundary_is_computed_again(tmp_path):
    from pipecompile.codegen.emit import ModelRef, emit
    from pipecompile.compiler import compile_model

    path = write_model_file(tmp_path, CROSSING)
    spec = load_model_file(str(path))
    compiled = compile_model(spec.model, spec.inputs, stages=2, dynamic="batch")
    stage1 = compiled.graph.stages[1]
    assert "x" in stage1.inputs  # received for its size: no constant 4 written in
    pipe = Pipeline.load(emit(compiled, tmp_path / "o", model=ModelRef(path, "build_model", "m")))
    for rows in (4, 7):
        x = torch.randn(rows, 8)
        with torch.no_grad():
            assert torch.allclose(pipe({"x": x}), spec.model(x), atol=1e-6), rows


def test_unknown_symbols_and_bad_hooks_are_refused(tmp_path, capsys):
    from pipecompile.ir.graph.dynamic import asked_dims

    with pytest.raises(ShapeError, match=r"--dynamic length: no such dimension"):
        asked_dims("batch,length", {"x": torch.zeros(2, 3)})
    bad = write_model_file(tmp_path, SPECIALISED + "\n\ndef dynamic_shapes():\n    return [0]\n")
    assert main([str(bad), "--stages", "2", "-q", "-o", str(tmp_path / "o")]) == 2
    assert "dynamic_shapes() returned list [0]" in capsys.readouterr().err


def test_a_hugging_face_model_traced_by_export_takes_any_batch_and_length(tmp_path):
    from pipecompile.codegen.emit import ModelRef, emit
    from pipecompile.compiler import compile_model
    from tests.conftest import EXAMPLES, example_spec

    spec = example_spec("hf_gpt2")  # torch.export: the sizes stay symbolic where asked
    compiled = compile_model(spec.model, spec.inputs, stages=2, microbatches=2,
                             dynamic="batch,seq")  # fmt: skip
    assert compiled.graph.tracer == "torch.export"
    assert "input_ids" in compiled.graph.stages[1].inputs  # its sizes, computed again there
    ref = ModelRef(EXAMPLES / "hf_gpt2.py", "build_model", "hf_gpt2")
    pipe = Pipeline.load(emit(compiled, tmp_path / "o", model=ref))
    ids, target = spec.inputs["input_ids"], spec.targets[0]
    for rows, length in ((3, 7), (5, 20)):
        inputs = {"input_ids": ids.repeat(2, 2)[:rows, :length]}
        targets = (target.repeat(2, 2)[:rows, :length],)
        report = check_step(
            pipe, spec.model, inputs, targets, spec.loss_fn, tolerance=Tolerance(1e-5)
        )
        assert report.ok, f"{rows}x{length}\n{report}"


def test_every_example_lets_the_batch_vary_without_a_flag(compiled_examples):
    """The batch is symbolic by default: each bundled example compiled without --dynamic
    takes other batch sizes (the Hugging Face one through torch.export) and equals eager."""
    from pipecompile.runtime.load import read_manifest

    for (name, stages), out in compiled_examples.items():
        dynamic = read_manifest(out).dynamic
        assert dynamic.split == ("batch",) and not dynamic.fixed, (name, stages, dynamic)
    spec = example_spec("hf_gpt2")
    pipe = Pipeline.load(compiled_examples[("hf_gpt2", 2)])
    ids = spec.inputs["input_ids"]
    for rows in (2, ids.shape[0] + 2):  # fewer and more rows than traced
        inputs = {"input_ids": ids.repeat(2, 1)[:rows]}
        report = check_step(pipe, spec.model, inputs, (spec.targets[0].repeat(2, 1)[:rows],),
                            spec.loss_fn, tolerance=Tolerance(1e-5))  # fmt: skip
        assert report.ok, f"{rows} rows\n{report}"


def test_a_model_that_fixes_its_batch_is_told_at_compile_time(tmp_path, capsys):
    model = write_model_file(tmp_path, SPECIALISED)
    argv = [str(model), "--stages", "2", "--microbatches", "2", "-q", "-o", str(tmp_path / "o")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "note: the batch size is fixed at 8 rows (2 micro-batches of 4): " in err, err
    assert "the view at " in err and "asks for [4, 2, 4], 4 rows written as a constant" in err
    pipe = Pipeline.load(tmp_path / "o")
    assert "view" in pipe.manifest.dynamic.fixed
    with pytest.raises(InputError, match=r"input 'x' has shape \(6, 8\)"):
        pipe.train_step({"x": torch.randn(6, 8)}, (torch.randn(6, 8),), torch.nn.MSELoss())
    argv[-1] = str(tmp_path / "none")
    assert main([*argv, "--dynamic", "none"]) == 0
    assert "note:" not in capsys.readouterr().err  # asked for: nothing to say
    assert not Pipeline.load(tmp_path / "none").manifest.dynamic.symbols


def test_dynamic_flag_and_hook_merge_or_refuse_their_conflict() -> None:
    from pipecompile.ir.graph.dynamic import asked_maxima, merged_dynamic

    inputs = {"ids": torch.zeros(4, 8, dtype=torch.long)}
    stated = {"ids": {1: ("seq", 12)}}
    merged = merged_dynamic("batch", stated, inputs)
    assert merged == {"ids": {1: ("seq", 12), 0: "batch"}} and asked_maxima(merged) == {"seq": 12}
    assert merged_dynamic("seq", stated, inputs) == stated  # the same name: nothing new
    assert merged_dynamic(None, stated, inputs) is stated
    assert merged_dynamic("batch", None, inputs) == "batch"
    with pytest.raises(ShapeError, match=r"makes dim 1 of input 'ids' 'seq', and the model "):
        merged_dynamic("seq", {"ids": {1: "length"}}, inputs)
    with pytest.raises(ShapeError, match=r"--dynamic none keeps every size .* 'ids' dim 1 \(seq"):
        merged_dynamic("none", stated, inputs)
    with pytest.raises(ShapeError, match=r"none keeps every size as traced; give it alone"):
        merged_dynamic("none,seq", stated, inputs)
