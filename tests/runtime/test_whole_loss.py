"""A loss over the whole batch (examples/clip.py's contrastive loss) trains exactly: computed
once a step on every micro-batch's outputs joined, through each door; refused where the batch
would be split without it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import pipecompile
from pipecompile.errors import MicrobatchError, ModelFileError, PipecompileError
from pipecompile.ir.graph.noise_floor import Tolerance
from pipecompile.ir.records.manifest import read_manifest
from pipecompile.model.model_file import load_model_file
from pipecompile.runtime.check.step import check_step
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.schedules import WHOLE_BATCH
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES, example_spec

CLIP = str(EXAMPLES / "clip.py")


@pytest.fixture(scope="module")
def clip_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/clip.py at 2 stages, 4 micro-batches, compiled once by the command line."""
    out = tmp_path_factory.mktemp("clip") / "out"
    assert main([CLIP, "--stages", "2", "--microbatches", "4", "-o", str(out), "-q"]) == 0
    return out


def test_the_compile_records_the_loss_and_the_summary_says_so(clip_out, capsys):
    manifest = read_manifest(clip_out)
    assert manifest.balance is not None and manifest.balance.shape == "graph"  # two encoders
    (loss,) = manifest.batch_coupling
    assert loss.kind == "loss" and "clip.py" in loss.op and "mixes the samples" in loss.op
    assert set(WHOLE_BATCH) == {"gpipe", "looped_bfs"}


def test_steps_equal_eager_sgd_on_the_whole_batch(clip_out):
    """Three SGD steps of the pipeline, 4 micro-batches, against the eager model's on the
    whole batch: losses and weights alike (a loss per micro-batch is off by 0.8 at once)."""
    spec = example_spec("clip")
    eager = spec.model
    pipe = Pipeline.load(clip_out)
    pipe.set_optimizer(lambda ps: torch.optim.SGD(ps, lr=0.5))
    optimizer = torch.optim.SGD(eager.parameters(), lr=0.5)
    for _ in range(3):
        got = pipe.train_step(spec.inputs, (), spec.loss_fn).loss
        optimizer.zero_grad()
        want = spec.loss_fn(eager(**spec.inputs))
        want.backward()
        optimizer.step()
        assert abs(float(got) - float(want)) < 1e-5, (float(got), float(want))
    state = pipe.state_dict()
    for name, value in eager.state_dict().items():
        torch.testing.assert_close(state[name], value, atol=1e-5, rtol=1e-4)


def test_run_check_and_two_ranks_equal_eager(clip_out, capfd):
    assert main(["run", str(clip_out), "--check", "--nproc", "2"]) == 0
    text = capfd.readouterr().out
    assert "check passed" in text and "reference: eager model, whole mini-batch" in text


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--accumulate", "2"], "--accumulate 2 splits"),
        (["--nproc", "4", "--dp", "2", "--shard", "grads"], "--dp copies gather their values"),
    ],
)
def test_run_refuses_what_would_split_the_batch(clip_out, capsys, flags, said):
    assert main(["run", str(clip_out), "--steps", "1", *flags]) == 2
    err = capsys.readouterr().err
    assert said in err and "clip.py" in err and "mixes the samples" in err


def test_a_program_that_cannot_wait_for_the_loss_is_refused(clip_out):
    """At compile (naming the schedules that wait), and by every pipeline given one."""
    spec = example_spec("clip")
    with pytest.raises(MicrobatchError, match="1f1b starts the last stage's backward before "
                       "its last forward.*--schedule gpipe or looped_bfs"):  # fmt: skip
        pipecompile.compile(
            spec.model, spec.inputs, stages=2, microbatches=4, schedule="1f1b",
            loss_fn=spec.loss_fn, example_targets=(),
        )  # fmt: skip
    pipe = Pipeline.load(clip_out)  # its manifest records the loss; a 1f1b program of it:
    one_f = pipecompile.compile(spec.model, spec.inputs, stages=2, microbatches=4,
                                schedule="1f1b").pipeline.program  # fmt: skip
    with pytest.raises(PipecompileError, match=r"the program \(1f1b\) starts the last "
                       "stage's backward before its last forward: it cannot wait"):  # fmt: skip
        Pipeline(pipe.manifest, pipe.modules, one_f)


def test_looped_bfs_waits_too():
    spec = example_spec("clip")
    pipe = pipecompile.compile(
        spec.model, spec.inputs, stages=4, microbatches=4, schedule="looped_bfs",
        virtual_stages=2, loss_fn=spec.loss_fn, example_targets=(),
    )  # fmt: skip
    report = check_step(
        pipe.pipeline, spec.model, spec.inputs, (), spec.loss_fn, tolerance=Tolerance(1e-5)
    )
    assert report.ok, str(report)


def test_a_loss_the_compile_did_not_see_is_refused_on_the_first_step():
    """The API compiled without the loss: the first step of a split batch finds it mixes the
    samples and stops, through train_step and fit alike."""
    spec = example_spec("clip")
    pipe = pipecompile.compile(spec.model, spec.inputs, stages=2, microbatches=2)
    with pytest.raises(ModelFileError, match=r"loss_fn \(.*clip.py:\d+\) is not a mean over "
                       r"the samples of its batch: .* \(2 micro-batches\)"):  # fmt: skip
        pipe.train_step(spec.inputs, (), spec.loss_fn, lambda ps: torch.optim.SGD(ps, lr=0.1))
    with pytest.raises(ModelFileError, match="is not a mean over the samples"):
        pipe.fit([(spec.inputs, ())], spec.loss_fn, steps=1)


HEAD = '''"""Two towers, CLIP's logits and its loss inside the model (a learned temperature)."""
import torch
import torch.nn.functional as F


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.a = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.b = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 8))
        self.scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, x, y):
        i, t = F.normalize(self.a(x), dim=-1), F.normalize(self.b(y), dim=-1)
        logits = self.scale.exp() * i @ t.t()
        labels = torch.arange(x.shape[0])
        return logits, (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


def build_model():
    torch.manual_seed(0)
    return Head()


def example_inputs():
    g = torch.Generator().manual_seed(1)
    return {"x": torch.randn(16, 8, generator=g), "y": torch.randn(16, 6, generator=g)}


def example_targets():
    return ()


def loss_fn(output):
    return output[1]
'''


def test_a_head_inside_the_model_trains_exactly(tmp_path, capfd):
    """The logits and the loss computed in the model: cut off into tail.py, run once a step
    on the 4 micro-batches' embeddings joined; steps, the temperature's gradient, inference
    and two ranks equal eager on the whole batch."""
    path = tmp_path / "head.py"
    path.write_text(HEAD)
    out = tmp_path / "out"
    assert main([str(path), "--stages", "2", "--microbatches", "4", "-o", str(out), "-q"]) == 0
    assert "class Tail" in (out / "tail.py").read_text()
    assert main(["run", str(out), "--check", "--nproc", "2"]) == 0
    assert "check passed" in capfd.readouterr().out
    spec = load_model_file(str(path))
    pipe = Pipeline.load(out)
    torch.testing.assert_close(pipe(spec.inputs)[0], spec.model(**spec.inputs)[0])
    pipe.set_optimizer(lambda ps: torch.optim.SGD(ps, lr=0.5))
    optimizer = torch.optim.SGD(spec.model.parameters(), lr=0.5)
    for _ in range(3):
        got = pipe.train_step(spec.inputs, (), spec.loss_fn).loss
        optimizer.zero_grad()
        want = spec.loss_fn(spec.model(**spec.inputs))
        want.backward()
        optimizer.step()
        assert abs(float(got) - float(want)) < 1e-5, (float(got), float(want))
    torch.testing.assert_close(pipe.state_dict()["scale"], spec.model.scale.detach())


DISTINCT = f"""import sys
import torch
sys.path.insert(0, {str(EXAMPLES)!r})
from clip import BATCH_SIZE, IMAGE_SIZE, VOCAB, TEXT_LENGTH, build_model, example_inputs
from clip import example_targets, loss_fn


def train_batches():
    batches = []
    for k in range(4):
        g = torch.Generator().manual_seed(100 + k)
        pixels = torch.randn(BATCH_SIZE, 3, IMAGE_SIZE, IMAGE_SIZE, generator=g)
        ids = torch.randint(0, VOCAB, (BATCH_SIZE, TEXT_LENGTH), generator=g)
        batches.append(({{"pixels": pixels, "ids": ids}}, ()))
    return batches
"""


def test_dp_copies_gather_the_global_batch(tmp_path, capfd):
    """--nproc 2 --dp 2: copy k trains on batches k, k + 2; the copies gather their
    embeddings, so two SGD steps equal eager's on the global batches (0 and 1, 2 and 3),
    not the mean of each copy's own contrastive loss."""
    model = tmp_path / "clip_data.py"
    model.write_text(DISTINCT)
    out, saved, weights = tmp_path / "out", tmp_path / "saved", tmp_path / "w.safetensors"
    assert main([str(model), "--stages", "1", "-q", "-o", str(out)]) == 0
    train = ["--steps", "2", "--optimizer", "sgd", "--lr", "0.5", "--save", str(saved)]
    assert main(["run", str(out), "--nproc", "2", "--dp", "2", *train]) == 0
    assert main(["export", str(out), "--train-state", str(saved), "-o", str(weights)]) == 0
    capfd.readouterr()
    spec = load_model_file(str(model))
    batches = [b for b, _ in spec.module.train_batches()]

    def trained(steps: list[list[int]], joined: bool) -> dict[str, torch.Tensor]:
        """SGD on each step's batches joined (the global batch), or on the mean of each
        batch's own loss (each copy's objective without the gather)."""
        model = spec.module.build_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        for step in steps:
            parts = [step] if joined else [[i] for i in step]
            losses = [
                spec.loss_fn(
                    model(**{k: torch.cat([batches[i][k] for i in p]) for k in batches[0]})
                )
                for p in parts
            ]
            optimizer.zero_grad()
            (sum(losses) / len(losses)).backward()
            optimizer.step()
        return model.state_dict()

    got = load_file(weights)
    want, per_copy = trained([[0, 1], [2, 3]], True), trained([[0, 1], [2, 3]], False)
    gap = max((got[k] - want[k]).abs().max().item() for k in got)
    off = max((got[k] - per_copy[k]).abs().max().item() for k in got)
    assert gap < 1e-5 and off > 100 * max(gap, 1e-7), (gap, off)
