"""A buffer that several stages share (timm's EVA-02 hands every block one table of rotary
frequencies) is tied like a parameter, but has no gradient: a step sums nothing for it, and
the pipeline equals eager."""

from __future__ import annotations

import textwrap

from pipecompile.surfaces.cli import main

MODEL = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, table):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("table", table)

    def forward(self, x):
        return torch.tanh(self.lin(x)) * self.table


def build_model():
    torch.manual_seed(0)
    table = torch.randn(4)
    return nn.Sequential(*[Block(table) for _ in range(4)])


def example_inputs():
    return (torch.randn(8, 4),)


def example_targets():
    return (torch.randn(8, 4),)


def loss_fn(out, y):
    return ((out - y) ** 2).mean()
"""


def test_a_buffer_shared_by_stages_checks_equal_to_eager(tmp_path, capfd) -> None:
    (tmp_path / "shared.py").write_text(textwrap.dedent(MODEL))
    out = str(tmp_path / "out")
    args = [str(tmp_path / "shared.py"), "--stages", "2", "--microbatches", "2", "-q", "-o", out]
    assert main(args) == 0
    assert main(["run", out, "--check"]) == 0
    assert "check passed" in capfd.readouterr().out
    assert main(["run", out, "--steps", "2", "-q"]) == 0
