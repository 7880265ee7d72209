"""Cost annotation counts contraction FLOPs exactly; balancing cuts only at legal points."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.fx as fx
from torch.utils.flop_counter import FlopCounterMode

from pipecompile.balance.flops import is_contraction
from pipecompile.balance.partition_problem import atom_cost
from pipecompile.errors import BalanceError
from pipecompile.frontend.tracer import trace
from pipecompile.ir.graph.node_info import CONVOLUTION, ELEMENTWISE, MATMUL, info
from pipecompile.ir.programs.cost_model import CostModel
from pipecompile.passes import annotate_costs, balance_stages
from pipecompile.passes.balance_stages import compute_nodes
from tests.conftest import example_spec


@pytest.mark.parametrize("name", ["mlp", "resnet", "gpt", "hf_gpt2", "hf_llama"])
def test_contraction_flops_equal_torch_flop_counter(name):
    spec = example_spec(name)
    traced = trace(spec.model, spec.inputs)
    annotated = annotate_costs(traced.module, root=traced.root)
    ours = sum(info(n).flops for n in annotated.graph.nodes if is_contraction(n, annotated))
    with FlopCounterMode(display=False) as counter:
        spec.model(**spec.inputs)
    assert ours == counter.get_total_flops() > 0


def test_convolutions_are_priced_at_their_own_calibrated_efficiency():
    """A ResNet's convolutions are their own kind (the linear head a matmul); an atom of
    convolutions costs (FLOPs + conv_half_work) / conv_rate each, of matmuls the contractions'
    figures, and without a convolution calibration the contractions' figures price both."""
    spec = example_spec("resnet")
    traced = trace(spec.model, spec.inputs)
    annotated = annotate_costs(traced.module, root=traced.root)
    kinds = {info(n).kind for n in annotated.graph.nodes if is_contraction(n, annotated)}
    assert kinds == {MATMUL, CONVOLUTION}
    model = CostModel(flops_rate=1e10, half_work=1e6, conv_rate=5e9, conv_half_work=4e6)
    conv = atom_cost([(2e6, CONVOLUTION), (1e3, ELEMENTWISE)], "flops", model)
    matmul = atom_cost([(2e6, MATMUL), (1e3, ELEMENTWISE)], "flops", model)
    elementwise = 3 * 1e3 / 1e10
    assert conv == round((3 * (2e6 + 4e6) / 5e9 + elementwise) * 1e12)
    assert matmul == round((3 * (2e6 + 1e6) / 1e10 + elementwise) * 1e12)
    plain = replace(model, conv_rate=0.0)
    as_conv = atom_cost([(2e6, CONVOLUTION)], "flops", plain)
    assert as_conv == atom_cost([(2e6, MATMUL)], "flops", plain)


def test_annotation_records_bytes_and_leaves_input_untouched():
    spec = example_spec("mlp")
    traced = trace(spec.model, spec.inputs)
    annotated = annotate_costs(traced.module, root=traced.root)
    assert all("pipecompile" not in n.meta for n in traced.module.graph.nodes)
    linear = next(n for n in annotated.graph.nodes if n.op == "call_module")
    weight = spec.model.get_submodule(str(linear.target)).weight
    assert info(linear).param_bytes >= weight.numel() * 4
    assert info(linear).activation_bytes == linear.meta["val"].numel() * 4


def test_every_op_gets_a_stage_and_stages_are_contiguous():
    spec = example_spec("gpt")
    traced = trace(spec.model, spec.inputs)
    balanced, report = balance_stages(annotate_costs(traced.module, root=traced.root), stages=4)
    stages = [info(n).stage for n in compute_nodes(balanced.graph)]
    assert stages == sorted(stages) and set(stages) == {0, 1, 2, 3}
    assert report.starts == tuple(stages.index(j) for j in range(4))
    assert report.stage_ops == tuple(stages.count(j) for j in range(4))
    assert report.method == "min_max" and report.bottleneck == max(report.stage_costs)
    assert list(report.as_json()) == [
        "cost", "stage_costs", "bottleneck", "lower_bound", "unconstrained_optimum",
        "stage_ops", "requested_boundaries", "shape",
    ]  # fmt: skip


class TupleAcross(torch.nn.Module):
    def forward(self, x):
        parts = x.chunk(2, dim=-1)  # a tuple of tensors: no stage may start between here...
        a = parts[0] * 2
        return a + parts[1]  # ...and here


def test_values_that_are_tuples_never_cross_a_boundary():
    traced = trace(TupleAcross(), {"x": torch.randn(2, 4)})
    annotated = annotate_costs(traced.module, root=traced.root)
    with pytest.raises(BalanceError, match="has 5 ops but only 2 places where a stage may start"):
        balance_stages(annotated, stages=3)
    balanced, _ = balance_stages(annotated, stages=2)
    stage = {n.name: info(n).stage for n in compute_nodes(balanced.graph)}
    assert stage["chunk"] == stage["getitem"] == stage["getitem_1"] == 0 and stage["add"] == 1


def test_more_stages_than_cuttable_nodes():
    traced = trace(
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), {"input": torch.randn(2, 4)}
    )
    annotated = annotate_costs(traced.module, root=traced.root)
    with pytest.raises(BalanceError, match=r"into 3 stages: it has 2 ops.*use --stages 2 or fewer"):
        balance_stages(annotated, stages=3)


def test_balance_is_a_pure_function():
    traced = trace(
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), {"input": torch.randn(2, 4)}
    )
    annotated = annotate_costs(traced.module, root=traced.root)
    balance_stages(annotated, stages=2)
    assert all(info(n).stage is None for n in annotated.graph.nodes)
    assert isinstance(annotated, fx.GraphModule)
