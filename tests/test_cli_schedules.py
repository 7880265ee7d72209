"""The command line for schedules: --schedule and its options, show, run --check and --stats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipecompile.model.model_file import load_model_file
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES

MLP = str(EXAMPLES / "mlp.py")
GPT = str(EXAMPLES / "gpt.py")


def compile_mlp(out: Path, *options: str, microbatches: int = 4) -> str:
    args = [MLP, "--stages", "4", "--microbatches", str(microbatches), "-q", "-o", str(out)]
    args += options
    assert main(args) == 0
    return str(out)


@pytest.mark.parametrize(
    "options",
    [
        ["--schedule", "gpipe"],
        ["--schedule", "1f1b"],
        ["--schedule", "zb1p", "--recompute", "always"],
        ["--schedule", "interleaved", "--virtual-stages", "2"],
        ["--schedule", "interleaved", "--virtual-stages", "4"],
        ["--schedule", "pipedream"],
        ["--schedule", "pipedream", "--vertical-sync"],
        ["--schedule", "1f1b", "--memory-budget", "3KiB"],
    ],
    ids=lambda o: "-".join(a.strip("-") for a in o),
)
def test_run_check_passes_for_every_schedule(tmp_path, capsys, options):
    out = compile_mlp(tmp_path / "o", *options)
    assert main(["run", out, "--check", "--lr", "0.1"]) == 0
    text = capsys.readouterr().out
    assert "check passed" in text
    if "pipedream" in options:
        assert "weight-stashed SGD" in text and "weights  max |diff|" in text


def test_weight_versions_come_from_the_program(tmp_path, capsys):
    """Stashing micro-batch 5 on stage 0 before any update (a legal edit) makes its forward
    and backward use older weights: the step's result changes, and --check, whose reference
    follows the program's versions, still passes."""
    out = compile_mlp(tmp_path / "o", "--schedule", "pipedream", microbatches=8)
    text = (Path(out) / "program.txt").read_text()
    edited = text.replace("  0STASH5\n", "").replace("  0STASH0\n", "  0STASH5\n  0STASH0\n")
    assert edited != text
    (tmp_path / "edited.txt").write_text(edited)
    spec = load_model_file(MLP)
    after = []
    for program in (None, tmp_path / "edited.txt"):
        pipe = Pipeline.load(out, program)
        pipe.set_optimizer(lambda ps: torch.optim.SGD(ps, lr=0.5))
        pipe.train_step(spec.inputs, spec.targets, spec.loss_fn)
        after.append(pipe.state_dict())
    changed = max((after[0][k] - after[1][k]).abs().max().item() for k in after[0])
    assert changed > 1e-6  # float noise is ~1e-8; the edit moves weights by ~5e-5
    assert (
        main(["run", out, "--check", "--lr", "0.5", "--program", str(tmp_path / "edited.txt")]) == 0
    )
    assert "check passed" in capsys.readouterr().out


def test_show_prints_figures_and_timetable(tmp_path, capsys):
    out = compile_mlp(tmp_path / "o", "--schedule", "1f1b")
    capsys.readouterr()
    assert main(["show", out, "--uniform"]) == 0
    text = capsys.readouterr().out
    assert "bubble fraction 0.4286" in text and "closed form with uniform costs 0.4286" in text
    assert "device 0 F0  F1  F2  F3" in text
    assert main(["show", out, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["peak_inflight"] == [4, 3, 2, 1]
    assert {"makespan", "bubble_fraction", "peak_inflight", "peak_activation_bytes"} <= set(report)
    assert report["makespan"] > 0 and 0 < report["bubble_fraction"] < 1


def test_show_json_uniform_matches_closed_form(tmp_path, capsys):
    out = compile_mlp(tmp_path / "o", "--schedule", "interleaved")
    capsys.readouterr()
    assert main(["show", out, "--json", "--uniform"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["devices"] == 2
    assert report["bubble_fraction"] == pytest.approx(1 / 9)  # (p-1)/(v m + p-1), p=2 v=2 m=4


def test_run_stats_prints_measured_next_to_predicted(tmp_path, capsys):
    out = compile_mlp(tmp_path / "o", "--schedule", "1f1b", "--recompute", "except_last")
    assert main(["run", out, "--stats", "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    split = next(k for k, ln in enumerate(lines) if ln.startswith("stage"))
    rows, times = lines[1:split], lines[split + 1 :]
    assert [r.split()[1] for r in rows] == ["4", "3", "2", "1"]
    for row in rows:
        cells = row.split()
        assert cells[1] == cells[3]  # in-flight measured == predicted
        assert cells[4:6] == cells[7:9]  # bytes measured == predicted
    # per stage: measured compute time per micro-batch next to the balancer's prediction
    assert [t.split()[0] for t in times] == ["0", "1", "2", "3"]
    for t in times:
        cells = t.split()
        assert float(cells[1]) > 0 and cells[2] == "us" and cells[5] == "us"


@pytest.mark.parametrize(
    "args, message",
    [
        ([GPT, "--stages", "4", "--schedule", "pipedream"], "tied to another stage"),
        ([MLP, "--stages", "6", "--microbatches", "4", "--schedule", "interleaved"],
         "--microbatches 4 is not a multiple of the 3 devices"),
        ([MLP, "--stages", "4", "--vertical-sync"], "--vertical-sync applies to the pipedream"),
        ([MLP, "--stages", "4", "--microbatches", "4", "--memory-budget", "10B"],
         "even with every forward recomputed"),
    ],
)  # fmt: skip
def test_bad_schedule_requests_exit_2_with_a_message(tmp_path, capsys, args, message):
    assert main([*args, "-q", "-o", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_memory_budget_must_be_a_size(tmp_path, capsys):
    assert main([MLP, "--stages", "2", "--memory-budget", "lots", "-o", str(tmp_path / "o")]) == 2
    assert "cannot read 'lots' as a size" in capsys.readouterr().err


def test_stages_sharing_a_device_exchange_values_directly(tmp_path):
    out = compile_mlp(tmp_path / "o", "--schedule", "interleaved", "--virtual-stages", "4")
    program = (Path(out) / "program.txt").read_text()
    assert "# stage -> device: 0 0 0 0" in program
    assert "SEND" not in program and "RECV" not in program


def test_compile_summary_predicts_the_schedule(tmp_path, capsys):
    args = [MLP, "--stages", "4", "--microbatches", "4", "--schedule", "1f1b"]
    assert main([*args, "--recompute", "always", "-o", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "peak in-flight micro-batches per device [4, 3, 2, 1]" in out
    assert "16 recomputed forwards" in out


def test_tied_stages_on_one_device_do_not_wait_for_each_other(tmp_path, capsys):
    out = str(tmp_path / "o")
    args = [GPT, "--stages", "4", "--microbatches", "4", "--schedule", "interleaved"]
    assert main([*args, "--virtual-stages", "4", "-q", "-o", out]) == 0
    program = (Path(out) / "program.txt").read_text().split()
    first_step = program.index("0STEP")
    assert program[first_step - 2 : first_step] == ["0ALLREDUCE_TIED", "3ALLREDUCE_TIED"]
    assert main(["run", out, "--check"]) == 0
    assert "check passed" in capsys.readouterr().out


def test_pipedream_check_with_batchnorm_leaves_the_pipeline_untouched(tmp_path, capsys):
    out = str(tmp_path / "o")
    args = [str(EXAMPLES / "resnet.py"), "--stages", "3", "--microbatches", "4"]
    assert main([*args, "--schedule", "pipedream", "-q", "-o", out]) == 0
    assert main(["run", out, "--check", "--lr", "0.05"]) == 0
    assert "check passed" in capsys.readouterr().out


def test_show_reports_the_balance(tmp_path, capsys):
    out = str(tmp_path / "o")
    args = [GPT, "--stages", "4", "--microbatches", "4", "--split-at", "h.1", "-q", "-o", out]
    assert main(args) == 0
    manifest = json.loads((Path(out) / "manifest.json").read_text())
    balance = manifest["balance"]
    assert balance["cost"] == "flops" and len(balance["stage_costs"]) == 4
    assert balance["bottleneck"] == max(balance["stage_costs"])
    assert balance["stage_balanced"] == [s["flops"] for s in manifest["stages"]]
    # a stage's predicted time is its compute (3 x forward FLOPs at 1 TFLOP/s) plus traffic
    for t, c, m, f in zip(balance["stage_costs"], balance["stage_compute"],
                          balance["stage_comm"], balance["stage_balanced"]):  # fmt: skip
        assert t == pytest.approx(c + m, abs=0.01) and c == pytest.approx(3 * f / 1000, abs=0.01)
    assert balance["lower_bound"] <= balance["unconstrained_optimum"] <= balance["bottleneck"]
    assert sum(balance["stage_ops"]) > 0
    capsys.readouterr()
    assert main(["show", out]) == 0
    text = capsys.readouterr().out
    assert "balance on flops, links at 10.00GB/s: bottleneck" in text
    assert "without the 1 requested boundaries" in text
    assert main(["show", out, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["stage_table"]
    assert [r["sent_bytes"] > 0 for r in rows] == [True, True, True, False]
    assert all(r["memory_bytes"] > 4 * r["param_bytes"] for r in rows)
