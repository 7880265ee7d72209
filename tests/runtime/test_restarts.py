"""`run --nproc N --save DIR --max-restarts K`: runs that lose ranks (killed, raising, hung,
failing inside a save) restart from their newest complete step and end bit-identical to the run
that never failed; background saves; the refusals, one line each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipecompile.files.held import holding
from pipecompile.runtime.training.model_keyed import read_model_keyed
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES

# A GPT with dropout, fed 3 different batches an epoch by its own hook: a continued run must
# restore the dropout streams, the data position across epochs, AdamW and the step.
MODEL = f"""
import sys
sys.path.insert(0, {str(EXAMPLES)!r})
import torch
from gpt import build_gpt, example_targets, loss_fn


def build_model():
    return build_gpt(dropout=0.1)


def example_inputs():
    return (torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0)),)


def train_batches():
    g = torch.Generator().manual_seed(7)
    for _ in range(3):
        tokens = torch.randint(0, 64, (4, 17), generator=g)
        yield (tokens[:, :-1],), (tokens[:, 1:],)
"""


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("restarts")
    (root / "model.py").write_text(MODEL)
    target = root / "out"
    assert main([str(root / "model.py"), "--stages", "2", "--microbatches", "2", "-q",
                 "-o", str(target)]) == 0  # fmt: skip
    return target


def _train(out: Path, save: Path, *extra: str) -> int:
    return main(["run", str(out), "--nproc", "2", "--steps", "8", "--save", str(save),
                 "--save-every", "2", "--seed", "5", "-q", "--timeout", "3", *extra])  # fmt: skip


def _tensors(step_dir: Path) -> dict[str, torch.Tensor]:
    def flat(tree: dict, prefix: str = "") -> dict:
        out = {}
        for key, value in tree.items():
            out.update(
                flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value}
            )
        return out

    return {
        k: v for k, v in flat(read_model_keyed(step_dir)).items() if isinstance(v, torch.Tensor)
    }


def _restarts(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "restart"]


def test_a_run_that_loses_ranks_ends_bit_identical_to_one_that_did_not(
    out, tmp_path, capfd, monkeypatch
):
    """Four faults (a kill, an error, a hang, a failure inside a background save) at chosen
    ranks and steps: the run restarts four times and its final weights and optimizer state
    equal the uninterrupted run's bit for bit."""
    assert _train(out, tmp_path / "clean") == 0
    capfd.readouterr()
    # a background save's failure is raised at the next save (the fourth attempt fails at its
    # end), and a save in flight when a rank fails is never published (the third resumes from 2)
    faults = "1:2:1B0:kill,1:3:1F1:hang,0:5:0F0:raise,0:6:save:raise"
    monkeypatch.setenv("PIPECOMPILE_FAULT", faults)
    assert _train(out, tmp_path / "faulted", "--max-restarts", "4", "--async-save") == 0
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if "restart" in ln]
    assert len(lines) == 4 and all(ln.startswith("pipecompile: restart ") for ln in lines), err
    assert "restart 1 of 4: rank 1 failed in step 2 (killed at instruction 1B0); resuming " \
        "from the start (no step saved yet)" in err  # fmt: skip
    records = _restarts(out)[-4:]
    assert [(r["rank"], r["resumed_from"]) for r in records] == [(1, 0), (None, 2), (0, 2), (0, 4)]
    assert "no progress" in records[1]["reason"]
    assert "injected failure while saving step 6" in records[3]["reason"]
    assert (tmp_path / "faulted" / "latest").read_text().strip() == "step_8"
    clean, faulted = (
        _tensors(tmp_path / "clean" / "step_8"),
        _tensors(tmp_path / "faulted" / "step_8"),
    )
    assert clean.keys() == faulted.keys() and len(clean) > 20
    assert [k for k in clean if not torch.equal(clean[k], faulted[k])] == []


def test_a_failure_that_repeats_stops_after_k_restarts_naming_it(out, tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("PIPECOMPILE_FAULT", "1:*:1B1:raise")  # every step, every time
    assert _train(out, tmp_path / "ck", "--max-restarts", "1") == 2
    err = capfd.readouterr().err
    assert "pipecompile: restart 1 of 1: rank 1 failed in step 1" in err, err
    assert "stopped after 1 restart(s) (--max-restarts 1): rank 1 failed in step 1 (" in err, err
    assert err.rstrip().endswith("instruction 1B1: RuntimeError: injected failure at 1B1)"), err


def test_a_failed_background_save_leaves_latest_on_the_last_complete_step(
    out, tmp_path, capfd, monkeypatch
):
    monkeypatch.setenv("PIPECOMPILE_FAULT", "0:4:save:disk")
    save = tmp_path / "ck"
    assert main(["run", str(out), "--steps", "6", "--save", str(save), "--save-every", "2",
                 "--async-save", "-q"]) == 2  # fmt: skip
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "disk is full" in err and "step_2" in err, err
    assert (save / "latest").read_text().strip() == "step_2"
    assert sorted(p.name for p in save.iterdir() if not p.name.startswith(".pipecompile")) == [
        "latest",
        "step_2",
    ]


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--nproc", "2", "--max-restarts", "2"], None, "--max-restarts 2 needs --save DIR"),
        (["--async-save"], None, "--async-save writes the saves of --save DIR"),
        (["--nproc", "2", "--save", "ck"], "1:x:1B0:kill", "RANK and STEP are whole numbers"),
        (["--nproc", "2", "--save", "ck"], "1:2:1B0:explode", "KIND one of kill, raise, hang"),
        (["--save", "held", "--steps", "1"], None, "--save held is in use by another run (pid"),
    ],
)
def test_refusals_are_one_line(out, tmp_path, capfd, monkeypatch, argv, env, message):
    monkeypatch.chdir(tmp_path)
    if env:
        monkeypatch.setenv("PIPECOMPILE_FAULT", env)
    with holding(tmp_path / "held"):
        assert main(["run", str(out), *argv]) == 2
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_the_failure_named_is_the_first_cause():
    """A rank's own error or injected kill comes before what the stopped ranks blame; a rank
    that left no status is named with what the others saw of it."""
    from pipecompile.runtime.distributed.restarts import failure_of

    stopped = {
        "rank": 0,
        "status": 3,
        "step": 4,
        "reason": "rank 1 died (pid 7) at instruction 1B0",
    }
    own = {"rank": 1, "status": 2, "step": 4, "reason": "RuntimeError: boom"}
    assert str(failure_of([stopped, own], 2)) == "rank 1 failed in step 5 (RuntimeError: boom)"
    assert (
        str(failure_of([stopped], 2)) == "rank 1 failed in step 5 (died (pid 7) at instruction 1B0)"
    )
    hung = {**stopped, "reason": "no progress for 3 s; rank 0 at 0F1"}
    assert str(failure_of([hung, {**hung, "rank": 1}], 2)) == (
        "a rank failed in step 5 (no progress for 3 s; rank 0 at 0F1)"
    )
