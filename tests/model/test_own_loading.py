"""--weights for a model with state-dict loading of its own: the pretrained weights go through
the model's ``_load_from_state_dict`` and registered loading hooks, with the model's version
metadata, exactly as ``model.load_state_dict`` would load them; the user's model is left as it
was."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import pipecompile
from pipecompile.errors import WeightsError
from pipecompile.model.own_loading import own_loading


class Scaled(nn.Module):
    """Refuses a state dict without its version (as torchvision's MNASNet), and reads the
    parameter's old name ``gain`` as ``scale``."""

    _version = 2

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args):  # noqa: ANN001
        if local_metadata.get("version") != 2:
            raise ValueError("version should be set to 2")
        if prefix + "gain" in state_dict:
            state_dict[prefix + "scale"] = state_dict.pop(prefix + "gain")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)


def _transposed(module, state_dict, prefix, *args) -> None:  # noqa: ANN001
    """A pre-hook that reads a weight saved as (in, out) (and the model's own as it is)."""
    key = prefix + "weight"
    if key in state_dict and state_dict[key].shape == module.weight.shape[::-1]:
        state_dict[key] = state_dict[key].t()


def build() -> nn.Sequential:
    model = nn.Sequential(Scaled(), nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))
    model[1]._register_load_state_dict_pre_hook(_transposed, with_module=True)
    return model


def _file(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """Weights as saved by an older model: the old name and the transposed layout."""
    g = torch.Generator().manual_seed(3)
    saved = {
        "0.gain": torch.rand(8, generator=g) + 0.5,
        "1.weight": torch.randn(8, 6, generator=g),
        "1.bias": torch.randn(6, generator=g),
        "3.weight": torch.randn(3, 6, generator=g),
        "3.bias": torch.randn(3, generator=g),
    }
    path = tmp_path / "old.safetensors"
    save_file(saved, str(path))
    return path, saved


def _reference(saved: dict[str, torch.Tensor]) -> nn.Module:
    """The model loaded by torch's own load_state_dict, versions given by hand."""
    model = build()
    state = OrderedDict((k, v.clone()) for k, v in saved.items())
    state._metadata = model.state_dict()._metadata  # type: ignore[attr-defined]
    model.load_state_dict(state)
    return model


def test_own_loading_finds_overrides_and_registered_hooks():
    assert own_loading(build()) == ["0", "1"]
    assert own_loading(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) == []


def test_pretrained_weights_go_through_the_models_own_loading(tmp_path):
    path, saved = _file(tmp_path)
    model = build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(4, 8)
    with pytest.warns(UserWarning, match="load state dicts with code of their own"):
        pipe = pipecompile.compile(model, (x,), stages=2, weights=path)
    reference = _reference(saved)
    torch.testing.assert_close(pipe(x), reference(x), rtol=0, atol=0)
    got = pipe.state_dict()
    for name, tensor in reference.state_dict().items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=0)
    for name, tensor in model.state_dict().items():  # the user's model is untouched
        assert torch.equal(tensor, before[name]), name


def test_a_meta_model_with_own_loading_takes_the_loaded_values(tmp_path):
    path, saved = _file(tmp_path)
    with torch.device("meta"):
        model = build()
    x = torch.randn(4, 8)
    with pytest.warns(UserWarning, match="load state dicts with code of their own"):
        pipe = pipecompile.compile(model, (x,), stages=2, weights=path)
    torch.testing.assert_close(pipe(x), _reference(saved)(x), rtol=0, atol=0)


def test_a_misfit_or_a_failing_hook_is_named(tmp_path):
    path, saved = _file(tmp_path)
    x = torch.randn(4, 8)
    wrong = tmp_path / "wrong.safetensors"
    save_file({**saved, "3.weight": torch.zeros(4, 6)}, str(wrong))
    with pytest.raises(WeightsError, match=r"wrong.safetensors does not fit .*3\.weight"):
        pipecompile.compile(build(), (x,), stages=2, weights=wrong)

    def refuse(*args: object) -> None:
        raise KeyError("no such layout")

    model = build()
    model[3]._register_load_state_dict_pre_hook(refuse)
    with pytest.raises(WeightsError, match="own state-dict loading failed .*no such layout"):
        pipecompile.compile(model, (x,), stages=2, weights=path)


def test_a_tensor_the_loading_leaves_empty_is_missing(tmp_path):
    path, saved = _file(tmp_path)
    partial = tmp_path / "partial.safetensors"
    save_file({k: v for k, v in saved.items() if k != "3.bias"}, str(partial))
    x = torch.randn(4, 8)
    with pytest.raises(WeightsError, match="lacks 1 of the model's 5 tensors: 3.bias"):
        pipecompile.compile(build(), (x,), stages=2, weights=partial)
    with pytest.warns(UserWarning, match="initialised instead: 3.bias"):
        pipe = pipecompile.compile(build(), (x,), stages=2, weights=partial, allow_missing=True)
    assert pipe.manifest.weights.missing == ("3.bias",)


def test_torch_nn_norms_keep_the_lazy_reading():
    """Batch and instance norms' loading code only upgrades an older torch's state dict."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.InstanceNorm2d(4))
    assert own_loading(model) == []
    model[1].register_load_state_dict_post_hook(lambda module, keys: None)
    assert own_loading(model) == ["1"]
