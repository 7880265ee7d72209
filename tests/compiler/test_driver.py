"""The driver runs its table of passes once each, checks the IR after each, and times them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import pipecompile
from pipecompile.compiler import driver
from pipecompile.compiler.driver import PASSES, TABLE, compile_model
from pipecompile.errors import InternalError, ProgramError
from pipecompile.ir.programs.instr import Instr
from pipecompile.ir.programs.program import Program


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _compile(**options):
    return compile_model(_model(), {"input": torch.randn(4, 4)}, stages=2, microbatches=2,
                         **options)  # fmt: skip


def _with_entry(name: str, **changes) -> tuple[driver.Pass, ...]:
    return tuple(dataclasses.replace(p, **changes) if p.name == name else p for p in TABLE)


def test_the_table_names_every_pass_once_in_order():
    assert PASSES == tuple(p.name for p in TABLE)
    assert len(set(PASSES)) == len(PASSES)
    assert PASSES.count("insert_recompute") == 1


@pytest.mark.parametrize("budget", [None, 10**6])
def test_each_pass_runs_once(monkeypatch, budget):
    calls: list[str] = []

    def counted(entry: driver.Pass) -> driver.Pass:
        def run(request, ir):
            calls.append(entry.name)
            return entry.run(request, ir)

        return dataclasses.replace(entry, run=run)

    monkeypatch.setattr(driver, "TABLE", tuple(counted(p) for p in TABLE))
    _compile(memory_budget=budget, recompute="except_last")
    assert calls == [p for p in PASSES if p != "profile_costs"]  # --balance time only


def test_every_pass_that_ran_is_timed_in_order():
    compiled = _compile()
    names = [name for name, _ in compiled.timings]
    assert names == [p for p in PASSES if p != "profile_costs"]
    assert all(seconds >= 0 for _, seconds in compiled.timings)


def _wrong_device(request, ir):
    program = TABLE[PASSES.index("insert_communication")].run(request, ir)
    moved = (program.devices[0] + (Instr("F", 1, 0),), *program.devices[1:])
    return dataclasses.replace(program, devices=moved)


def test_a_bad_ir_is_reported_naming_the_pass_after_which_it_went_bad(monkeypatch):
    monkeypatch.setattr(driver, "TABLE", _with_entry("insert_communication", run=_wrong_device))
    with pytest.raises(InternalError, match=r"pass insert_communication produced a bad IR"):
        _compile()


def test_a_bad_graph_is_reported_naming_its_pass(monkeypatch):
    def unstaged(request, ir):
        module, report = TABLE[PASSES.index("balance_stages")].run(request, ir)
        return module, dataclasses.replace(report, stage_ops=(1, 1))

    monkeypatch.setattr(driver, "TABLE", _with_entry("balance_stages", run=unstaged))
    with pytest.raises(InternalError, match=r"pass balance_stages produced a bad IR.*ops per"):
        _compile()


def _dropped_backward(request, ir) -> Program:
    program = TABLE[PASSES.index("schedule")].run(request, ir)
    kept = tuple(x for x in program.devices[0] if x != Instr("B", 0, 1))
    return dataclasses.replace(program, devices=(kept, *program.devices[1:]))


def test_verify_each_runs_the_expensive_checks_after_every_pass(monkeypatch):
    compiled = _compile(verify_each=True)
    names = [name for name, _ in compiled.timings]
    checked = [p.name for p in TABLE if p.verify is not None and p.name != "profile_costs"]
    assert [n for n in names if n.startswith("verify ")] == [f"verify {p}" for p in checked]
    # a schedule missing a backward passes the cheap check; only the expensive one sees it
    # right away (otherwise the final check reports it, naming the last pass)
    monkeypatch.setattr(driver, "TABLE", _with_entry("schedule", run=_dropped_backward))
    with pytest.raises(ProgramError, match="0B1 appears 0 times") as caught:
        _compile(verify_each=True)
    assert "(found by the check after pass schedule)" in caught.value.__notes__
    with pytest.raises(ProgramError) as caught:
        _compile()
    assert "(found by the check after pass insert_replication)" in caught.value.__notes__


def test_verify_each_gives_the_same_program():
    assert str(_compile(verify_each=True).program) == str(_compile().program)


def test_the_api_takes_verify_each(tmp_path):
    pipe = pipecompile.compile(_model(), torch.randn(4, 4), stages=2, microbatches=2,
                               directory=tmp_path / "out", verify_each=True)  # fmt: skip
    assert pipe(torch.randn(4, 4)).shape == (4, 2)


def test_progress_prints_one_line_per_timing(capsys):
    compiled = _compile(progress=True, verify_each=True)
    lines = capsys.readouterr().err.splitlines()
    assert [line.rsplit(maxsplit=2)[0].strip() for line in lines] == [
        name for name, _ in compiled.timings
    ]


def test_the_command_line_takes_verify_each(tmp_path, capsys):
    from pipecompile.surfaces.cli import main

    model = tmp_path / "model.py"
    model.write_text(
        "import torch\n"
        "def build_model():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())\n"
        "def example_inputs():\n"
        "    return (torch.randn(4, 4),)\n"
    )
    args = [str(model), "--stages", "2", "--microbatches", "2", "-o", str(tmp_path / "o")]
    assert main([*args, "--verify-each"]) == 0
    assert "  verify insert_replication" in capsys.readouterr().err


class _WithScalar(torch.nn.Module):
    """An output and a loss over the whole batch beside it (a VQ model's commitment)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.a(x)
        return self.b(z), z.pow(2).mean()


def test_a_scalar_output_over_the_whole_batch_is_computed_on_the_whole_batch():
    """A loss over the batch beside the output (a VQ model's commitment) is a tail: cut off,
    computed once on both micro-batches' values joined, it equals the model's; on a meta
    model (not run, so not analysed) it is refused where the batch splits."""
    from pipecompile.errors import MicrobatchError

    model, inputs = _WithScalar(), {"x": torch.randn(8, 8)}
    pipe = pipecompile.compile(model, inputs, stages=2, microbatches=2)
    assert pipe.manifest.tail is not None
    got, want = pipe.pipeline(inputs), model(**inputs)
    torch.testing.assert_close(got[1], want[1])
    torch.testing.assert_close(got[0], want[0])
    with torch.device("meta"):
        meta = _WithScalar()
    with pytest.raises(
        MicrobatchError, match=r"output 1, mean .* is a scalar over the whole batch"
    ):
        compile_model(meta, inputs, stages=2, microbatches=2)
