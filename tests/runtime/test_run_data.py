"""`pipecompile run` on a model file's own data: train_batches()/eval_batches(), epochs,
metrics.jsonl and `plot`, resuming mid-schedule, which ranks read data, and bad hooks."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pipecompile.runtime.load import read_manifest, read_program
from pipecompile.runtime.timeline_file import SIMULATED_PID
from pipecompile.surfaces.cli import main
from tests.conftest import write_model_file

MODEL = """
import os
from pathlib import Path
import torch
import torch.nn.functional as F
from torch import nn

MARKS = os.environ.get("DATA_MARKS")


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 8), nn.Dropout(0.2), nn.Tanh(),
                         nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 16))


def _batch(k, rows=8):
    g = torch.Generator().manual_seed(k)
    ids = torch.randint(0, 16, (rows, 5), generator=g)
    return (ids,), torch.randint(0, 16, (rows, 5), generator=g)


class Batches:
    def __init__(self, count, first):
        self.count, self.first = count, first

    def __len__(self):
        return self.count

    def __iter__(self):
        if MARKS:
            Path(MARKS, f"rank{os.environ.get('RANK', 'local')}").touch()
        BREAK
        last = self.count - 1  # a last partial batch: the batch varies without a flag
        return iter([_batch(self.first + k, 4 if k == last else 8) for k in range(self.count)])


def train_batches():
    return Batches(3, 0)


def eval_batches():
    return Batches(2, 100)


def example_inputs():
    return _batch(0)[0]


def example_targets():
    return (_batch(0)[1],)


def loss_fn(out, target):
    return F.cross_entropy(out.reshape(-1, 16), target.reshape(-1))
"""


def _compiled(tmp_path: Path, breaking: str = "pass", stages: int = 2) -> Path:
    path = write_model_file(tmp_path, MODEL.replace("BREAK", breaking), "data_model.py")
    out = tmp_path / "out"
    argv = [str(path), "--stages", str(stages), "--microbatches", "2", "-q", "-o", str(out)]
    assert main(argv) == 0
    return out


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_epochs_eval_metrics_and_plot(tmp_path, capsys):
    out = _compiled(tmp_path)
    assert main(["run", str(out), "--epochs", "2", "--seed", "1"]) == 0
    stdout, err = capsys.readouterr()
    assert "training on train_batches() of data_model.py, 3 batches an epoch" in err
    assert "step 6/6" in stdout and "eval after step 3" in stdout, stdout
    records = _records(out / "metrics.jsonl")
    assert [r["kind"] for r in records] == ["start", *["train"] * 3, "eval", *["train"] * 3,
                                            "eval"]  # fmt: skip
    train = [r for r in records if r["kind"] == "train"]
    assert [r["epoch"] for r in train] == [1, 1, 1, 2, 2, 2]
    assert train[0]["samples_per_s"] > 0 and train[0]["tokens_per_s"] > 0
    assert 0 <= train[0]["bubble"] < 1 and len(train[0]["peak_memory"]) == 2
    assert main(["plot", str(out)]) == 0
    assert (out / "training.svg").read_text().startswith("<?xml")


def test_resuming_mid_schedule_ends_where_one_run_ends(tmp_path, capsys):
    out = _compiled(tmp_path)
    ck = tmp_path / "ck"
    common = ["--steps", "4", "--seed", "2", "--lr-schedule", "cosine", "--warmup-steps", "1",
              "--lr", "0.05", "--epochs", "2"]  # fmt: skip
    assert main(["run", str(out), *common, "--save", str(ck), "--save-every", "2",
                 "--metrics", str(tmp_path / "one.jsonl")]) == 0  # fmt: skip
    (ck / "latest").write_text("step_2\n")  # as if the run had stopped after step 2's save
    assert main(["run", str(out), *common, "--resume", str(ck),
                 "--metrics", str(tmp_path / "two.jsonl")]) == 0  # fmt: skip
    one = [r for r in _records(tmp_path / "one.jsonl") if r["kind"] == "train"]
    two = [r for r in _records(tmp_path / "two.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in two] == [3, 4] and [r["epoch"] for r in two] == [1, 2]
    assert [r["lr"] for r in two] == pytest.approx([r["lr"] for r in one[2:]], rel=1e-12)
    assert [r["loss"] for r in two] == [r["loss"] for r in one[2:]]  # bit for bit


@pytest.mark.parametrize(("breaking", "message"), [
    ("raise ValueError('disk gone')", "train_batches() raised at batch 0: ValueError: disk gone"),
    ("return iter([(1, 2, 3)])", "train_batches() batch 0 is a tuple of 3; each batch must be"),
    ("return iter([((torch.zeros(4, 5, dtype=torch.long),), 'x')])",
     "train_batches() batch 0 has targets of type str"),
])  # fmt: skip
def test_a_bad_hook_is_one_line(tmp_path, capsys, breaking, message):
    out = _compiled(tmp_path, breaking=breaking)
    assert main(["run", str(out), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


_ONE_SHOT = (
    "if self.count == 3 and getattr(Batches, 'used', False): return iter([])\n"
    "        Batches.used = getattr(Batches, 'used', False) or self.count == 3"
)


@pytest.mark.parametrize(("breaking", "message"), [
    ("if self.count == 3: return iter([])",
     "train_batches() of data_model.py yielded no batches; it must give at least one"),
    ("if self.count == 3: return iter([_batch(k) for k in range(5)])",
     "train_batches() of data_model.py yielded 5 batches in epoch 1 but its len() is 3"),
    ("if self.count == 3: return iter([_batch(k) for k in range(2)])",
     "train_batches() of data_model.py yielded 2 batches in epoch 1 but its len() is 3"),
    (_ONE_SHOT, "train_batches() of data_model.py yielded no batches in epoch 2 (epoch 1 gave 3)"
     ": the iterable was used up by the first pass; make train_batches() return a fresh"),
    ("if self.count == 3: return iter([_batch(0), ((torch.full((4, 5), 99),), _batch(1)[1])])",
     "train_batches() of data_model.py, batch 1 (step 2): input 'input' holds ids 99..99: "
     "beyond embedding '0' (16 rows: ids 0..15)"),
    ("if self.count == 3: return iter([_batch(0), (_batch(1)[0], torch.zeros(6, 5).long())])",
     "train_batches() of data_model.py, batch 1 (step 2): device 1, instruction 1F0: target 0 "
     "has shape (6, 5)"),
    ("if self.count == 2: return iter([(_batch(0)[0], torch.zeros(4, 6).long())])",
     "eval_batches() of data_model.py, batch 0 (checked before training): "),
])  # fmt: skip
def test_data_that_breaks_its_promise_stops_the_run_naming_it(tmp_path, capsys, breaking,
                                                               message):  # fmt: skip
    out = _compiled(tmp_path, breaking=breaking)
    assert main(["run", str(out), "-q", "--steps", "8"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    if "eval_batches" in message or "no batches;" in message:  # found before training
        assert not (out / "metrics.jsonl").exists()


def test_a_used_up_hook_under_nproc_stops_every_rank(tmp_path, capfd):
    out = _compiled(tmp_path, breaking=_ONE_SHOT)
    assert main(["run", str(out), "-q", "--steps", "8", "--nproc", "2"]) == 2
    err = capfd.readouterr().err
    assert err.count("yielded no batches in epoch 2 (epoch 1 gave 3)") == 2, err


@pytest.mark.parametrize(("argv", "message"), [
    (["--precision", "fp16"], "--precision fp16 needs a GPU"),
    (["--clip-grad-norm", "-1"], "--clip-grad-norm -1: the norm must be above 0"),
    (["--lr-schedule", "cosin"], "invalid choice: 'cosin'"),
    (["--accumulate", "0"], "'0' is not a whole number of at least 1"),
])  # fmt: skip
def test_bad_training_options(tmp_path, capsys, argv, message):
    out = _compiled(tmp_path)
    assert main(["run", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_nproc_agrees_with_local_under_every_training_option(tmp_path, capsys, monkeypatch):
    """Accumulation, clipping (a norm summed over ranks), bf16 traffic over gloo, a schedule;
    and of 3 ranks only the first and the last stage's read the data. The last training and
    evaluation batches have half the rows: compiled without a flag, the batch varies."""
    out = _compiled(tmp_path, stages=3)
    flags = ["--steps", "3", "--seed", "3", "--accumulate", "2", "--clip-grad-norm", "0.05",
             "--precision", "bf16", "--lr-schedule", "linear", "--warmup-steps", "1"]  # fmt: skip
    assert main(["run", str(out), *flags, "--metrics", str(tmp_path / "local.jsonl")]) == 0
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("DATA_MARKS", str(marks))
    trace = tmp_path / "trace.json"
    assert main(["run", str(out), *flags, "--metrics", str(tmp_path / "nproc.jsonl"),
                 "--nproc", "3", "--trace", str(trace), "--trace-steps", "2",
                 "--threads", "2"]) == 0  # fmt: skip
    assert sorted(p.name for p in marks.iterdir()) == ["rank0", "rank2"]
    _check_distributed_trace(trace, out, accumulate=2)
    local, dist = (_records(tmp_path / f"{n}.jsonl")[1:] for n in ("local", "nproc"))
    assert [r["kind"] for r in dist] == [r["kind"] for r in local] == [*["train"] * 3, "eval"]
    assert [r["loss"] for r in dist] == pytest.approx([r["loss"] for r in local], rel=1e-6)
    for key in ("grad_norm", "lr", "sent_bytes"):
        got, want = ([r[key] for r in rs[:3]] for rs in (dist, local))
        assert got == pytest.approx(want, rel=1e-6), key
    assert all(r["grad_norm"] > 0.05 for r in local[:3])  # clipping acted


def _check_distributed_trace(trace: Path, out: Path, accumulate: int) -> None:
    """One row per rank holding its own device's instructions (once per mini-batch of each
    traced step); the ranks that receive waited in their receives."""
    program = read_program(out / read_manifest(out).program)
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    measured = [e for e in events if e["pid"] < SIMULATED_PID]
    assert {e["pid"] for e in measured} == {0, 1, 2}
    every = json.loads(trace.read_text())["traceEvents"]
    rows = [e for e in every if e["ph"] == "M" and e["name"] == "process_name"]
    names = [e["args"]["name"] for e in rows if e["pid"] < SIMULATED_PID]
    assert sorted(names) == [f"rank {r}, device {r} (2 threads)" for r in range(3)]
    for step in (1, 2):
        for d, instrs in enumerate(program.devices):
            got = Counter(
                e["name"] for e in measured
                if e["pid"] == d and e["args"]["step"] == step and e["name"][0].isdigit()
                and not e["name"].endswith("optimizer")
            )  # fmt: skip
            assert got == Counter({str(x): accumulate for x in instrs}), (step, d)
    waits = {e["pid"] for e in measured if e["name"] == "wait"}
    assert waits == {0, 1, 2}  # forwards arrive at 1 and 2, gradients at 0 and 1
    assert {e["pid"] for e in events if e["pid"] >= SIMULATED_PID} == {
        SIMULATED_PID + d for d in range(3)
    }
