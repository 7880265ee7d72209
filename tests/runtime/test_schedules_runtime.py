"""The interpreter runs every schedule: gradients equal eager, and the in-flight micro-batches
and stored activation bytes it measures equal the simulator's and memory model's predictions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import Compiled, compile_model
from pipecompile.errors import MemoryBudgetError
from pipecompile.frontend.kept_traces import traces_kept
from pipecompile.ir.graph.noise_floor import Tolerance
from pipecompile.ir.programs.memory_model import peak_stored_bytes
from pipecompile.ir.programs.simulate import Costs, simulate
from pipecompile.ir.programs.topology import topology
from pipecompile.model.model_file import ModelSpec
from pipecompile.runtime.check.step import check_step
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.schedules import REGISTRY
from tests.conftest import EXAMPLE_NAMES, SAMPLED_OUT
from tests.conftest import example_spec as fresh_spec


def _options(name: str) -> dict[str, object]:
    """The compile options of one schedule of the registry (a looped one: 2 stages a device)."""
    looped = REGISTRY[name].placement == "looped"
    return {"schedule": name, **({"virtual_stages": 2} if looped else {})}


_SYNCHRONOUS = [n for n, s in REGISTRY.items() if s.synchronous]
# Every synchronous schedule of one stage a device, and three with recomputation
CONFIGS = {n: _options(n) for n in _SYNCHRONOUS if REGISTRY[n].placement == "one"}
CONFIGS |= {
    "gpipe-always": {"schedule": "gpipe", "recompute": "always"},
    "1f1b-except_last": {"schedule": "1f1b", "recompute": "except_last"},
    "zb1p-always": {"schedule": "zb1p", "recompute": "always"},
}
# Schedules with two stages per device (looped or in a V), on a model with a tied weight
# (gpt), a branching one (two_towers) and a Hugging Face one: the placement is what they add
PLACED = {n: _options(n) for n in _SYNCHRONOUS if REGISTRY[n].placement != "one"}
PLACED_ON = ["gpt", "two_towers", "hf_llama"]


_SPECS: dict[str, ModelSpec] = {}


def example_spec(name: str) -> ModelSpec:
    """The example, built once for this module: every schedule compiles the same model object
    and is checked against it, and its trace is kept (see ``_traced_once``)."""
    if name not in _SPECS:
        _SPECS[name] = fresh_spec(name)
    return _SPECS[name]


@pytest.fixture(scope="module", autouse=True)
def _traced_once() -> Iterator[None]:
    """The schedules differ after the trace, so each example is traced once per tracing
    option for the module (``traces_kept``), not once per schedule."""
    with traces_kept():
        yield
    _SPECS.clear()


def build(tmp: Path, name: str, **options: object) -> tuple[Compiled, Pipeline]:
    spec = example_spec(name)
    if name.startswith("hf_"):  # traced by torch.export, whose symbolic batch costs ~1.5 s a
        options.setdefault("dynamic", "none")  # compile: schedules hold at the traced shape
    compiled = compile_model(spec.model, spec.inputs, stages=4, microbatches=4, **options)  # type: ignore[arg-type]
    out = emit(compiled, tmp / name, model=ModelRef(spec.path, spec.name, name))
    return compiled, Pipeline.load(out)


def predicted_bytes(compiled: Compiled) -> tuple[int, ...]:
    saved = [m.saved for m in compiled.memory]
    inputs = [m.inputs for m in compiled.memory]
    return peak_stored_bytes(compiled.program, saved, inputs)


# Every config runs on gpt (a tied weight, cheap to compile); mlp runs gpipe and zb2p (the
# split backward at most micro-batches held); the others (resnet's batch norm and residuals,
# the Hugging Face models traced by torch.export, the branching two_towers, compiled into a
# stage graph) run the configs their structure adds to, and each placed schedule runs on gpt
# and on one of the others: their other cases repeat a path a kept case covers, and are
# sampled out for time.
KEPT = {"mlp": ("gpipe", "zb2p"), "resnet": ("gpipe-always", "1f1b"),
        "hf_gpt2": ("1f1b-except_last",),
        "hf_bert": ("zb1p",), "hf_llama": ("1f1b",),
        "two_towers": ("gpipe-always",)}  # fmt: skip
PLACED_KEPT = {"two_towers": ("zbv", "dualpipev"), "hf_llama": ("looped_bfs",),
               "gpt": tuple(PLACED)}  # fmt: skip


def _case(name: str, config: str, options: dict, kept: bool) -> object:
    if kept:
        return (name, config, options)
    return pytest.param(name, config, options, marks=SAMPLED_OUT, id=f"{name}-{config}-")


CASES = [_case(n, c, o, c in KEPT.get(n, (c,))) for c, o in CONFIGS.items() for n in EXAMPLE_NAMES]
CASES += [_case(n, c, o, c in PLACED_KEPT[n]) for c, o in PLACED.items() for n in PLACED_ON]


def test_the_matrix_runs_every_synchronous_schedule():
    """A schedule added to the registry joins the matrix, kept in the default run on gpt."""
    covered = {o["schedule"] for c, o in {**CONFIGS, **PLACED}.items()}
    assert covered == set(_SYNCHRONOUS)
    assert set(PLACED_KEPT["gpt"]) == set(PLACED)


@pytest.mark.parametrize(
    ("name", "config", "options"), CASES, ids=lambda v: v if isinstance(v, str) else ""
)
def test_schedule_equals_eager_and_measures_as_predicted(tmp_path, name, config, options):
    spec = example_spec(name)
    compiled, pipe = build(tmp_path, name, **options)
    report = check_step(
        pipe,
        spec.model,
        spec.inputs,
        spec.targets,
        spec.loss_fn,
        tolerance=Tolerance(1e-6),
        measure_memory=True,
    )
    assert report.ok, str(report)
    costs = Costs.uniform(compiled.program.num_stages)  # a stage graph has more than 4
    timeline = simulate(compiled.program, topology(compiled.graph), costs)
    assert pipe.last.stats is not None
    assert pipe.last.stats.peak_inflight == timeline.peak_inflight
    assert pipe.last.stats.peak_stored == predicted_bytes(compiled)


def test_1f1b_device_j_holds_min_p_minus_j_m(tmp_path):
    compiled, pipe = build(tmp_path, "mlp", schedule="1f1b")
    spec = example_spec("mlp")
    pipe.train_step(spec.inputs, spec.targets, spec.loss_fn)
    assert pipe.last.stats is not None
    assert pipe.last.stats.peak_inflight == (4, 3, 2, 1)


@pytest.mark.parametrize("name", ["gpt", "resnet"])
def test_recompute_changes_memory_not_gradients(tmp_path, name):
    spec = example_spec(name)
    grads = {}
    measured = {}
    for policy in ("never", "always"):
        compiled, pipe = build(tmp_path / policy, name, schedule="gpipe", recompute=policy)
        got: dict[str, torch.Tensor] = {}
        pipe.train_step(
            spec.inputs, spec.targets, spec.loss_fn,
            on_step=lambda j, p=pipe, g=got: g.update(p.named_grads(j)), measure_memory=True,
        )  # fmt: skip
        assert pipe.last.stats is not None
        grads[policy], measured[policy] = got, pipe.last.stats.peak_stored
        assert measured[policy] == predicted_bytes(compiled)
        if policy == "always":
            buffers = {k: v for k, v in pipe.state_dict().items() if "running" in k}
    assert grads["never"].keys() == grads["always"].keys()
    for key, value in grads["never"].items():
        torch.testing.assert_close(grads["always"][key], value, atol=0, rtol=0)
    assert all(a < b for a, b in zip(measured["always"], measured["never"]))
    if name == "resnet":  # recomputation must not update BatchNorm statistics a second time
        _, plain = build(tmp_path / "again", name, schedule="gpipe")
        plain.train_step(spec.inputs, spec.targets, spec.loss_fn)
        for key, value in plain.state_dict().items():
            if "running" in key:
                torch.testing.assert_close(buffers[key], value, atol=0, rtol=0)


def test_memory_budget_picks_the_least_recomputation_that_fits(tmp_path):
    never, _ = build(tmp_path / "never", "gpt", schedule="gpipe")
    always, _ = build(tmp_path / "always", "gpt", schedule="gpipe", recompute="always")
    low, high = predicted_bytes(always), predicted_bytes(never)
    budget = (max(low) + max(high)) // 2
    fitted, pipe = build(tmp_path / "fit", "gpt", schedule="gpipe", memory_budget=budget)
    peaks = predicted_bytes(fitted)
    assert max(peaks) <= budget
    recomputed = {str(x) for _, _, x in fitted.program.instructions() if x.op == "FC"}
    assert 0 < len(recomputed) < 16  # some, not all, of the 4 x 4 forwards
    # one fewer recomputed forward on the most loaded device would not fit
    spec = example_spec("gpt")
    pipe.train_step(spec.inputs, spec.targets, spec.loss_fn, measure_memory=True)
    assert pipe.last.stats is not None and pipe.last.stats.peak_stored == peaks
    report = check_step(
        pipe, spec.model, spec.inputs, spec.targets, spec.loss_fn, tolerance=Tolerance(1e-6)
    )
    assert report.ok, str(report)


def test_memory_budget_too_small_names_the_device(tmp_path):
    spec = example_spec("gpt")
    with pytest.raises(MemoryBudgetError, match=r"device 0 \(stage 0\) stores at least .* above"):
        compile_model(spec.model, spec.inputs, stages=4, microbatches=4, memory_budget=1000)
