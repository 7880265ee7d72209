"""The Python API and the decorator: compile, run, train, save, load, and a plain loop."""

from __future__ import annotations

import copy
import importlib.util
import sys

import pytest
import torch
from torch import nn

import pipecompile
from pipecompile.errors import PipecompileError
from tests.conftest import EXAMPLES, example_spec


def _example_module(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


# BatchNorm normalises each micro-batch by its own statistics, so resnet runs whole batches
@pytest.mark.parametrize("name, microbatches", [("mlp", 2), ("gpt", 2), ("resnet", 1)])
def test_compile_runs_and_trains_like_eager(name, microbatches):
    spec = example_spec(name)
    eager = copy.deepcopy(spec.model)
    pipe = pipecompile.compile(spec.model, spec.inputs, stages=3, microbatches=microbatches)
    assert len(pipe.stages) == 3 and pipe.program.num_stages == 3
    with torch.no_grad():
        eager.eval()
        for stage in pipe.stages:
            stage.eval()
        torch.testing.assert_close(pipe(**spec.inputs), eager(**spec.inputs), atol=1e-5, rtol=0)
    eager.train()
    for stage in pipe.stages:
        stage.train()
    loss = pipe.train_step(spec.inputs, spec.targets, spec.loss_fn,
                           lambda ps: torch.optim.SGD(ps, lr=0.1))  # fmt: skip
    optimizer = torch.optim.SGD(eager.parameters(), lr=0.1)
    expected = spec.loss_fn(eager(**spec.inputs), *spec.targets)
    expected.backward()
    optimizer.step()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5)
    assert _max_diff(pipe.state_dict(), eager.state_dict()) < 1e-5


def test_save_and_load_keep_the_weights(tmp_path):
    spec = example_spec("gpt")
    pipe = pipecompile.compile(spec.model, spec.inputs, stages=2, microbatches=2)
    pipe.train_step(spec.inputs, spec.targets, spec.loss_fn,
                    lambda ps: torch.optim.AdamW(ps, lr=1e-2))  # fmt: skip
    saved = pipe.save(tmp_path / "saved")
    again = pipecompile.load(saved)
    assert _max_diff(again.state_dict(), pipe.state_dict()) == 0
    assert again.state_dict().keys() == spec.model.state_dict().keys()
    with torch.no_grad():
        torch.testing.assert_close(again(**spec.inputs), pipe(**spec.inputs), atol=0, rtol=0)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(PipecompileError, match="is not a pipecompile output"):
        pipe.save(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_an_optimizer_that_is_not_a_factory_is_named():
    spec = example_spec("mlp")
    pipe = pipecompile.compile(spec.model, spec.inputs, stages=2)
    instance = torch.optim.SGD(spec.model.parameters(), lr=0.1)
    for wrong in ("adam", instance):
        with pytest.raises(PipecompileError, match="optimizer must be a factory"):
            pipe.train_step(spec.inputs, spec.targets, spec.loss_fn, wrong)


def test_inputs_that_do_not_fit_forward_are_named():
    model = _example_module("mlp").MLP()
    with pytest.raises(PipecompileError, match="do not fit MLP.forward"):
        pipecompile.compile(model, (torch.randn(8, 32), torch.randn(8, 32)), stages=2)
    with pytest.raises(PipecompileError, match="'x' is a str"):
        pipecompile.compile(model, {"x": "text"}, stages=2)


def _loop(model: nn.Module, batches, loss_fn, steps: int) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        inputs, targets = batches[step % len(batches)]
        optimizer.zero_grad()
        loss = loss_fn(model(*inputs), *targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name, cls, factory, microbatches", [
    ("mlp", "MLP", lambda m: m.MLP(), 2),
    ("resnet", "ResNet", lambda m: m.ResNet(), 1),
    ("gpt", "GPT", lambda m: m.GPT(m.GPTConfig()), 2),
])  # fmt: skip
def test_decorated_module_trains_like_the_module_in_a_plain_loop(name, cls, factory, microbatches):
    module = _example_module(name)
    spec = example_spec(name)
    decorated = pipecompile.pipeline(stages=3, microbatches=microbatches)(getattr(module, cls))
    torch.manual_seed(0)
    eager = factory(module)
    setattr(module, cls, decorated)
    try:
        piped = factory(module)
    finally:
        setattr(module, cls, getattr(module, cls).__mro__[1])
    piped.load_state_dict(eager.state_dict())
    assert isinstance(piped, nn.Module) and piped.pipeline is None
    batches = [(tuple(spec.inputs.values()), spec.targets)]
    ours = _loop(piped, batches, spec.loss_fn, 3)
    theirs = _loop(eager, batches, spec.loss_fn, 3)
    assert piped.pipeline is not None and len(piped.pipeline.stages) == 3
    assert ours == pytest.approx(theirs, abs=1e-5)
    assert _max_diff(piped.state_dict(), eager.state_dict()) < 1e-5  # BatchNorm stats too


def test_decorated_gradients_equal_eager_and_eval_mode_works():
    module = _example_module("mlp")
    Piped = pipecompile.pipeline(stages=2, microbatches=4)(module.MLP)  # noqa: N806
    torch.manual_seed(0)
    piped, eager = Piped(), module.MLP()
    eager.load_state_dict(piped.state_dict())
    x, y = torch.randn(8, 32), torch.randn(8, 10)
    for model in (piped, eager):
        nn.functional.mse_loss(model(x), y).backward()
    grads = {n: p.grad for n, p in piped.named_parameters()}
    assert _max_diff(grads, {n: p.grad for n, p in eager.named_parameters()}) < 1e-6
    piped.eval()
    with torch.no_grad():
        torch.testing.assert_close(piped(x), eager.eval()(x), atol=1e-6, rtol=0)
    assert type(piped).__name__ == "MLP" and isinstance(piped, module.MLP)


def test_decorator_errors():
    with pytest.raises(TypeError, match="decorates an nn.Module class"):
        pipecompile.pipeline(stages=2)(object)
    module = _example_module("mlp")
    Piped = pipecompile.pipeline(stages=2, microbatches=2, schedule="pipedream")(module.MLP)  # noqa: N806
    model = Piped()
    with pytest.raises(PipecompileError, match="pipedream schedule updates weights"):
        model(torch.randn(8, 32))


def test_the_pipeline_draws_its_pictures_and_exports_onnx(tmp_path):
    spec = example_spec("mlp")
    pipe = pipecompile.compile(spec.model, spec.inputs, stages=2, microbatches=2)
    written = pipe.pictures(tmp_path / "pictures")
    assert {p.stem for p in written} == {"stages", "schedule"}
    assert all(p.is_file() and p.stat().st_size > 0 for p in written)
    pytest.importorskip("onnxruntime")
    from pipecompile.interop.onnx_chain import run_onnx_chain

    files = pipe.onnx()
    assert [p.name for p in files] == ["stage_0.onnx", "stage_1.onnx"]
    micro = {k: v[: v.shape[0] // 2] for k, v in spec.inputs.items()}
    outputs = run_onnx_chain(pipe.directory, micro)
    with torch.no_grad():
        expected = spec.model.eval()(**micro)
    assert abs(torch.as_tensor(outputs[0]) - expected).max().item() < 1e-5


def test_fit_refuses_to_save_into_the_pipelines_own_temporary_directory(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    x, y = torch.randn(4, 4), torch.randn(4, 2)
    pipe = pipecompile.compile(model, (x,), stages=2)
    loss = nn.functional.mse_loss
    for option in ("save", "metrics"):
        with pytest.raises(PipecompileError, match=f"fit\\({option}=.*temporary directory"):
            pipe.fit([((x,), y)], loss, "sgd", steps=1, **{option: pipe.directory / "ck"})
    assert not (pipe.directory / "ck").exists()
    pipe.fit([((x,), y)], loss, "sgd", steps=1, save=tmp_path / "ck")
    assert (tmp_path / "ck" / "latest").read_text() == "step_1\n"
    with pytest.raises(PipecompileError, match="another run's train state.*pass force=True"):
        pipe.fit([((x,), y)], loss, "sgd", steps=1, save=tmp_path / "ck")
    pipe.fit([((x,), y)], loss, "sgd", steps=1, save=tmp_path / "ck", force=True)


def test_a_stage_backend_name_is_checked_when_given(tmp_path):
    """compile_stages= (and a run's compile) names a torch.compile backend: a misspelt one is
    refused at once, naming the choices, not at fit()'s first step."""
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(PipecompileError, match="compile_stages 'inductr' is not a torch.compile "
                       "backend .*choose one of inductor, aot_eager, eager, or off"):  # fmt: skip
        pipecompile.compile(model, torch.randn(8, 4), stages=2, compile_stages="inductr")
    pipe = pipecompile.compile(model, torch.randn(8, 4), stages=2, directory=tmp_path / "out")
    with pytest.raises(PipecompileError, match="argument --compile: invalid choice: 'eagr'"):
        pipe.fit([(torch.randn(8, 4), torch.randn(8, 2))], loss_fn=nn.functional.mse_loss,
                 compile="eagr", progress=False)  # fmt: skip


def test_a_second_fit_goes_on_with_the_first_ones_optimizer(tmp_path):
    """fit() on 3 batches, then on 3 more, equals one fit() on the 6 (AdamW's moments carry
    over); fresh_optimizer=True starts a new AdamW, as a separate run would."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)) for _ in range(6)]
    loss = nn.functional.mse_loss

    def pipeline(name):
        return pipecompile.compile(copy.deepcopy(model), torch.randn(8, 4), stages=2,
                                   microbatches=2, directory=tmp_path / name)  # fmt: skip

    once, twice, fresh = pipeline("once"), pipeline("twice"), pipeline("fresh")
    once.fit(batches, loss, lr=0.01)
    twice.fit(batches[:3], loss, lr=0.01)
    twice.fit(batches[3:], loss, lr=0.01)
    fresh.fit(batches[:3], loss, lr=0.01)
    fresh.fit(batches[3:], loss, lr=0.01, fresh_optimizer=True)
    for name, value in once.state_dict().items():
        assert torch.allclose(twice.state_dict()[name], value, atol=1e-6), name
    assert any(
        not torch.allclose(fresh.state_dict()[n], v, atol=1e-4)
        for n, v in once.state_dict().items()
    )
