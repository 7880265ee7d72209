"""Topological orders for branching graphs: valid, chosen by the split they allow, exact."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from pipecompile.balance.branch_order import candidate_orders, may_reorder, reordered
from pipecompile.frontend.tracer import trace
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES, example_spec

TOWERS = str(EXAMPLES / "two_towers.py")


@pytest.mark.parametrize("name", ["mlp", "resnet", "gpt", "two_towers"])
def test_every_candidate_is_a_topological_order_computing_the_same(name):
    spec = example_spec(name)
    traced = trace(spec.model, spec.inputs)
    expected = traced.module(*spec.inputs.values())
    for _, order in candidate_orders(traced.module.graph):
        seen: set = set()
        for node in order:
            assert all(a in seen or a.op in ("placeholder", "get_attr")
                       for a in node.all_input_nodes)  # fmt: skip
            seen.add(node)
        module = reordered(traced.module, order)
        assert [n.name for n in module.graph.nodes if n.op.startswith("call")] == [
            n.name for n in order
        ]
        torch.testing.assert_close(module(*spec.inputs.values()), expected, rtol=0, atol=0)


def test_interleaved_towers_get_a_depth_first_order():
    spec = example_spec("two_towers")
    graph = trace(spec.model, spec.inputs).module.graph
    names = dict(candidate_orders(graph))
    assert set(names) >= {"graph", "depth-first"}
    first = [n.target for n in names["depth-first"] if n.op == "call_module"]
    assert first[:5] == [f"user.{k}" for k in range(5)]  # the user tower runs to its end


def test_the_balancer_keeps_the_faster_order_and_the_pipeline_stays_exact(tmp_path, capsys):
    out = str(tmp_path / "o")
    assert main([TOWERS, "--stages", "4", "--microbatches", "4", "--chain", "-q", "-o", out]) == 0
    balance = json.loads((tmp_path / "o" / "manifest.json").read_text())["balance"]
    assert balance["order"] != "graph"
    assert balance["bottleneck"] == min(balance["orders"].values()) < balance["orders"]["graph"]
    assert main(["run", out, "--check"]) == 0
    assert "check passed" in capsys.readouterr().out


def test_manual_boundaries_keep_the_traced_order(tmp_path):
    out = tmp_path / "o"
    args = [TOWERS, "--stages", "4", "--split-at", "item.2", "-q", "-o", str(out)]
    assert main(args) == 0
    balance = json.loads((out / "manifest.json").read_text())["balance"]
    assert balance["order"] == "graph" and list(balance["orders"]) == ["graph"]


def test_mutating_graphs_keep_their_order():
    class InPlace(nn.Module):
        def forward(self, x, y):
            a = x * 2
            b = y * 3
            a.add_(b)
            return a + b

    traced = trace(InPlace(), {"x": torch.randn(2), "y": torch.randn(2)})
    ops = [n for n in traced.module.graph.nodes if n.op.startswith("call")]
    assert not may_reorder(ops)
    assert [name for name, _ in candidate_orders(traced.module.graph)] == ["graph"]
