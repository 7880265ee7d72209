"""--balance time: ops timed on the real device, cached, and balanced exactly on those times."""

from __future__ import annotations

from pipecompile.frontend.tracer import trace
from pipecompile.ir.graph.node_info import info, with_info
from pipecompile.passes import annotate_costs, balance_stages, min_max_partition
from pipecompile.passes.balance_stages import compute_nodes
from pipecompile.passes.profile_costs import profile_costs
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES, example_spec


def test_every_op_gets_a_time_and_the_cache_answers_the_second_time(tmp_path):
    spec = example_spec("gpt")
    traced = trace(spec.model, spec.inputs)
    annotated = annotate_costs(traced.module, root=traced.root)
    inputs = [spec.inputs[n] for n in traced.input_names]
    first = profile_costs(annotated, inputs=inputs, cache=tmp_path, repeats=3)
    ops = compute_nodes(first.graph)
    assert all(info(n).time_ns > 0 for n in ops if n.op == "call_module")
    assert sum(info(n).time_ns for n in ops) > 0
    assert len(list(tmp_path.glob("*.json"))) == 1
    again = profile_costs(annotated, inputs=inputs, cache=tmp_path)
    assert [info(n).time_ns for n in compute_nodes(again.graph)] == [info(n).time_ns for n in ops]


def test_a_tiny_op_scaled_to_the_whole_graph_keeps_a_measured_time():
    """On a busy machine an op can measure below the harness overhead (1 ns); scaling every
    op to the whole graph's time must not round it to 0, which reads as "not measured"."""
    from pipecompile.passes.profile_costs import _scaled_to_whole

    scaled = _scaled_to_whole({"tiny": 1, "big": 10_000}, whole=4_000)
    assert scaled == {"tiny": 1, "big": 4_000}


def test_balance_time_cuts_exactly_on_the_measured_times():
    spec = example_spec("mlp")
    traced = trace(spec.model, spec.inputs)
    annotated = annotate_costs(traced.module, root=traced.root)
    ops = compute_nodes(annotated.graph)
    times = [1000 * (k + 1) ** 2 for k in range(len(ops))]  # stand-in measurements
    for node, t in zip(ops, times):
        with_info(node, time_ns=t)
    balanced, _ = balance_stages(annotated, stages=3, cost="time")
    stages = [info(n).stage for n in compute_nodes(balanced.graph)]
    starts = min_max_partition(times, 3)
    assert [stages.index(j) for j in range(3)] == starts


def test_compile_with_balance_time_runs_and_checks(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("PIPECOMPILE_CACHE")  # the suite's own, which the profiles follow too
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = str(tmp_path / "o")
    args = [str(EXAMPLES / "mlp.py"), "--stages", "3", "--balance", "time", "-o", out]
    assert main(args) == 0
    assert "profile: " in capsys.readouterr().err
    assert list((tmp_path / "cache" / "pipecompile" / "profiles").glob("*.json"))
    assert main(args) == 0
    assert "from cache" in capsys.readouterr().err
    assert main(["run", out, "--check"]) == 0
