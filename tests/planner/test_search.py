"""The plan search: every plan it ranks is predicted from the exact split, memory limits drop
plans exactly, the chosen plan compiles into what it predicted, and bad requests are refused."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

import pytest
import torch

from pipecompile.compiler import compile_model
from pipecompile.errors import PlanError
from pipecompile.frontend.tracer import trace
from pipecompile.ir.programs.cost_model import CostModel
from pipecompile.passes import annotate_costs
from pipecompile.planner.model_facts import model_facts
from pipecompile.planner.predict import Predictor
from pipecompile.planner.search import Space, divisors, search
from pipecompile.runtime.job.placement import Placement
from pipecompile.schedules import SYNCHRONOUS, V_SHAPED
from tests.conftest import example_spec

# A machine where a small micro-batch costs: every op and instruction has a fixed price.
MACHINE = CostModel(flops_rate=2e10, op_overhead=4e-6, half_work=2e4, instr_overhead=30e-6)


@pytest.fixture(scope="module")
def gpt() -> tuple[object, dict[str, torch.Tensor]]:
    spec = example_spec("gpt")
    return spec.model, spec.inputs


@pytest.fixture(scope="module")
def facts(gpt):  # type: ignore[no-untyped-def]
    model, inputs = gpt
    traced = trace(model, inputs)
    return model_facts(annotate_costs(traced.module, root=traced.root), 8)


def test_every_plan_is_predicted_and_the_best_ranks_first(facts) -> None:  # type: ignore[no-untyped-def]
    result = search(facts, batch=8, space=Space(devices=4), machine=MACHINE)
    steps = [round(p.step, 9) for p in result.ranked]  # ties (to the ns) broken by simplicity
    assert steps == sorted(steps) and result.tried >= len(result.ranked) > 20
    # Each shape the search may use appears: pure data parallel, replicated pipelines, and
    # every synchronous schedule; a plan uses at most the 4 devices (fewer where a replica
    # would have no micro-batch, or cost more than it saves), the looped and V-shaped 2 to 4.
    seen = {p.plan.schedule for p in result.ranked}
    assert seen == SYNCHRONOUS  # zbv, v_half, v_min and dualpipev on 8 stages in a V
    assert any(p.plan.replicas for p in result.ranked)
    for p in result.ranked:
        per_device = {"interleaved": p.plan.virtual_stages, "looped_bfs": p.plan.virtual_stages}
        stages_each = per_device.get(p.plan.schedule) or (2 if p.plan.schedule in V_SHAPED else 1)
        assert p.devices == (sum(p.plan.replicas) or p.plan.stages // stages_each)
        assert p.devices <= 4 and (stages_each == 1 or p.devices >= 2)
        assert all(r <= p.plan.microbatches for r in p.plan.replicas)
    # Micro-batch counts: the divisors of the batch, no more.
    assert {p.plan.microbatches for p in result.ranked} <= set(divisors(8))


def test_the_fixed_options_fix_their_part(facts) -> None:  # type: ignore[no-untyped-def]
    space = Space(devices=4, stages=(4,), schedules=("1f1b",), microbatches=(4,))
    result = search(facts, batch=8, space=space, machine=MACHINE)
    fixed = {(p.plan.stages, p.plan.schedule, p.plan.microbatches) for p in result.ranked}
    assert fixed == {(4, "1f1b", 4)}  # a chain, and the stage graph of the same devices
    assert len(result.ranked) <= 2


def test_a_memory_limit_drops_exactly_the_plans_over_it(facts) -> None:  # type: ignore[no-untyped-def]
    free = search(facts, batch=8, space=Space(devices=2), machine=MACHINE)
    peaks = sorted({max(p.memory) for p in free.ranked})
    limit = peaks[len(peaks) // 2]
    capped = search(
        facts, batch=8, space=Space(devices=2), machine=replace(MACHINE, memory_limit=(limit,))
    )
    assert all(max(p.memory) <= limit for p in capped.ranked)
    # Recomputation is searched under a limit; a plan that fit without it still fits.
    assert {p.plan.recompute for p in capped.ranked} >= {"never", "always"}
    kept = {(p.plan, p.step) for p in capped.ranked if p.plan.recompute == "never"}
    assert {(p.plan, p.step) for p in free.ranked if max(p.memory) <= limit} <= kept
    # Below the smallest peak of any plan: refused, naming that peak.
    smallest = min(max(p.memory) for p in capped.ranked)
    with pytest.raises(PlanError, match=r"smallest peak found is .*raise --memory-limit"):
        search(
            facts,
            batch=8,
            space=Space(devices=2),
            machine=replace(MACHINE, memory_limit=(smallest // 4,)),
        )


def test_the_prediction_is_the_simulated_step_of_the_exact_split(facts) -> None:  # type: ignore[no-untyped-def]
    """Brute force over every 2-stage split: none has a smaller bottleneck than the one the
    predictor solved, so its prediction starts from the exact optimum."""
    predictor = Predictor(facts, 8, MACHINE)
    from pipecompile.planner.plan import Plan

    plan = Plan("1f1b", 2, 4)
    got = predictor.predict(plan, predictor.program(plan), None)
    assert got is not None
    at = facts.at(2, MACHINE)
    total = list(itertools.accumulate(at.cost, initial=0))
    cut = at.forward + at.backward

    def bottleneck(k: int) -> float:
        per_byte = 1e3 / MACHINE.bandwidth * 1e12  # ps per byte, as the cost unit
        return max(total[k] + cut[k] * per_byte, total[-1] - total[k] + cut[k] * per_byte)

    best = min(bottleneck(k) for k in range(1, facts.atoms))
    assert bottleneck(got.starts[1]) <= best * (1 + 1e-6) + 1e6  # one microsecond


def test_refusals(facts) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PlanError, match=r"--microbatches 3 does not divide the batch of 8"):
        search(facts, batch=8, space=Space(devices=2, microbatches=(3,)), machine=MACHINE)
    with pytest.raises(PlanError, match=r"--stages 8 cannot run on --devices 2: gpipe runs one "
                       r"stage per device \(give --devices 8 or more\)"):  # fmt: skip
        search(
            facts,
            batch=8,
            space=Space(devices=2, stages=(8,), schedules=("gpipe",)),
            machine=MACHINE,
        )
    v_message = r"--stages 3 cannot run on --devices 3: zbv puts two stages on each device"
    with pytest.raises(PlanError, match=v_message + r" \(a V\), so up to 3 devices take --stages "
                       r"4 or 6$"):  # fmt: skip
        search(
            facts, batch=8, space=Space(devices=3, stages=(3,), schedules=("zbv",)), machine=MACHINE
        )
    forced = replace(facts, forced=(10, 20, 30))
    with pytest.raises(PlanError, match=r"3 requested boundaries .* 4 stages.*--devices 4 or more"):
        search(forced, batch=8, space=Space(devices=2, schedules=("1f1b",)), machine=MACHINE)
    with pytest.raises(PlanError, match=r"a looped schedule needs a multiple of the devices"):
        search(
            facts,
            batch=8,
            space=Space(devices=4, schedules=("interleaved",), microbatches=(1,)),
            machine=MACHINE,
        )


def test_the_chosen_plan_compiles_and_the_manifest_keeps_it(gpt) -> None:  # type: ignore[no-untyped-def]
    model, inputs = gpt
    compiled = compile_model(model, inputs, devices=4, machine=MACHINE)
    plan = compiled.plan
    assert plan is not None and plan.devices == 4
    assert compiled.program.schedule == plan.chosen.schedule
    assert compiled.program.microbatches == plan.chosen.microbatches
    assert len(compiled.graph.stages) == plan.chosen.stages
    step = plan.chosen.predicted_step_s
    assert step > 0 and len(plan.runners_up) == 4
    assert all(r.predicted_step_s >= step for r in plan.runners_up)
    # --schedule auto with the stages fixed searches the schedules only
    fixed = compile_model(model, inputs, stages=2, microbatches=4, schedule="auto", machine=MACHINE)
    assert fixed.plan is not None and len(fixed.graph.stages) == 2
    assert fixed.program.microbatches == 4 and fixed.plan.devices == 2


def test_show_and_the_summary_print_the_plan_table(gpt, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pipecompile.codegen.emit import ModelRef, emit
    from pipecompile.reports.show import format_report, schedule_report
    from pipecompile.reports.summary import summary

    model, inputs = gpt
    compiled = compile_model(model, inputs, devices=2, machine=MACHINE)
    out = emit(compiled, tmp_path / "out", model=ModelRef(None, "gpt", "gpt"))
    report, timeline = schedule_report(out)
    assert report["plan"]["devices"] == 2
    for text in (format_report(report, timeline), summary(out)):
        assert "plan: searched" in text and "*  " in text, text


def test_a_model_on_the_meta_device_is_planned_without_weights() -> None:
    """Traced on meta inputs as a --stages compile is: the search needs shapes and FLOPs only."""
    spec = example_spec("llama_meta")
    compiled = compile_model(spec.model, spec.inputs, devices=2, machine=MACHINE)
    assert compiled.plan is not None and compiled.plan.chosen.predicted_step_s > 0
    assert len(compiled.graph.stages) == compiled.plan.chosen.stages


def test_options_the_search_cannot_take_are_refused(gpt) -> None:  # type: ignore[no-untyped-def]
    model, inputs = gpt
    with pytest.raises(PlanError, match="give --stages N .* or --devices N"):
        compile_model(model, inputs)
    with pytest.raises(PlanError, match="--replicate fixes how stages are replicated"):
        compile_model(model, inputs, devices=2, replicas=(1, 1))
    with pytest.raises(PlanError, match="--balance time: the plan search prices"):
        compile_model(model, inputs, devices=2, balance="time")


@pytest.mark.parametrize("devices", [2, 3, 4])
def test_no_plan_leaves_a_device_it_uses_without_work(devices) -> None:  # type: ignore[no-untyped-def]
    """Every plan the search ranks for 2-4 devices, placed as the runtime places it (replica k
    of a stage runs the micro-batches i with i mod r == k): each rank runs micro-batches, the
    busiest replica runs the ceil(m / r) the prediction charges, and the predicted bubble
    counts the time the other replicas wait for it."""
    spec = example_spec("mlp")
    traced = trace(spec.model, spec.inputs)
    facts = model_facts(annotate_costs(traced.module, root=traced.root), 8)
    result = search(facts, batch=8, space=Space(devices=devices), machine=MACHINE)
    assert any(p.plan.replicas for p in result.ranked) or devices == 2
    for p in result.ranked:
        plan = p.plan
        replicas = plan.replicas or (1,) * plan.stages
        if plan.replicas:
            place = Placement(tuple(range(plan.stages)), replicas)
            for stage, r in enumerate(replicas):
                runs = Counter(place.rank_of(stage, i) for i in range(plan.microbatches))
                assert sorted(runs) == place.ranks_of_stage(stage), (plan, stage)
                assert max(runs.values()) == -(-plan.microbatches // r)
            idle = sum(r * -(-plan.microbatches // r) - plan.microbatches for r in replicas)
            assert p.bubble >= idle / (sum(replicas) * plan.microbatches) - 1e-9, plan
        assert p.devices <= devices


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"devices": 2, "schedule": "pipedream"}, "--schedule pipedream updates weights "
         "asynchronously .* prices synchronous schedules only: fix the plan with --stages N"),
        ({"devices": 2, "schedule": "pipedream_2bw"}, "--schedule pipedream_2bw updates"),
        ({"stages": 3, "schedule": "zbv", "microbatches": "auto"},
         "--schedule zbv puts 2 stages on each device: --stages 3 is not a multiple of 2; "
         "give --stages 4"),
        ({"devices": 2, "machine": replace(MACHINE, memory_limit=(1, 2, 3))},
         "--memory-limit gives 3 values for --devices 2"),
        ({"devices": 3, "machine": replace(MACHINE, memory_limit=(1 << 20, 1 << 20))},
         "--memory-limit gives 2 values for --devices 3"),
    ],
)  # fmt: skip
def test_requests_the_search_cannot_take_are_refused_before_it(gpt, options, message) -> None:  # type: ignore[no-untyped-def]
    model, inputs = gpt
    with pytest.raises(PlanError, match=message):
        compile_model(model, inputs, **{"machine": MACHINE, **options})


def test_per_device_limits_follow_a_plan_that_uses_fewer_devices() -> None:
    """A plan using 1 of 3 devices compiles with the first device's limit (not "3 sizes for
    1 devices")."""
    spec = example_spec("mlp")
    machine = replace(MACHINE, memory_limit=(1 << 30,) * 3)
    compiled = compile_model(spec.model, spec.inputs, devices=3, machine=machine)
    assert compiled.plan is not None and compiled.plan.chosen.devices_used == 1
    assert compiled.plan.devices == 3


RICH = replace(
    MACHINE,
    message_latency=200e-6,
    optimizer_rate=1e9,
    bandwidth=1e8,
    concurrency=2.0,
    device_speed=(1.0, 2.0, 0.5, 1.0),
)  # latency, an optimizer, slow links, shared cores and uneven speeds


@pytest.mark.parametrize(("devices", "machine"), [(4, MACHINE), (6, MACHINE), (4, RICH)])
def test_bounding_keeps_the_best_plans(facts, devices, machine) -> None:  # type: ignore[no-untyped-def]
    """With ``keep``, plans whose slowest stage alone outlasts the keep-th best step are
    skipped after one probe, and plans whose floor does before their program is generated
    (some of those a schedule could not have generated: counted as bounded, where the full
    search drops them untried); the best ``keep`` plans, and their predictions, are
    unchanged."""
    space = Space(devices=devices)
    every = search(facts, batch=8, space=space, machine=machine)
    kept = search(facts, batch=8, space=space, machine=machine, keep=5)
    assert kept.bounded > 0 and kept.tried < every.tried <= kept.tried + kept.bounded
    assert kept.ranked[:5] == every.ranked[:5]


@pytest.mark.parametrize(
    "machine",
    [
        RICH,
        replace(MACHINE, memory_limit=(1 << 30,)),
    ],
    ids=["latency-optimizer-shared-cores-speeds", "memory-limit"],
)
def test_the_floor_never_exceeds_a_predicted_step(facts, machine) -> None:  # type: ignore[no-untyped-def]
    """``Predictor.floor`` (the bound that skips a plan before its split and program) is at or
    under the step ``predict`` gives every plan of 4 devices, on machines with message
    latency, an optimizer, shared cores, uneven device speeds and a memory limit; and the
    bound is not vacuous (it is within 2x of some plans' steps)."""
    space = Space(devices=4)
    result = search(facts, batch=8, space=space, machine=machine)
    predictor = Predictor(facts, 8, machine)
    ratios = []
    for got in result.ranked:
        plan = got.plan
        workers = got.devices if plan.replicas else None  # the ranks it was offered
        floor = predictor.floor(replace(plan, replicas=()), workers)
        assert floor <= got.step * (1 + 1e-9), plan.flags
        ratios.append(floor / got.step)
    assert max(ratios) > 0.5


@pytest.mark.parametrize(("devices", "machine"), [(6, MACHINE), (4, RICH)], ids=["6", "rich-4"])
def test_no_plan_is_bounded_out_of_its_own_step(facts, devices, machine) -> None:  # type: ignore[no-untyped-def]
    """``Predictor.beyond`` (the window of bottlenecks, then the exact split's fill and
    drain) never says a plan cannot reach the step ``predict`` gives it: every replicable
    plan of the space, with and without replicas, under its own step is within reach, and
    some are out of reach of a slightly shorter one (the bound is not vacuous)."""
    result = search(facts, batch=8, space=Space(devices=devices), machine=machine)
    replicable = [p for p in result.ranked if p.plan.schedule in ("gpipe", "1f1b", "zb1p", "zb2p")]
    assert {p.plan.schedule for p in replicable} == {"gpipe", "1f1b", "zb1p", "zb2p"}
    predictor = Predictor(facts, 8, machine)
    refused = 0
    for got in replicable:
        plan = replace(got.plan, replicas=())
        workers = got.devices if got.plan.replicas else None  # the ranks it was offered
        assert not predictor.beyond(plan, workers, got.step * (1 + 1e-9)), got.plan.flags
        refused += predictor.beyond(plan, workers, got.step * 0.9)
    assert refused > 0


def test_a_looped_or_v_schedule_may_use_fewer_devices_than_offered(facts) -> None:  # type: ignore[no-untyped-def]
    """`--devices N` offers up to N devices to every schedule: interleaved and zbv plans on 2
    and 3 of 4 devices are priced beside the 4-device ones, and 2 micro-batches (which
    interleaved cannot run on 4 devices) find their plans on 2."""
    space = Space(devices=4, schedules=("interleaved", "zbv"), microbatches=(2,))
    result = search(facts, batch=8, space=space, machine=MACHINE)
    used = {(p.plan.schedule, p.devices) for p in result.ranked}
    assert {("interleaved", 2), ("zbv", 2), ("zbv", 3)} <= used, used


def test_a_replica_counts_against_the_memory_limit_of_its_own_rank(facts) -> None:  # type: ignore[no-untyped-def]
    """Per-device limits bind each replica's rank: a plan that puts a whole replica on the
    small device does not fit, whatever the large one holds."""
    probe = search(facts, batch=8, space=Space(devices=2, stages=(1,)), machine=MACHINE)
    whole = max(probe.best.memory)  # one stage holding the whole model
    small, large = whole // 2, whole * 4
    machine = replace(MACHINE, memory_limit=(large, small))
    result = search(facts, batch=8, space=Space(devices=2, stages=(1,)), machine=machine)
    assert all(not p.plan.replicas for p in result.ranked)  # no replica on the small device
    assert all(p.devices == 1 for p in result.ranked)


def test_the_compile_of_a_plan_on_fewer_ranks_takes_their_limits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`--devices 2 --microbatches 2 --memory-limit A,B` compiles (it once ended after the
    search: '--memory-limit gives 2 sizes for 1 devices')."""
    from pipecompile.surfaces.cli import main
    from tests.conftest import EXAMPLES

    base = [str(EXAMPLES / "mlp.py"), "--devices", "2", "--memory-limit", "400KiB,100KiB", "-q"]
    assert main([*base, "--microbatches", "2", "-o", str(tmp_path / "o")]) == 0
    assert main([*base, "-o", str(tmp_path / "o2")]) == 0  # the search chooses 1 of 2 devices
