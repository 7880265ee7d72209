"""The model's own timing is kept with the calibration: a second compile of the same model
and example prices it with the same seconds (no timing noise between compiles), another
example shape is timed anew, and a calibration measured again starts with none kept."""

from __future__ import annotations

import pytest
import torch

from pipecompile.ir.programs.cost_model import CostModel
from pipecompile.planner import calibration_messages, pricing
from pipecompile.planner.calibrate import remember_scale
from pipecompile.planner.calibration_store import (
    describe,
    machine_key,
    read_records,
    write_records,
)
from pipecompile.planner.choose import traced_facts
from pipecompile.planner.model_probe import Probe
from pipecompile.planner.search import Space
from pipecompile.runtime.process.threads import fair_share
from tests.conftest import example_spec


def _models(spec, said: list[str] | None = None):  # type: ignore[no-untyped-def]
    facts, key = traced_facts(spec.model, spec.inputs)
    space = Space(devices=2)
    say = said.append if said is not None else None
    return pricing.rank_models(spec.model, spec.inputs, facts, CostModel(), space, say, key)


def test_a_kept_timing_prices_the_next_compile_alike(measured, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    timed: list[tuple[int, ...]] = []

    def probe(model, inputs, sizes, threads):  # type: ignore[no-untyped-def]
        timed.append(sizes)
        return Probe(sizes, tuple(1e-3 * (len(timed) + s) for s in sizes))

    monkeypatch.setattr(pricing, "probe_model", probe)
    spec = example_spec("mlp")
    said: list[str] = []
    first = _models(spec, said)
    assert len(timed) == len({fair_share(1), fair_share(2)})  # once per share of the cores
    assert any(line.startswith("the model timed eagerly on ") for line in said)
    said.clear()
    again = _models(spec, said)  # timed anew, the made-up seconds would differ
    assert len(timed) == len({fair_share(1), fair_share(2)}) and again == first
    assert any(line.startswith("the model's eager timing on ") for line in said)
    assert "  the eager timings of 1 model example kept" in describe()  # pipecompile calibration
    # another example shape is another key: timed
    longer = example_spec("mlp")
    longer.inputs["x"] = torch.randn(16, *spec.inputs["x"].shape[1:])
    _models(longer)
    assert len(timed) > len({fair_share(1), fair_share(2)})
    # the calibration measured again (here: its method changed) keeps none
    records = read_records()
    records[machine_key(fair_share(2))]["method"] = 1
    write_records(records)
    measured.clear()
    count = len(timed)
    _models(spec)
    assert "2 threads" in measured or f"{fair_share(2)} threads" in measured
    assert len(timed) == count + 1  # the share whose calibration was measured again


def test_example_keys_differ_by_shape() -> None:
    from pipecompile.planner.model_timings import example_key

    a = example_key("f" * 64, {"x": torch.zeros(8, 4)})
    assert a == example_key("f" * 64, {"x": torch.ones(8, 4)})  # values do not matter
    assert a != example_key("f" * 64, {"x": torch.zeros(8, 5)})
    assert a != example_key("f" * 64, {"x": torch.zeros(8, 4, dtype=torch.float64)})
    assert a != example_key("e" * 64, {"x": torch.zeros(8, 4)})


@pytest.fixture(autouse=True)
def _no_real_measuring(monkeypatch):  # type: ignore[no-untyped-def]
    def started(*args: object) -> None:
        pytest.fail("ranks started")

    monkeypatch.setattr(calibration_messages, "rank_figures", started)


def test_tune_ratio_scales_the_corrected_prices(measured, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """--tune's ratio multiplies the prices after the model's own timing corrected them
    (applied before, the correction undid it on the model's ops: --tune changed nothing)."""

    def probe(model, inputs, sizes, threads):  # type: ignore[no-untyped-def]
        return Probe(sizes, tuple(1e-3 * (1 + s) for s in sizes))

    monkeypatch.setattr(pricing, "probe_model", probe)
    spec = example_spec("mlp")
    plain = _models(spec)
    _, key = traced_facts(spec.model, spec.inputs)
    remember_scale(2, 1.5, key)
    scaled = _models(spec)
    assert scaled.at(2).work_scale == pytest.approx(plain.at(2).work_scale * 1.5)
    assert scaled.at(2).fixed_scale == pytest.approx(plain.at(2).fixed_scale * 1.5)
    assert scaled.at(2).instr_overhead == pytest.approx(plain.at(2).instr_overhead * 1.5)
    assert scaled.at(1) == plain.at(1)  # learned on 2 ranks: 1 rank's prices unchanged
