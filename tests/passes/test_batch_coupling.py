"""batch_coupling finds each op where a model mixes the samples of its batch, and no other."""

from __future__ import annotations

import random

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

import pipecompile
from pipecompile.compiler import compile_model
from pipecompile.errors import MicrobatchError
from pipecompile.ir.graph.noise_floor import Tolerance
from pipecompile.passes import batch_coupling
from pipecompile.runtime.check.step import check_step
from pipecompile.schedules import WHOLE_BATCH


class Contrastive(nn.Module):
    """Two towers, then CLIP's logits: every image against every text of the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(6, 8)
        self.scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        i, t = F.normalize(self.a(x), dim=-1), F.normalize(self.b(y), dim=-1)
        return self.scale.exp() * i @ t.t()


class Centred(nn.Module):
    """Subtracts the batch mean, then more layers: a coupling in the middle."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.c = nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.c(h - h.mean(0))


class Normed(nn.Module):
    """Batch norm in training mode, and dropout: per micro-batch by the pipeline's rules."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.bn, self.drop, self.c = (
            nn.Linear(8, 8),
            nn.BatchNorm1d(8),
            nn.Dropout(0.5),
            nn.Linear(8, 2),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.drop(self.bn(self.a(x))))


class Cumulative(nn.Module):
    """Each row depends on the rows before it only: found by changing the first half."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).cumsum(0)


class Sorted(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sort(dim=0).values * 2


class EachImage(nn.Module):
    """Each sample's features through the batch unbound, then joined again (LLaVA's image
    features); ``first`` also returns sample 0's alone, which a micro-batch would not."""

    def __init__(self, first: bool = False) -> None:
        super().__init__()
        self.layer, self.first = nn.Linear(3, 3), first

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        items = x.unbind(0)  # 4 samples, as traced
        joined = self.layer(torch.cat([items[k] for k in range(4)]))
        return (joined, items[0]) if self.first else (joined,)


def _kinds(model: nn.Module, *inputs: torch.Tensor) -> list[tuple[str, str]]:
    found = batch_coupling(fx.symbolic_trace(model), inputs=list(inputs))
    assert found is not None
    return [(c.kind, c.node) for c in found]


@pytest.mark.parametrize(
    ("model", "inputs", "want"),
    [
        (Contrastive(), (torch.randn(4, 8), torch.randn(4, 6)), [("tail", "matmul")]),
        (Centred(), (torch.randn(4, 8),), [("middle", "mean")]),
        (Normed(), (torch.randn(8, 8),), [("batch norm", "bn")]),
        (Cumulative(), (torch.randn(6, 3),), [("tail", "cumsum")]),
        (Sorted(), (torch.randn(6, 3),), [("tail", "sort")]),
        (EachImage(), (torch.randn(4, 5, 3),), []),
        (EachImage(first=True), (torch.randn(4, 5, 3),), [("tail", "getitem_4")]),
    ],
    ids=["contrastive-head", "centred", "batch-norm", "cumsum", "sort", "unbound", "item-out"],
)
def test_each_mixing_op_is_found_with_its_kind(model, inputs, want):
    assert _kinds(model, *inputs) == want


def test_per_sample_models_mix_nothing_and_are_left_as_they_were():
    """Random per-sample models (attention over the sequence, norms over features, dropout,
    softmax over the last dim): no coupling; weights, buffers and torch's random state as
    before the probe."""
    rng = random.Random(0)
    layers = [
        lambda w: nn.Sequential(nn.Linear(w, w), nn.GELU()),
        lambda w: nn.LayerNorm(w),
        lambda w: nn.Dropout(0.3),
        lambda w: nn.Softmax(dim=-1),
        lambda w: nn.MultiheadAttention(w, 2, batch_first=True),
    ]
    for trial in range(8):
        torch.manual_seed(trial)
        parts = [rng.choice(layers)(8) for _ in range(rng.randint(2, 6))]
        model = _Chain(parts).train()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        x = torch.randn(6, 5, 8)
        state = torch.get_rng_state()
        assert _kinds(model, x) == [], parts
        assert torch.equal(torch.get_rng_state(), state)
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


class _Chain(nn.Module):
    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for part in self.parts:
            attention = isinstance(part, nn.MultiheadAttention)
            x = part(x, x, x, need_weights=False)[0] if attention else part(x)
        return x


def test_batch_norm_running_statistics_are_put_back():
    model = Normed()
    before = model.bn.running_mean.clone(), int(model.bn.num_batches_tracked)
    _kinds(model, torch.randn(8, 8))
    assert torch.equal(model.bn.running_mean, before[0])
    assert int(model.bn.num_batches_tracked) == before[1]


def test_one_sample_or_samples_that_cannot_differ_are_not_analysed():
    assert batch_coupling(fx.symbolic_trace(Centred()), inputs=[torch.randn(1, 8)]) is None
    embedded = nn.Sequential(nn.Embedding(4, 8), nn.Linear(8, 2))
    same_ids = torch.zeros(4, 3, dtype=torch.long)  # every id 0: no other sample to make
    assert batch_coupling(fx.symbolic_trace(embedded), inputs=[same_ids]) is None


def test_a_tail_is_cut_off_and_a_middle_coupling_refused():
    """A contrastive head splits into a body run per micro-batch and a tail run once on the
    joined values (which 1f1b cannot wait for); a mixing op more layers follow is refused."""
    model, inputs = Contrastive(), {"x": torch.randn(8, 8), "y": torch.randn(8, 6)}
    compiled = compile_model(model, inputs, stages=2, microbatches=2)
    assert [(c.kind, c.node) for c in compiled.coupling] == [("tail", "matmul")]
    assert compiled.tail is not None and "matmul" in compiled.tail.module.code
    said = r"matmul .* only the outputs follow it .*--schedule gpipe or looped_bfs"
    with pytest.raises(MicrobatchError, match=said):
        compile_model(model, inputs, stages=2, microbatches=2, schedule="1f1b")
    with pytest.raises(MicrobatchError, match=r"mean .*more of the model's layers follow it"):
        compile_model(Centred(), {"x": torch.randn(8, 8)}, stages=2, microbatches=4)
    searched = compile_model(model, inputs, devices=2)
    assert searched.program.schedule in WHOLE_BATCH and searched.tail is not None


def test_hugging_face_clip_trains_exactly_at_two_micro_batches():
    """CLIPModel from a tiny config (traced by torch.export): its image-text logits are the
    coupling, named by Hugging Face's own line; cut off, the step equals eager's."""
    transformers = pytest.importorskip("transformers")
    config = transformers.CLIPConfig(
        text_config={"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
                     "num_hidden_layers": 1, "num_attention_heads": 2,
                     "max_position_embeddings": 8},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 8, "patch_size": 4},
        projection_dim=8,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.CLIPModel(config)
    inputs = {"input_ids": torch.randint(0, 64, (4, 5)), "pixel_values": torch.randn(4, 3, 8, 8)}

    def loss(output):
        labels = torch.arange(len(output.logits_per_image))
        return F.cross_entropy(output.logits_per_image, labels)

    pipe = pipecompile.compile(model, inputs, stages=2, microbatches=2, dynamic="none",
                               loss_fn=loss, example_targets=())  # fmt: skip
    (tail,) = [c for c in pipe.manifest.batch_coupling if c.kind == "tail"]
    assert "modeling_clip.py" in tail.op and "logits_per_text" in tail.op
    report = check_step(pipe.pipeline, model, inputs, (), loss, tolerance=Tolerance(1e-5))
    assert report.ok, str(report)
