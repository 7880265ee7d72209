"""build_loaded: a module filled whole by its state is built without its initialisers and holds
the state's own tensors; where that would leave a meta tensor or break a tie it is built and
loaded as usual, with the same values."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipecompile.model.without_init import build_loaded


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.norm = nn.BatchNorm1d(3)


class WithMask(Plain):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mask", torch.ones(3), persistent=False)


class WithAttribute(Plain):
    def __init__(self) -> None:
        super().__init__()
        self.scale = [torch.full((3,), 2.0)]  # a tensor no state dict holds


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3, bias=False)
        self.b = nn.Linear(3, 3, bias=False)
        self.b.weight = self.a.weight


def _state(cls: type[nn.Module]) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {k: torch.randn_like(v) if v.is_floating_point() else v.clone()
            for k, v in cls().state_dict().items()}  # fmt: skip


def _no_meta(module: nn.Module) -> bool:
    return not any(t.is_meta for t in [*module.parameters(), *module.buffers()])


def test_a_module_its_state_fills_is_built_without_initialisers(monkeypatch):
    state = _state(Plain)
    drawn = []
    real = nn.init.kaiming_uniform_

    def spy(*args, **kwargs):
        drawn.append(args[0] if args else kwargs["tensor"])
        return real(*args, **kwargs)

    monkeypatch.setattr(nn.init, "kaiming_uniform_", spy)
    module = build_loaded(Plain, state)
    assert drawn and all(t.is_meta for t in drawn)  # an initialiser ran on meta tensors only
    for name, value in module.state_dict().items():
        assert torch.equal(value, state[name]) and value.data_ptr() != state[name].data_ptr()
    assert isinstance(module.fc.weight, nn.Parameter) and module.fc.weight.requires_grad
    assert not module.norm.running_mean.requires_grad


def test_tensors_are_copied_into_memory_of_torchs_own():
    """A safetensors file's tensors sit at 8-byte offsets; oneDNN's kernels round otherwise on
    such memory (timm's ghostnet then differed from eager by 1e4 noise floors on one thread)."""
    state = _state(Plain)
    state = {
        k: torch.cat([v.new_zeros(1), v.flatten()])[1:].view(v.shape) for k, v in state.items()
    }
    assert any(v.data_ptr() % 64 for v in state.values())
    module = build_loaded(Plain, state)
    assert all(v.data_ptr() % 64 == 0 for v in module.state_dict().values())


@pytest.mark.parametrize("cls", [WithMask, WithAttribute])
def test_tensors_no_state_holds_are_built_as_usual(cls):
    state = _state(cls)
    module = build_loaded(cls, state)
    assert _no_meta(module)
    assert all(not t.is_meta for t in getattr(module, "scale", []))
    for name, value in module.state_dict().items():
        assert torch.equal(value, state[name]), name
    if cls is WithMask:
        assert torch.equal(module.mask, torch.ones(3))


@pytest.mark.parametrize("names", ["both", "one"])  # safetensors writes a tied tensor once
def test_a_tie_stays_a_tie(names):
    state = _state(Tied)
    state["b.weight"] = state["a.weight"]
    if names == "one":
        del state["b.weight"]
    module = build_loaded(Tied, state)
    assert module.a.weight is module.b.weight
    assert torch.equal(module.a.weight, state["a.weight"])


def test_a_state_that_does_not_fit_is_refused():
    state = _state(Plain)
    del state["fc.bias"]
    with pytest.raises(RuntimeError, match="fc.bias"):
        build_loaded(Plain, state)
    with pytest.raises(RuntimeError, match="extra"):
        build_loaded(Plain, {**_state(Plain), "extra": torch.ones(1)})
