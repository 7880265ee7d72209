"""`run --nproc N --check` on GPU ranks: their values are held to the noise-floor rule against
the local backend's (CPU kernels round otherwise), on CPU ranks to equality."""

import argparse

import torch

from pipecompile.model.model_file import load_model_file
from pipecompile.runtime.check.distributed import _floors
from pipecompile.runtime.pipeline import Pipeline
from tests.conftest import EXAMPLES


def test_gpu_ranks_get_float64_floors_and_cpu_ranks_none(compiled_examples):
    spec = load_model_file(str(EXAMPLES / "gpt.py"))
    local = Pipeline.load(compiled_examples[("gpt", 2)])
    plain = argparse.Namespace(atol=None, rtol=None)
    assert _floors([{"gpu": False}, {"gpu": False}], local, spec, plain, False) is None
    assert _floors([{"gpu": True}], local, spec, argparse.Namespace(atol=1e-4, rtol=None),
                   False) is None  # fmt: skip
    assert _floors([{"gpu": True}], local, spec, plain, True) is None  # PipeDream: weights
    twin = _floors([{"gpu": True}, {"gpu": True}], local, spec, plain, False)
    assert twin is not None
    loss, outputs, grads = twin
    assert loss.dtype == torch.float64 and outputs[0].dtype == torch.float64
    assert set(grads) == {n for n, _ in spec.model.named_parameters(remove_duplicate=False)}
