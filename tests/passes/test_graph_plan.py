"""graph_plan: a model with branches side by side compiles into a stage graph where that is
faster, trains exactly like eager under every schedule that runs graphs, and the options that
ask for a shape get it or a refusal naming why. Through the Python API (the command line and
ranks under --nproc run a graph plan in tests/runtime/test_distributed.py)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import pipecompile
from pipecompile.errors import PipecompileError
from pipecompile.ir.graph.noise_floor import Tolerance
from pipecompile.ir.programs.topology import side_by_side, topology_from_manifest
from pipecompile.ir.records.manifest import Manifest
from pipecompile.runtime.check.step import check_step
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.schedules import GRAPHS


class Towers(nn.Module):
    """Two equal towers over two inputs, joined by a product and a sum."""

    def __init__(self) -> None:
        super().__init__()
        self.left = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.right = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (self.left(a) * self.right(b)).sum(-1)


class Lopsided(Towers):
    """A deep tower beside a single layer: side by side, the deep one is the bottleneck."""

    def __init__(self) -> None:
        super().__init__()
        layers = [nn.Linear(8, 32)] + [nn.Linear(32, 32) for _ in range(7)]
        self.left = nn.Sequential(*(m for layer in layers for m in (layer, nn.Tanh())))
        self.right = nn.Sequential(nn.Linear(8, 32))


class InPlaceTowers(Towers):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        left = self.left(a)
        left.mul_(2.0)
        return (left * self.right(b)).sum(-1)


def _data() -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    inputs = {"a": torch.randn(8, 8, generator=g), "b": torch.randn(8, 8, generator=g)}
    return inputs, (torch.randn(8, generator=g),)


def _mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def _manifest(directory: object) -> Manifest:
    return Manifest.from_json(json.loads((directory / "manifest.json").read_text()))  # type: ignore[operator]


@pytest.mark.parametrize("schedule", GRAPHS)
def test_towers_run_side_by_side_and_train_exactly(tmp_path, schedule):
    torch.manual_seed(0)
    model = Towers()
    inputs, targets = _data()
    out = tmp_path / schedule
    pipecompile.compile(
        model, inputs, stages=2, microbatches=4, schedule=schedule, graph=True, directory=out
    )
    manifest = _manifest(out)
    pipe = Pipeline.load(out)
    assert manifest.balance is not None and manifest.balance.shape == "graph"
    apart = side_by_side(topology_from_manifest(manifest), pipe.program.stage_device)
    assert (
        len(apart) == 2
        and pipe.program.stage_device[apart[0]] != pipe.program.stage_device[apart[1]]
    )
    report = check_step(pipe, model, inputs, targets, _mse, tolerance=Tolerance(1e-6))
    assert report.ok, str(report)


def test_the_faster_shape_is_chosen_unless_one_is_asked_for(tmp_path):
    """At 2 micro-batches GPipe runs equal towers in turn in a chain, side by side in a
    graph: the graph is chosen. A deep tower beside one layer is a graph's bottleneck, which
    a chain halves: the chain stays. --chain and --graph get what they ask."""
    inputs, _ = _data()
    pipecompile.compile(Towers(), inputs, stages=2, microbatches=2, directory=tmp_path / "a")
    auto = _manifest(tmp_path / "a").balance
    assert auto is not None and auto.shape == "graph" and auto.shapes is not None
    assert auto.shapes["graph"] < 0.95 * auto.shapes["chain"]
    options = {"stages": 2, "microbatches": 8, "schedule": "1f1b"}
    pipecompile.compile(Lopsided(), inputs, directory=tmp_path / "z", **options)
    kept = _manifest(tmp_path / "z").balance
    assert kept is not None and kept.shape == "chain" and kept.shapes is not None
    assert kept.shapes["graph"] > 0.95 * kept.shapes["chain"]
    pipecompile.compile(Towers(), inputs, stages=2, chain=True, directory=tmp_path / "c")
    chain = _manifest(tmp_path / "c")
    assert chain.balance is not None and chain.balance.shape == "chain"
    assert len(chain.stages) == 2
    pipecompile.compile(Towers(), inputs, stages=2, graph=True, directory=tmp_path / "g")
    assert _manifest(tmp_path / "g").balance.shape == "graph"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("model", "options", "message"),
    [
        (nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8)), {},
         "no branches side by side"),
        (Towers(), {"schedule": "interleaved", "stages": 4, "microbatches": 2},
         "interleaved places its stages by its own rule .* chain plans only; use --schedule"),
        (Towers(), {"chain": True}, "--chain asks for the opposite"),
        (InPlaceTowers(), {}, "mul_.* writes a value in place"),
        (Towers(), {"stages": 1}, "need two devices or more"),
    ],
    ids=["no-branches", "looped-schedule", "with-chain", "in-place", "one-device"],
)  # fmt: skip
def test_graph_refusals_name_why(tmp_path, model, options, message):
    inputs = {"input": torch.randn(4, 8)} if isinstance(model, nn.Sequential) else _data()[0]
    options = {"stages": 2, **options}
    with pytest.raises(PipecompileError, match=message):
        pipecompile.compile(model, inputs, graph=True, directory=tmp_path / "o", **options)
    assert not (tmp_path / "o").exists()
