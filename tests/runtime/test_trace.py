"""`run --trace FILE` and `show --measured FILE`: measured timelines of the traced steps.

The distributed trace (one row per rank, waits on the receiving rank) is checked in
tests/runtime/test_run_data.py, inside its 3-rank run under every training option.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pipecompile.ir.programs.instr import Instr, Op
from pipecompile.reports.measured import COLUMNS, measured_report
from pipecompile.runtime.load import read_manifest, read_program
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.timeline import Tracer
from pipecompile.runtime.timeline_file import SIMULATED_PID, measured_costs
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES

MLP = str(EXAMPLES / "mlp.py")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trace") / "mlp"
    argv = [MLP, "--stages", "2", "--microbatches", "4", "--schedule", "1f1b", "-q", "-o", str(out)]
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def traced(compiled: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A local run of 4 steps, the first 3 traced; and the metrics of the same run untraced."""
    root = tmp_path_factory.mktemp("runs")
    trace = root / "trace.json"
    common = ["run", str(compiled), "--steps", "4", "--seed", "1", "-q"]
    assert main([*common, "--trace", str(trace), "--metrics", str(root / "traced.jsonl")]) == 0
    assert main([*common, "--metrics", str(root / "plain.jsonl")]) == 0
    return trace, root


def _events(trace: Path) -> list[dict]:
    return [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]


def test_every_instruction_of_every_traced_step_is_on_its_devices_row(compiled, traced):
    trace, _ = traced
    program = read_program(compiled / read_manifest(compiled).program)
    document = json.loads(trace.read_text())
    assert document["otherData"]["traced_steps"] == [1, 2, 3]
    measured = [e for e in _events(trace) if e["pid"] < SIMULATED_PID]
    for step in (1, 2, 3):
        got = Counter(
            (e["pid"], e["name"])
            for e in measured
            if e["args"]["step"] == step and e["cat"] in {"forward", "backward", "send",
                                                          "receive", "optimizer"}
            and not e["name"].endswith("optimizer")
        )  # fmt: skip
        want = Counter((d, str(x)) for d, instrs in enumerate(program.devices) for x in instrs)
        assert got == want, step
    for e in measured:
        parsed = e["name"][0].isdigit() and not e["name"].endswith("optimizer")
        if parsed and e["cat"] != "step":
            instr = Instr.parse(e["name"])
            assert e["args"]["stage"] == instr.stage
            assert e["args"].get("microbatch") == instr.microbatch
    assert {e["cat"] for e in measured} >= {"step", "data", "loss", "optimizer", "wait"}
    assert all(e["dur"] >= 0 for e in measured)


def test_spans_nest_inside_their_step_and_do_not_overlap_on_a_track(traced):
    """One process runs the devices in turn: on each track, spans follow one another (the
    loss inside its forward, a wait inside its receive)."""
    trace, _ = traced
    measured = [e for e in _events(trace) if e["pid"] < SIMULATED_PID]
    steps = {(e["pid"], e["args"]["step"]): e for e in measured if e["cat"] == "step"}
    for e in measured:
        step = steps[(e["pid"], e["args"]["step"])]
        assert step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + 1e-3
    for (pid, tid), spans in _by_track(measured).items():
        top = [e for e in spans if e["cat"] not in ("loss", "wait", "step")]
        top.sort(key=lambda e: e["ts"])
        for a, b in zip(top, top[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (pid, tid, a["name"], b["name"])


def _by_track(events: list[dict]) -> dict[tuple[int, int], list[dict]]:
    tracks: dict[tuple[int, int], list[dict]] = {}
    for e in events:
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    return tracks


def test_the_simulated_step_sits_beside_the_last_traced_step(compiled, traced):
    trace, _ = traced
    program = read_program(compiled / read_manifest(compiled).program)
    simulated = [e for e in _events(trace) if e["pid"] >= SIMULATED_PID]
    compute = sum(1 for _, _, x in program.instructions() if x.op in (Op.F, Op.B))
    assert len(simulated) == compute  # communication takes no time in the simulator
    assert {e["args"]["step"] for e in simulated} == {3}
    step3 = min(e["ts"] for e in _events(trace) if e["cat"] == "step" and e["args"]["step"] == 3)
    assert min(e["ts"] for e in simulated) == pytest.approx(step3, abs=1e-3)


def test_tracing_changes_no_result(traced):
    _, root = traced
    files = (root / "traced.jsonl", root / "plain.jsonl")
    records = [[json.loads(line) for line in f.read_text().splitlines()] for f in files]
    losses = [[r["loss"] for r in rs if r["kind"] == "train"] for rs in records]
    assert losses[0] == losses[1] and len(losses[0]) == 4


def test_show_measured_adds_up_to_the_step(compiled, traced, capsys):
    trace, _ = traced
    report = measured_report(compiled, trace)
    assert report["steps"] == [2, 3]
    events = _events(trace)
    for row, figures in report["rows"].items():
        assert all(figures[c] >= -1e-6 for c in COLUMNS if c != "other")
        assert sum(figures[c] for c in COLUMNS) == pytest.approx(figures["step"], abs=1e-6)
        mine = [e for e in events if e["pid"] == row and e["args"]["step"] in (2, 3)]
        compute = sum(e["dur"] for e in mine if e["cat"] in ("forward", "backward")) / 2 / 1e3
        assert figures["compute"] == pytest.approx(compute, rel=1e-6)
    assert report["simulated_step_ms"] > 0 and report["measured_over_simulated"] > 0
    assert main(["show", str(compiled), "--measured", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "waiting" in out and "simulated step from the measured stage times" in out


def test_measured_costs_are_each_stages_mean_and_leave_recomputation_to_the_simulator():
    def span(name: str, ms: float, start: int = 0) -> dict:
        x = Instr.parse(name)
        args = {"stage": x.stage, "microbatch": x.microbatch}
        return {"name": name, "start": start, "end": start + int(ms * 1e6), "step": 1, "args": args}

    spans = [span("0F0", 1), span("0F1", 3), span("0B0", 4), span("0B1", 6),
             span("1FC0", 2), span("1B0", 7), span("1F1", 2), span("1B1", 5)]  # fmt: skip
    costs = measured_costs(spans, 2, step=1)
    assert costs is not None
    assert costs.forward == (2e6, 2e6)
    assert costs.backward == (5e6, 5e6)  # stage 1: (7 - 2 recomputed + 5) / 2
    assert measured_costs(spans[:4], 2, step=1) is None  # stage 1 ran no forward


def test_tracing_off_leaves_the_handlers_alone(compiled):
    pipe = Pipeline.load(compiled)
    from pipecompile.runtime.executor import StepData, StepExecutor

    executor = StepExecutor(pipe._stages(), pipe.messaging.backend(), StepData([{}]))
    plain = executor.handlers()
    assert pipe._handlers(executor).keys() == plain.keys()
    pipe.tracer = Tracer(pipe.program.stage_device, steps=1)  # step 0: not a traced step
    assert not pipe.tracer.active
    wrapped = pipe._handlers(executor)
    assert all(wrapped[op].__qualname__ == plain[op].__qualname__ for op in plain)
    with pipe.tracer.step_span(1, [0, 1]):
        assert all(pipe._handlers(executor)[op].__qualname__.endswith("run") for op in plain)
    assert not pipe.tracer.active  # between steps (an evaluation after one): nothing is traced
    assert all(pipe._handlers(executor)[op].__qualname__ == plain[op].__qualname__ for op in plain)


def test_an_evaluation_between_traced_steps_is_not_traced(compiled, tmp_path, capsys):
    """Its forwards ran after the step under the step's number: they made "other" negative."""
    model = tmp_path / "mlp_eval.py"
    hook = "\n\ndef eval_batches():\n    return [(example_inputs(), example_targets())]\n"
    model.write_text(Path(MLP).read_text() + hook)
    trace = tmp_path / "t.json"
    argv = ["run", str(compiled), "--model", str(model), "--steps", "2", "--eval-every", "1"]
    assert main([*argv, "-q", "--trace", str(trace)]) == 0
    measured = [e for e in _events(trace) if e["pid"] < SIMULATED_PID]
    steps = {(e["pid"], e["args"]["step"]): e for e in measured if e["cat"] == "step"}
    for e in measured:
        step = steps[(e["pid"], e["args"]["step"])]
        assert step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + 1e-3
    forwards = Counter(e["args"]["step"] for e in measured if e["cat"] == "forward")
    assert forwards == {1: 2 * 4, 2: 2 * 4}  # the program's: 2 stages x 4 micro-batches
    report = measured_report(compiled, trace)
    assert report["spans_outside_steps"] == 0
    assert all(figures["other"] >= 0 for figures in report["rows"].values())


def test_resumed_runs_trace_their_own_first_steps(compiled, tmp_path):
    ck, trace = tmp_path / "ck", tmp_path / "t.json"
    assert main(["run", str(compiled), "--steps", "2", "--save", str(ck), "-q"]) == 0
    argv = ["run", str(compiled), "--steps", "4", "--resume", str(ck), "-q"]
    assert main([*argv, "--trace", str(trace), "--trace-steps", "1"]) == 0
    assert json.loads(trace.read_text())["otherData"]["traced_steps"] == [3]


def test_a_foreign_file_is_never_replaced_by_a_trace(compiled, tmp_path, capsys):
    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "data"}')
    metrics = tmp_path / "m.jsonl"
    argv = ["run", str(compiled), "--steps", "1", "-q", "--metrics", str(metrics)]
    assert main([*argv, "--trace", str(mine)]) == 2
    err = capsys.readouterr().err
    assert "not a trace pipecompile wrote" in err and str(mine) in err and "Traceback" not in err
    assert mine.read_text() == '{"my": "data"}'
    assert not metrics.exists()  # refused before the first step
    assert main([*argv, "--trace", str(tmp_path)]) == 2  # a directory
    assert "it is a directory" in capsys.readouterr().err


def test_show_measured_refuses_what_is_not_its_trace(compiled, tmp_path, capsys):
    other = tmp_path / "x.json"
    other.write_text("[1, 2]")
    assert main(["show", str(compiled), "--measured", str(other)]) == 2
    assert "is not a trace" in capsys.readouterr().err
    assert main(["show", str(compiled), "--measured", str(tmp_path / "none.json")]) == 2
    assert "cannot read the trace" in capsys.readouterr().err


def test_a_recomputed_forward_shows_its_recomputation_inside_its_backward(tmp_path):
    out, trace = tmp_path / "out", tmp_path / "t.json"
    argv = [MLP, "--stages", "2", "--microbatches", "2", "--recompute", "always", "-q", "-o"]
    assert main([*argv, str(out)]) == 0
    assert main(["run", str(out), "--steps", "1", "-q", "--trace", str(trace)]) == 0
    events = [e for e in _events(trace) if e["pid"] < SIMULATED_PID]
    backwards = {(e["pid"], e["args"]["stage"], e["args"]["microbatch"]): e
                 for e in events if e["cat"] == "backward"}  # fmt: skip
    recomputed = [e for e in events if e["cat"] == "recompute"]
    dropped = [e for e in events if e["name"][1:3] == "FC"]
    assert len(recomputed) == len(dropped) > 0
    for e in recomputed:
        b = next(b for (pid, _, i), b in backwards.items() if pid == e["pid"]
                 and i == e["args"]["microbatch"] and b["ts"] <= e["ts"])  # fmt: skip
        assert e["ts"] + e["dur"] <= b["ts"] + b["dur"] + 1e-3
