"""A plan is priced by the cost model of the ranks it runs on: the same plan has the same price
whatever ``--devices`` offered, a search offered more devices never chooses a plan priced
above the best of a search offered fewer, and bounding keeps the best plans under models that
differ per rank count."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from pipecompile.frontend.tracer import trace
from pipecompile.ir.programs.cost_model import CostModel
from pipecompile.passes import annotate_costs
from pipecompile.planner import calibrate, choose, pricing
from pipecompile.planner.model_facts import model_facts
from pipecompile.planner.model_probe import Probe
from pipecompile.planner.predict import Predictor
from pipecompile.planner.rank_models import RankModels, rank_ladder
from pipecompile.planner.search import Space, search
from tests.conftest import example_spec

BASE = CostModel(flops_rate=2e10, op_overhead=4e-6, half_work=2e4, instr_overhead=30e-6)


def per_count(devices: int) -> RankModels:
    """Models that differ per rank count as a 2-core machine's calibration does: messages
    dearer between more ranks, and from 3 ranks on the cores shared."""
    return RankModels(
        tuple(
            replace(
                BASE,
                message_latency=40e-6 * k,
                bandwidth=2e9 / k,
                concurrency=2.0 if k > 2 else 0.0,
                instr_overhead=BASE.instr_overhead * (1 + 0.1 * k),
            )
            for k in range(1, devices + 1)
        )
    )


@pytest.fixture(scope="module")
def facts():  # type: ignore[no-untyped-def]
    spec = example_spec("gpt")
    traced = trace(spec.model, spec.inputs)
    return model_facts(annotate_costs(traced.module, root=traced.root), 8)


def _priced(result) -> dict[tuple[object, int], float]:  # type: ignore[no-untyped-def]
    return {(p.plan, p.devices): p.step for p in result.ranked}


def test_one_plan_one_price_and_more_devices_never_choose_worse(facts) -> None:  # type: ignore[no-untyped-def]
    results = {
        n: search(facts, batch=8, space=Space(devices=n), machine=per_count(n)) for n in range(1, 7)
    }
    for n in range(2, 7):
        bigger = _priced(results[n])
        for k in range(1, n):
            assert results[n].best.step <= results[k].best.step
            # one device offered, the looped and V schedules run on it (nothing else can)
            smaller = {key: v for key, v in _priced(results[k]).items() if key[1] > 1 or k > 1}
            assert smaller.keys() <= bigger.keys(), (k, n)
            assert all(bigger[key] == step for key, step in smaller.items()), (k, n)
    # each plan priced by its own count's model: a 2-rank plan of the 6-device search as a
    # search of 2 devices under that model alone prices it
    two = next(p for p in results[6].ranked if p.devices == 2 and not p.plan.replicas)
    alone = Predictor(facts, 8, per_count(6).at(2))
    plan = two.plan
    assert alone.predict(plan, alone.program(plan), None).step == two.step
    # and the counts differ enough to matter: the same plan under the 6-rank model costs more
    dear = Predictor(facts, 8, per_count(6).at(6))
    assert dear.predict(plan, dear.program(plan), None).step > two.step


@pytest.mark.parametrize("devices", [4, 6])
def test_bounding_keeps_the_best_plans_under_per_count_models(facts, devices) -> None:  # type: ignore[no-untyped-def]
    models = per_count(devices)
    full = search(facts, batch=8, space=Space(devices=devices), machine=models)
    kept = search(facts, batch=8, space=Space(devices=devices), machine=models, keep=5)
    assert kept.bounded > 0
    best = [(p.plan, p.step) for p in full.ranked[:5]]
    assert [(p.plan, p.step) for p in kept.ranked[:5]] == best


def test_a_search_for_one_rank_count_prices_only_plans_on_it(facts) -> None:  # type: ignore[no-untyped-def]
    """--tune compiles a priced plan again on the ranks it was priced for (``Space.ranks``)."""
    result = search(facts, batch=8, space=Space(devices=4, ranks=(3,)), machine=per_count(4))
    assert result.ranked and {p.devices for p in result.ranked} == {3}
    assert any(p.plan.replicas for p in result.ranked)  # 1 or 2 stages spread over 3 ranks


def test_the_rank_ladder() -> None:
    assert rank_ladder(1) == [1]
    assert rank_ladder(6) == [1, 2, 3, 4, 5, 6]
    assert rank_ladder(12) == [1, 2, 3, 4, 5, 6, 7, 8, 12]
    assert rank_ladder(64) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64]
    assert rank_ladder(40) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 40]


def test_messages_measured_up_to_eight_ranks_and_at_powers_of_two(measured) -> None:  # type: ignore[no-untyped-def]
    said: list[str] = []
    models = calibrate.calibrated_ranks(CostModel(), 12, said.append)
    assert [c for c in measured if isinstance(c, int)] == [2, 3, 4, 5, 6, 7, 8, 16]
    line = next(s for s in said if s.startswith("calibrating messages"))
    assert line.startswith("calibrating messages between 2, 3, 4, 5, 6, 7, 8 and 16 ranks (")
    # 12 ranks: halfway (in log2) between 8 and 16 in latency and in seconds per byte
    latency = [m.message_latency for m, _ in models]
    assert latency[7] == pytest.approx(8e-5) and latency[11] > latency[7]
    t = math.log2(12) - 3
    assert latency[11] == pytest.approx(8e-5 + t * 8e-5)
    assert 1 / models[11][0].bandwidth == pytest.approx(8 / 4e9 + t * 8 / 4e9)
    # a search offered 5 devices measures nothing more and prices 5 ranks as this one did
    measured.clear()
    again = calibrate.calibrated_ranks(CostModel(), 5)
    assert measured == [] and again[4] == models[4] and again[1] == models[1]
    assert models[0][0].message_latency == 0.0  # one rank sends no message


def test_a_plan_has_one_price_whatever_devices_offered(measured, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The issue's case, through ``choose_plan`` as a compile calls it: the plans on 2 ranks
    priced alike at --devices 3, 5 and 7 (the model's own timing made up, the same for each
    compile, as a quiet machine's would be)."""
    monkeypatch.setattr(
        pricing, "probe_model", lambda model, inputs, sizes, threads: Probe(sizes, (2e-3, 6e-3))
    )
    spec = example_spec("mlp")
    prices: dict[int, dict[tuple[object, ...], float]] = {}
    for devices in (3, 5, 7):
        _, _, record = choose.choose_plan(
            spec.model, spec.inputs, devices=devices, stages=None, microbatches="auto",
            schedule="auto", virtual_stages=None, recompute="never", split_at=(),
            machine=CostModel(), progress=False,
        )  # fmt: skip
        rows = record.ranked
        prices[devices] = {(r.flags, r.devices_used): r.predicted_step_s for r in rows}
    common = set(prices[3]) & set(prices[5]) & set(prices[7])
    assert common, prices
    for key in common:
        assert prices[3][key] == prices[5][key] == prices[7][key], key
