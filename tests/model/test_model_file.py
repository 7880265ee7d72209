"""The model-file contract: what is found, what is expected, and a clear error otherwise."""

from __future__ import annotations

import pytest
import torch

from pipecompile.errors import ModelFileError
from pipecompile.model.model_file import load_model_file
from tests.conftest import write_model_file

GOOD = """
import torch
def build_model():
    return torch.nn.Linear(4, 2)
def other():
    return torch.nn.Linear(4, 3)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 5)
    def forward(self, x, y=None):
        return self.fc(x)
instance = Net()
def example_inputs():
    return (torch.randn(8, 4),)
"""


def test_default_factory_and_named_selection(tmp_path):
    path = write_model_file(tmp_path, GOOD)
    assert load_model_file(str(path)).model.out_features == 2
    assert load_model_file(f"{path}:other").model.out_features == 3
    assert isinstance(load_model_file(f"{path}:Net").model.fc, torch.nn.Linear)
    spec = load_model_file(f"{path}:instance")
    assert list(spec.inputs) == ["x"]


def test_file_without_a_model(tmp_path):
    path = write_model_file(tmp_path, "import torch\nclass Net(torch.nn.Module):\n    pass\n")
    with pytest.raises(ModelFileError, match=r"has no 'build_model'.*candidates found: Net"):
        load_model_file(str(path))


def test_missing_file_and_import_error(tmp_path):
    with pytest.raises(ModelFileError, match="does not exist"):
        load_model_file(str(tmp_path / "nope.py"))
    path = write_model_file(tmp_path, "import torch\nraise ValueError('boom')\n", "broken.py")
    with pytest.raises(
        ModelFileError, match=r"importing .*broken.py' failed at broken.py:2: ValueError: boom"
    ):
        load_model_file(str(path))


def test_factory_returning_something_else(tmp_path):
    path = write_model_file(tmp_path, "def build_model():\n    return 3\n")
    with pytest.raises(ModelFileError, match="returned a int, expected a torch.nn.Module"):
        load_model_file(str(path))


def test_missing_or_wrong_example_inputs(tmp_path):
    base = "import torch\ndef build_model():\n    return torch.nn.Linear(4, 2)\n"
    with pytest.raises(ModelFileError, match="has no example_inputs"):
        load_model_file(str(write_model_file(tmp_path, base, "a.py")))
    bad = (
        base
        + "def example_inputs():\n    return {'input': torch.randn(2, 4), 'use_cache': False}\n"
    )
    with pytest.raises(ModelFileError, match="has keys \\['use_cache'\\]"):
        load_model_file(str(write_model_file(tmp_path, bad, "b.py")))
    flag = base + "def example_inputs():\n    return (torch.randn(2, 4), True)\n"
    with pytest.raises(ModelFileError, match="gives 2 values but forward\\(\\) takes 1"):
        load_model_file(str(write_model_file(tmp_path, flag, "c.py")))
