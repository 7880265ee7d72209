"""`run --nproc N --check` on GPU ranks: their values are held to the noise-floor rule against
the local backend's (CPU kernels round otherwise), on CPU ranks to equality."""

import argparse

import pytest
import torch

from pipecompile.ir.graph.noise_floor import NOISE_RULE, Tolerance
from pipecompile.model.model_file import load_model_file
from pipecompile.runtime.check.distributed import _floors
from pipecompile.runtime.pipeline import Pipeline
from tests.conftest import EXAMPLES


def test_gpu_ranks_get_float64_floors_and_cpu_ranks_none(compiled_examples):
    spec = load_model_file(str(EXAMPLES / "gpt.py"))
    local = Pipeline.load(compiled_examples[("gpt", 2)])
    plain = argparse.Namespace(tolerance=NOISE_RULE)
    assert _floors([{"gpu": False}, {"gpu": False}], local, spec, plain, False) is None
    assert _floors([{"gpu": True}], local, spec, argparse.Namespace(tolerance=Tolerance(1e-4)),
                   False) is None  # fmt: skip
    assert _floors([{"gpu": True}], local, spec, plain, True) is None  # PipeDream: weights
    floors = _floors([{"gpu": True}, {"gpu": True}], local, spec, plain, False)
    assert floors is not None and floors.grads == {}  # no device given: the CPU's floors only
    loss, outputs, grads = floors.exact
    assert loss.dtype == torch.float64 and outputs[0].dtype == torch.float64
    assert set(grads) == {n for n, _ in spec.model.named_parameters(remove_duplicate=False)}


def test_the_ranks_device_measures_floors_of_its_own(compiled_examples):
    """The floors of eager on the ranks' device (here the CPU, as a GPU's would be measured):
    its fp32 values against the float64 reference, every gradient and output with one."""
    spec = load_model_file(str(EXAMPLES / "gpt.py"))
    local = Pipeline.load(compiled_examples[("gpt", 2)])
    plain = argparse.Namespace(tolerance=NOISE_RULE)
    floors = _floors([{"gpu": True}], local, spec, plain, False, torch.device("cpu"))
    assert floors is not None
    loss, outputs, grads = floors.exact
    assert set(floors.grads) == set(grads)
    assert len(floors.outputs) == len(outputs)
    assert 0 < floors.loss < 1e-4 and 0 < max(floors.grads.values()) < 1e-4
    cpu = spec.model  # the same eager values, on the same kernels: the CPU's own floor
    name = next(iter(grads))
    assert floors.grads[name] == pytest.approx(
        float((_fp32_grads(cpu, spec)[name].double() - grads[name]).abs().max()), rel=1e-6
    )


def _fp32_grads(model, spec):
    model.zero_grad(set_to_none=True)
    spec.loss_fn(model(**spec.inputs), *spec.targets).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters(remove_duplicate=False)}
