"""``--compile``: stage forwards through torch.compile give eager's gradients for every kind of
schedule (the zero-bubble split included), keep dropout masks under recomputation, and a stage
that cannot compile runs eagerly with a note and its state as it was. The tests use the
``aot_eager`` backend (AOTAutograd's graphs, no C++ compiler): what Inductor adds is code
generation, measured by tools/bench/compiled.py."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from torch import nn

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.ir.graph.noise_floor import Tolerance
from pipecompile.ir.records.manifest import read_manifest
from pipecompile.runtime.check.step import check_step
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.state.step_options import StepOptions
from pipecompile.runtime.torch_compiled import CompiledStages, resolve_backend
from tests.conftest import example_spec
from tests.runtime.test_dropout_recompute import Dropped, _loss

SCHEDULES = {  # (example, options): the GPT (attention, a tied weight) once
    "gpipe": ("gpt", {"schedule": "gpipe"}),
    "1f1b-recompute": ("mlp", {"schedule": "1f1b", "recompute": "always"}),
    "zb1p": ("mlp", {"schedule": "zb1p"}),
    "interleaved": ("mlp", {"schedule": "interleaved", "virtual_stages": 2}),
}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("config", list(SCHEDULES))
def test_compiled_stages_equal_eager(tmp_path, config):
    name, options = SCHEDULES[config]
    spec = example_spec(name)
    compiled = compile_model(spec.model, spec.inputs, stages=2, microbatches=4, **options)  # type: ignore[arg-type]
    out = emit(compiled, tmp_path / name, model=ModelRef(spec.path, spec.name, name))
    pipe = Pipeline.load(out)
    pipe.compile_stages("aot_eager")
    torch._dynamo.utils.counters.clear()
    report = check_step(
        pipe, spec.model, spec.inputs, spec.targets, spec.loss_fn, tolerance=Tolerance(1e-5)
    )
    assert report.ok, str(report)
    assert pipe.compiled is not None and not pipe.compiled.failed
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= len(pipe.modules)


@pytest.mark.parametrize("schedule", ["gpipe", "zb1p"])
def test_compiled_recompute_replays_the_dropout_mask(tmp_path, schedule):
    torch.manual_seed(0)
    model = Dropped().train()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)

    def grads(name: str, backend: str | None, recompute: str) -> dict[str, torch.Tensor]:
        compiled = compile_model(
            copy.deepcopy(model),
            {"x": x},
            stages=2,
            microbatches=4,
            split_at=("b",),
            schedule=schedule,
            recompute=recompute,
        )
        pipe = Pipeline.load(emit(compiled, tmp_path / name, model=ModelRef(None, "m", "m")))
        pipe.compile_stages(backend)
        pipe.train_step({"x": x}, (y,), _loss, options=StepOptions(keep_grads=True, rng_base=1234))
        return {**pipe.named_grads(0), **pipe.named_grads(1)}

    want = grads("eager", None, "never")
    got = grads("compiled", "aot_eager", "always")
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-6, rtol=1e-5), name


class _Normed(nn.Module):
    """BatchNorm, then a graph break: a backend failing on the second graph fails after the
    first ran and updated the running statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.out = nn.BatchNorm1d(6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        h = self.norm(x)
        torch._dynamo.graph_break()
        return (self.out(h),)


def test_a_stage_that_cannot_compile_runs_eagerly_with_its_state_as_it_was():
    torch.manual_seed(0)
    module, twin = _Normed().train(), None
    twin = copy.deepcopy(module)
    graphs = []

    def second_fails(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        if len(graphs) == 2:
            raise RuntimeError("no code for this graph")
        return gm.forward

    notes: list[str] = []
    stages = CompiledStages([module], "eager", notes.append, announce=False)
    stages._wrapped[0] = torch.compile(module, backend=second_fails)
    x = torch.randn(5, 6)
    with torch.random.fork_rng():
        assert stages.call(0, module, [x], None) is None  # the caller runs it eagerly
    assert len(graphs) == 2, "the first graph ran before the second failed"
    assert not stages.active(0)
    assert notes == [
        "stage 0: torch.compile (eager) could not compile its forward (RuntimeError: no code "
        "for this graph); it runs eagerly"
    ]
    out = module(x)[0]  # as the executor does after a None
    want = twin(x)[0]
    assert torch.equal(module.norm.running_mean, twin.norm.running_mean)  # updated once
    assert torch.equal(module.norm.num_batches_tracked, twin.norm.num_batches_tracked)
    assert torch.allclose(out, want)


def test_the_compile_records_the_backend_and_run_may_turn_it_off(tmp_path):
    spec = example_spec("mlp")
    compiled = compile_model(spec.model, spec.inputs, stages=2, microbatches=2)
    out = emit(
        compiled, tmp_path / "m", model=ModelRef(spec.path, spec.name, "m"), compile_stages="eager"
    )
    assert read_manifest(out).compile == "eager"
    assert resolve_backend(None, "eager") == "eager"
    assert resolve_backend("off", "eager") is None
    assert resolve_backend("aot_eager", None) == "aot_eager"
    pipe = Pipeline.load(out)
    pipe.compile_stages(None)
    assert pipe.compiled is not None and pipe.compiled.backend == "eager"
    pipe.compile_stages("off")
    assert pipe.compiled is None
