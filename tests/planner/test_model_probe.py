"""The search's eager probe of the model: the corrected cost model prices the model's work
at the probed sizes as the probe timed it (the fixed and the per-sample part each), the
probe leaves the model as it found it, and gives up, pricing by the calibration alone,
where it cannot time the model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipecompile.ir.programs.cost_model import CostModel
from pipecompile.planner import model_probe
from pipecompile.planner.choose import traced_facts
from pipecompile.planner.model_probe import Probe, corrected, probe_model, probe_sizes

MACHINE = CostModel(
    flops_rate=5e10, op_overhead=3e-6, half_work=2e6, elementwise_rate=1e9, conv_rate=3e10
)


def _convnet() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 10),
    )


def _priced(machine: CostModel, facts, size: int) -> float:  # type: ignore[no-untyped-def]
    return sum(facts.at(size, machine).cost) / 1e12


def test_corrected_prices_the_probed_seconds() -> None:
    model = _convnet()
    facts, _ = traced_facts(model, {"input": torch.randn(16, 3, 8, 8)})
    before = [_priced(MACHINE, facts, s) for s in (2, 16)]
    # the model's fixed seconds three times the cost model's, its work half as fast again
    per_sample = (before[1] - before[0]) / 14
    fixed = before[0] - 2 * per_sample
    timed = Probe((2, 16), (3 * fixed + 1.5 * per_sample * 2, 3 * fixed + 1.5 * per_sample * 16))
    fixed_up = corrected(MACHINE, facts, timed)
    assert fixed_up.fixed_scale == pytest.approx(3.0, rel=1e-6)
    assert fixed_up.work_scale == pytest.approx(1.5, rel=1e-6)
    for size, seconds in zip(timed.sizes, timed.seconds):
        assert _priced(fixed_up, facts, size) == pytest.approx(seconds, rel=1e-6)
    assert _priced(fixed_up, facts, 8) == pytest.approx(3 * fixed + 1.5 * per_sample * 8, rel=1e-6)
    # one size: one factor for both parts
    once = corrected(MACHINE, facts, Probe((16,), (2 * before[1],)))
    assert once.fixed_scale == once.work_scale == pytest.approx(2.0, rel=1e-6)
    # a probe far beyond any plausible error is clamped, not believed
    wild = corrected(MACHINE, facts, Probe((2, 16), (1e3 * before[0], 1e3 * before[1])))
    assert wild.fixed_scale == wild.work_scale == 8.0


def test_the_probe_leaves_the_model_as_it_was() -> None:
    model = _convnet().train()
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    grads = [p.grad for p in model.parameters()]
    norm = model[1]
    stats = (norm.running_mean.clone(), norm.running_var.clone(), int(norm.num_batches_tracked))
    images = torch.randn(16, 3, 8, 8)
    rng, threads = torch.get_rng_state(), torch.get_num_threads()
    probe = probe_model(model, {"input": images}, (2, 16), 1)
    assert probe is not None and probe.sizes == (2, 16)
    assert all(t > 0 for t in probe.seconds)
    assert [p.grad for p in model.parameters()] == grads  # the same tensors, untouched
    assert all(torch.equal(g, torch.full_like(g, 0.5)) for g in grads)
    assert torch.equal(norm.running_mean, stats[0]) and torch.equal(norm.running_var, stats[1])
    assert int(norm.num_batches_tracked) == stats[2] and model.training
    assert torch.equal(torch.get_rng_state(), rng) and torch.get_num_threads() == threads


class _FixedBatch(nn.Module):
    """A view that hard-codes the example's 16 rows: it cannot run on fewer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).view(16, 4)


class _InPlace(nn.Module):
    """Writes its input in place, as some models do."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mul_(2))


class _Flagged(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, double: bool = False) -> torch.Tensor:
        return self.fc(x) * (2 if double else 1)


def test_inputs_that_are_not_tensors_pass_as_they_are() -> None:
    probe = probe_model(_Flagged(), {"x": torch.randn(16, 4), "double": True}, (2, 16), 1)  # type: ignore[dict-item]
    assert probe is not None and probe.sizes == (2, 16)


def test_the_probe_leaves_the_example_as_it_was() -> None:
    x = torch.randn(16, 4)
    kept = x.clone()
    assert probe_model(_InPlace(), {"x": x}, (2, 16), 1) is not None
    assert torch.equal(x, kept)


class _Ids(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.argmax(-1)


def test_the_probe_gives_up_where_it_cannot_time_the_model() -> None:
    x = torch.randn(16, 4)
    assert probe_model(_FixedBatch(), {"x": x}, (2, 16), 1) is None
    assert probe_model(_Ids(), {"x": x}, (2, 16), 1) is None  # nothing to differentiate
    with torch.device("meta"):
        meta = nn.Linear(4, 4)
    assert probe_model(meta, {"input": x}, (2, 16), 1) is None
    assert probe_model(nn.Linear(4, 4), {}, (2, 16), 1) is None


def test_the_sizes_timed_fit_in_half_the_free_memory(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The smallest and the largest allowed size whose pass (saved activations and the
    parameters' gradients) takes under half the free memory; none where the smallest does
    not fit, so that a model meant to be split is never run whole."""
    facts, _ = traced_facts(_convnet(), {"input": torch.randn(16, 3, 8, 8)})
    allowed = [16, 8, 4, 2]
    need = {s: sum(facts.saved) * s // 16 + sum(facts.params) for s in allowed}
    assert probe_sizes(facts, allowed) == (2, 16)  # this machine: everything fits
    monkeypatch.setattr(model_probe, "free_memory", lambda: 2 * need[8] + 1)
    assert probe_sizes(facts, allowed) == (2, 8)
    monkeypatch.setattr(model_probe, "free_memory", lambda: 2 * need[2])
    assert probe_sizes(facts, allowed) == ()
    monkeypatch.setattr(model_probe, "free_memory", lambda: None)  # unknown: not limited
    assert probe_sizes(facts, allowed) == (2, 16)
