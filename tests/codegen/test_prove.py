"""The proof at the end of a compile: a stage file that computes something else is refused
naming the stage, node and module path, before any file is put in place; the models the zoo
found wrong (settings a printed form drops, fx.wrap helpers, versioned state dicts) compile
and check equal to eager."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import pipecompile
import pipecompile.codegen.stage_source as stage_source
from pipecompile.errors import TraceError, VerifyError
from pipecompile.ir.graph.noise_floor import agreement
from pipecompile.ir.graph.random_ops import is_random, random_nodes
from pipecompile.model.model_file import load_model_file
from pipecompile.surfaces.cli import main

POOLS = """
import torch
from torch import nn


class Pools(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.lp = nn.LPPool2d(2, 3, stride=1)
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        self.ceil = nn.AvgPool2d(3, 2, ceil_mode=True)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        x = self.conv(x)
        x = x + self.pool(x)
        x = self.lp(x.abs() + 0.1)
        x = self.ceil(self.up(x))
        return self.head(x.mean((2, 3)))


def build_model():
    torch.manual_seed(0)
    return Pools()


def example_inputs():
    return (torch.randn(4, 3, 12, 12),)


def example_targets():
    return (torch.randint(0, 10, (4,)),)


def loss_fn(out, y):
    return torch.nn.functional.cross_entropy(out, y)
"""

# A helper registered with torch.fx.wrap (as torchvision registers stochastic_depth), and a
# module whose own state-dict loading needs the version metadata (as torchvision's MNASNet).
WRAPPED = """
import torch
import torch.fx
from torch import nn


def drop_path(x, p: float, training: bool):
    if not training or p == 0.0:
        return x
    keep = x.new_empty([x.shape[0]] + [1] * (x.ndim - 1)).bernoulli_(1 - p)
    return x * keep / (1 - p)


torch.fx.wrap("drop_path")


def positive(x):
    if x.sum() > 0:  # data-dependent: neither tracer can take it
        return x
    return -x


torch.fx.wrap("positive")


class Block(nn.Module):
    _version = 2

    def __init__(self, helper):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.helper = helper

    def forward(self, x):
        y = self.lin(x)
        return x + (drop_path(y, 0.0, self.training) if self.helper else positive(y))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args):
        if local_metadata.get("version") != 2:
            raise ValueError("version should be set to 2")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(*[Block(True) for _ in range(4)])


def build_opaque():
    return nn.Sequential(Block(True), Block(False))


def example_inputs():
    return (torch.randn(4, 8),)


def example_targets():
    return (torch.randn(4, 8),)


def loss_fn(out, y):
    return ((out - y) ** 2).mean()
"""


@pytest.fixture(autouse=True)
def proving(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite turns the proof off for its other tests (tests/conftest.py)."""
    monkeypatch.setenv("PIPECOMPILE_VERIFY", "on")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prove")
    (root / "pools.py").write_text(textwrap.dedent(POOLS))
    (root / "wrapped.py").write_text(textwrap.dedent(WRAPPED))
    return root


def _printed_form(module: nn.Module) -> str | None:
    """The old, wrong emitter: a leaf rebuilt from its printed form (drops settings)."""
    return "torch.nn." + repr(module) if not list(module.children()) else None


def test_settings_kept_and_checked_equal_to_eager(files: Path, tmp_path: Path) -> None:
    out = tmp_path / "pools"
    assert main([str(files / "pools.py"), "--stages", "2", "-q", "-o", str(out)]) == 0
    text = (out / "stage_0.py").read_text() + (out / "stage_1.py").read_text()
    assert "count_include_pad=False" in text and "align_corners=True" in text
    assert main(["run", str(out), "--check"]) == 0


def test_a_wrong_stage_file_is_refused_and_nothing_is_replaced(
    files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "pools"
    args = [str(files / "pools.py"), "--stages", "2", "-q", "-o", str(out)]
    assert main(args) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(stage_source, "leaf_constructor", _printed_form)
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "stage 0's emitted code does not compute what the traced model does" in err
    assert "node pool, call_module pool, module path pool" in err
    assert "noise floor" in err and "--no-verify" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main([*args, "--no-verify"]) == 0  # written anyway, as asked
    assert "count_include_pad" not in (out / "stage_0.py").read_text()


def test_the_proof_through_the_api(monkeypatch: pytest.MonkeyPatch) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.AvgPool1d(3, 1, 1, count_include_pad=False))
    x = torch.randn(2, 3, 4)
    pipecompile.compile(model, (x,), stages=2)
    monkeypatch.setattr(stage_source, "leaf_constructor", _printed_form)
    with pytest.raises(
        VerifyError, match=r"stage 1.s emitted code .* call_module p_1, module path 1:"
    ):
        pipecompile.compile(model, (x,), stages=2)
    pipecompile.compile(model, (x,), stages=2, no_verify=True)


def test_fx_wrapped_helpers_are_traced_through(files: Path, tmp_path: Path) -> None:
    """The helper is inlined (torch.fx, no opaque call in a stage file), and the module's
    versioned state dict loads into the eager reference of --check."""
    out = tmp_path / "wrapped"
    assert main([str(files / "wrapped.py"), "--stages", "2", "-q", "-o", str(out)]) == 0
    assert '"tracer": "torch.fx"' in (out / "manifest.json").read_text()
    assert main(["run", str(out), "--check"]) == 0


def test_a_helper_neither_tracer_takes_is_named(files: Path) -> None:
    spec = load_model_file(f"{files / 'wrapped.py'}:build_opaque")
    with pytest.raises(TraceError) as err:
        pipecompile.compile(spec.model, spec.inputs, stages=2)
    text = str(err.value)
    assert "module 1 calls positive (" in text and "which torch.fx.wrap keeps opaque" in text
    assert "traced through, they fail" in text and "wrapped.py" in text  # the line


def test_the_noise_floor_scales_with_the_rounding() -> None:
    """A summation in another order passes on a deep product; an error of 1e-4 fails on a
    shallow op, where a fixed tolerance of 1e-3 would have hidden it."""
    torch.manual_seed(0)
    a = torch.randn(64, 64, dtype=torch.float64)
    deep, deep32 = a, a.float()
    for _ in range(30):
        deep, deep32 = torch.tanh(deep @ a) * 4, torch.tanh(deep32 @ a.float()) * 4
    reordered = torch.tanh(deep32.flip(0).flip(0) @ a.float()) * 4
    exact = torch.tanh(deep @ a) * 4
    assert agreement(reordered, torch.tanh(deep32 @ a.float()) * 4, exact).ok
    x = torch.randn(1000, dtype=torch.float64)
    found = agreement(x.float() + 1e-4, x.float(), x)
    assert not found.ok and found.ratio > 100
    assert agreement(x.float(), x.float(), x).ratio == 0.0


def test_stages_with_random_ops_are_proved_against_their_graphs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Dropout draws in another order than the eager model: each stage is compared with its
    traced graph on the same random numbers instead, forward and backward; stale gradients
    on the user's model change nothing."""
    pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.Dropout(0.5), pool, nn.Flatten(), nn.Linear(4 * 36, 3)
    )
    x = torch.randn(4, 2, 6, 6)
    model(x).sum().backward()  # stale .grad everywhere
    pipecompile.compile(model, (x,), stages=2)
    monkeypatch.setattr(stage_source, "leaf_constructor", _printed_form)
    wrong = r"stage 1.s emitted code .* call_module p_2, module path 2"
    with pytest.raises(VerifyError, match=wrong):
        pipecompile.compile(model, (x,), stages=2)


def test_without_a_float64_twin_a_fixed_tolerance_decides() -> None:
    x = torch.randn(100)
    assert agreement(x + 5e-6, x, None).ok
    assert not agreement(x + 1e-3, x, None).ok


@pytest.mark.parametrize("dropout", [0.0, 0.5], ids=["against-eager", "against-graphs"])
def test_the_proof_leaves_the_users_model_as_it_was(dropout: float) -> None:
    """Its runs share the parameters' memory, never their gradients or buffers."""
    model = nn.Sequential(
        nn.Linear(4, 6),
        nn.BatchNorm1d(6),
        nn.Dropout(dropout) if dropout else nn.Identity(),
        nn.Linear(6, 2),
        nn.BatchNorm1d(2),
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pipecompile.compile(model, (torch.randn(8, 4),), stages=2)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())


def test_a_dropout_at_rate_0_is_not_random() -> None:
    """Its value is its input: the proof compares such stages with the eager model (the
    zoo's models all have their dropout at rate 0), not only with their traced graphs."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0), nn.ReLU(), nn.Linear(4, 2))
    traced = torch.fx.symbolic_trace(model)
    assert random_nodes(traced) == []
    traced.get_submodule("1").p = 0.1
    assert [n.name for n in random_nodes(traced)] == ["_1"]
    graph = torch.fx.symbolic_trace(lambda x: torch.nn.functional.dropout(x, 0.0, True)).graph
    assert not any(is_random(n, model) for n in graph.nodes)


class _ReadsItsWeight(nn.Module):
    """timm's XCiT positional encoding: a module reads its own weight's dtype, so the stage
    holds that weight under two names (the module's and a tied attribute)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv2d(4, 4, 1)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x.to(self.proj.weight.dtype))
        return self.head(x.mean((2, 3)))


def test_a_weight_a_stage_holds_under_two_names_is_counted_once() -> None:
    """The proof compared twice the gradient with eager's and refused XCiT: a false alarm."""
    model = _ReadsItsWeight()
    compiled = pipecompile.compile(model, (torch.randn(4, 4, 3, 3),), stages=2)
    assert compiled is not None


def test_after_a_mismatch_with_eager_each_stage_is_compared_from_its_files(monkeypatch) -> None:
    """The chain's training forward moves the batch norms' statistics and counters: the
    per-stage comparison that follows a mismatch with eager builds the stages from their files
    again (timm's ghostnet, whose norms read num_batches_tracked, was named a stage file's
    error, hiding the real finding)."""
    import pipecompile.codegen.prove as prove

    found = ("model output 0", agreement(torch.ones(1), torch.zeros(1), None))
    monkeypatch.setattr(prove, "_against_eager", lambda files, run, example: found)
    built = []
    real = prove._build
    monkeypatch.setattr(prove, "_build", lambda f, training: built.append(f) or real(f, training))
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 2), nn.BatchNorm1d(2))
    with pytest.raises(VerifyError, match="though every stage file equals its traced graph"):
        pipecompile.compile(model, (torch.randn(8, 4),), stages=2)
    assert [f.stage.index for f in built] == [0, 1, 0, 1]
