"""Front end: torch.fx first, torch.export for models fx cannot trace, one error when both fail."""

from __future__ import annotations

import pytest
import torch

from pipecompile.errors import TraceError
from pipecompile.frontend.tracer import trace
from tests.conftest import example_spec


@pytest.mark.parametrize(
    "name, tracer",
    [("mlp", "torch.fx"), ("resnet", "torch.fx"), ("gpt", "torch.fx"),
     ("hf_gpt2", "torch.export"), ("hf_bert", "torch.export"), ("hf_llama", "torch.export")],
)  # fmt: skip
def test_tracer_choice_and_fidelity(name, tracer):
    spec = example_spec(name)
    traced = trace(spec.model, spec.inputs)
    assert traced.tracer == tracer
    assert traced.input_names == tuple(spec.inputs)
    with torch.no_grad():
        flat = traced.module(*spec.inputs.values())
        want = torch.utils._pytree.tree_leaves(spec.model(**spec.inputs))
    assert len(flat) == len(want)
    for got, ref in zip(flat, want):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


class DataDependent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        if h.sum().item() > 0:  # control flow on a tensor's value
            return h * 2
        return h.nonzero()


def test_untraceable_model_reports_both_tracers():
    with pytest.raises(TraceError) as info:
        trace(DataDependent(), {"x": torch.randn(2, 4)})
    message = str(info.value)
    assert "cannot trace DataDependent" in message
    assert "torch.fx:" in message and "torch.export:" in message
    assert "test_tracer.py" in message  # points at the user's line
    assert "Make forward() traceable" in message


class GradRegion(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            scale = self.fc.weight.abs().mean()
        return self.fc(x) * scale


def test_no_grad_regions_are_inlined_and_detached():
    traced = trace(GradRegion(), {"x": torch.randn(2, 4)})
    targets = {str(n.target) for n in traced.module.graph.nodes}
    assert not any("wrap_with_set_grad_enabled" in t for t in targets)


class MutatesBuffers(torch.nn.Module):
    """A call counter and a running mean updated in forward (tools/qa/fuzz.py, seed 27)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("mean", torch.zeros(4))

    def forward(self, x):
        self.calls.add_(1)
        with torch.no_grad():
            self.mean.mul_(0.9).add_(0.1 * x.mean(0))
        return self.fc(x)


def test_buffer_mutations_are_traced_not_run():
    model, x = MutatesBuffers(), torch.randn(2, 4)
    traced = trace(model, {"x": x})
    assert traced.tracer == "torch.fx"
    assert int(model.calls) == 0 and not model.mean.any()  # tracing left the model alone
    methods = [str(n.target) for n in traced.module.graph.nodes if n.op == "call_method"]
    assert methods.count("add_") == 2 and "mul_" in methods
    traced.module(x)
    eager = MutatesBuffers()
    eager(x)
    assert int(traced.module.calls) == 1
    torch.testing.assert_close(traced.module.mean, eager.mean)


class NoGradScale(torch.nn.Module):
    """A scale computed under no_grad from an activation (tools/qa/fuzz.py, seed 5032)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        with torch.no_grad():
            scale = h.abs().mean(-1, keepdim=True) + 1.0
        return h / scale


@pytest.mark.parametrize("ambient", [torch.enable_grad, torch.no_grad])
def test_fx_no_grad_region_passes_no_gradient(ambient):
    model, x = NoGradScale(), torch.randn(3, 4)
    with ambient():  # e.g. a decorated model first called under no_grad
        traced = trace(model, {"x": x})
    assert traced.tracer == "torch.fx"
    traced.module(x)[0].sum().backward()
    got = model.fc.weight.grad.clone()  # the traced module shares the model's parameters
    model.zero_grad()
    model(x).sum().backward()
    torch.testing.assert_close(got, model.fc.weight.grad)
