"""`run --nproc N --dp D`: data-parallel copies of the pipeline on a (dp, pp) mesh, sharding
over them (ZeRO-1, and FSDP2's ZeRO-2 and ZeRO-3), and train states keyed by the model's
names that resume into another split at another scale.

One chain of runs of a small language model (dropout, a tied embedding, a train_batches()
hook of 31 batches that differ) serves every claim, against one local reference with
``--accumulate 2`` over the whole epoch:
2 stages x dp 2 from scratch (same seed, same losses; traced, for ``show --measured``), saved,
resumed by 4 stages in one process (another split, dp 1), saved, resumed by 2 stages x dp 2
with the optimizer sharded; and the 4-stage state resumed under FSDP2 (``--shard grads``) by 4
interleaved stages on 2 devices x dp 2 (two FSDP stages a rank, one without weights) to the end
of the data, whose last round leaves copy 1 without a batch. ``--shard params`` resumes the
ZeRO-1 state in a sampled-out test of its own.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from pipecompile.reports.measured import COLUMNS, measured_report
from pipecompile.runtime.training.model_keyed import read_model_keyed
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES, SAMPLED_OUT, write_model_file
from tests.conftest import TINY_LM as SHARED_LM

TINY_LM = (
    SHARED_LM.format(dropout=0.1)
    + """

def _batch(seed):
    ids = torch.randint(0, VOCAB, (4, TOKENS + 1), generator=torch.Generator().manual_seed(seed))
    return ids[:, :-1], ids[:, 1:]


def example_inputs():
    return (_batch(0)[0],)


def example_targets():
    return (_batch(0)[1],)


def train_batches():
    return [_batch(seed) for seed in range(1, 32)]

"""
)
COMMON = ["-q", "--seed", "0", "--lr", "0.003"]


def losses(path: Path) -> dict[int, float]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def last_step(path: Path) -> dict:
    return [r for r in records(path) if r["kind"] == "train"][-1]


@pytest.fixture(scope="module")
def chain(tmp_path_factory):  # type: ignore[no-untyped-def]
    """The runs, once: their directories and metrics files."""
    root = tmp_path_factory.mktemp("mesh")
    model = str(write_model_file(root, TINY_LM, "tiny_lm.py"))
    for stages in ("2", "4"):
        assert main([model, "--stages", stages, "--microbatches", "2", "--schedule", "1f1b",
                     "-q", "-o", str(root / f"c{stages}")]) == 0  # fmt: skip
    assert main([model, "--stages", "4", "--devices", "2", "--microbatches", "2", "--schedule",
                 "interleaved", "-q", "-o", str(root / "ci")]) == 0  # fmt: skip
    c2, c4, ci = str(root / "c2"), str(root / "c4"), str(root / "ci")

    def run(name: str, directory: str, *argv: str) -> Path:
        metrics = root / f"{name}.jsonl"
        assert main(["run", directory, *COMMON, "--metrics", str(metrics), *argv]) == 0
        return metrics

    made = {
        "reference": run("reference", c4, "--epochs", "1", "--accumulate", "2"),
        "dp": run("dp", c2, "--nproc", "4", "--dp", "2", "--steps", "2", "--save",
                  str(root / "ck_dp"), "--trace", str(root / "dp_trace.json")),
        "back": run("back", c4, "--steps", "4", "--accumulate", "2", "--resume",
                    str(root / "ck_dp"), "--save", str(root / "ck_back")),
        "sharded": run("sharded", c2, "--nproc", "4", "--dp", "2", "--shard", "optimizer",
                       "--steps", "5", "--resume", str(root / "ck_back"), "--save",
                       str(root / "ck_sharded")),
        "grads": run("grads", ci, "--nproc", "4", "--dp", "2", "--shard", "grads", "--epochs",
                     "1", "--resume", str(root / "ck_back"), "--save", str(root / "ck_grads")),
    }  # fmt: skip
    made["run"] = run  # type: ignore[assignment]  # for a test's run of its own
    return root, made, model


def test_dp_gives_the_losses_of_one_pipeline_accumulating(chain):
    _, made, _ = chain
    reference, dp = losses(made["reference"]), losses(made["dp"])
    assert list(dp) == [1, 2]
    for step, loss in dp.items():
        assert loss == pytest.approx(reference[step], rel=1e-6, abs=0)
    start = records(made["dp"])[0]
    assert start["data_parallel"] == 2 and start["accumulate"] == 1


def test_show_measured_of_a_dp_trace_gives_every_copys_ranks_their_prediction(chain, capsys):
    root, _, _ = chain
    report = measured_report(root / "c2", root / "dp_trace.json")
    assert report["row_devices"] == {0: 0, 1: 1, 2: 0, 3: 1}  # copy 1: ranks 2 and 3
    assert report["steps"] == [2] and report["spans_outside_steps"] == 0
    for figures in report["rows"].values():
        assert all(figures[c] >= 0 for c in COLUMNS)
        assert sum(figures[c] for c in COLUMNS) == pytest.approx(figures["step"])
    assert main(["show", str(root / "c2"), "--measured", str(root / "dp_trace.json")]) == 0
    rows = capsys.readouterr().out.splitlines()[3:7]
    predicted = [f"{report['predicted_bubble'][d]:.1%}" for d in (0, 1, 0, 1)]
    assert [row.split()[-1] for row in rows] == predicted


def test_a_train_state_resumes_at_another_scale_and_back(chain):
    _, made, _ = chain
    reference = losses(made["reference"])
    back, sharded = losses(made["back"]), losses(made["sharded"])
    assert list(back) == [3, 4] and list(sharded) == [5]
    for step, loss in {**back, **sharded}.items():
        assert loss == pytest.approx(reference[step], rel=1e-6, abs=0), step


def test_fsdp_copies_give_the_losses_of_one_pipeline_to_the_end_of_the_data(chain):
    _, made, _ = chain
    reference = losses(made["reference"])
    grads = losses(made["grads"])
    assert list(reference) == list(range(1, 17))  # 31 batches: the last step has one
    assert list(grads) == list(range(5, 17))
    for step, loss in grads.items():
        assert loss == pytest.approx(reference[step], rel=1e-6, abs=0), step
    assert last_step(made["grads"])["samples_per_s"] > 0


@SAMPLED_OUT  # the grads run covers FSDP on the mesh; params only gathers more often
def test_zero3_resumes_a_zero1_state_with_the_same_losses(chain):
    root, made, _ = chain
    params = losses(made["run"]("params", str(root / "c2"), "--nproc", "4", "--dp", "2",
                                "--shard", "params", "--steps", "7", "--resume",
                                str(root / "ck_sharded")))  # fmt: skip
    reference = losses(made["reference"])
    assert list(params) == [6, 7]
    for step, loss in params.items():
        assert loss == pytest.approx(reference[step], rel=1e-6, abs=0), step


def test_sharded_optimizer_state_is_split_over_the_copies(chain):
    _, made, _ = chain
    unsharded = last_step(made["dp"])["optimizer_state_bytes"]
    sharded = last_step(made["sharded"])["optimizer_state_bytes"]
    assert len(unsharded) == len(sharded) == 4
    assert unsharded[0] == unsharded[2] and unsharded[1] == unsharded[3]  # copies hold the same
    for rank in range(2):  # each copy's half of each stage's state (parameters split whole)
        pair = sharded[rank] + sharded[rank + 2]
        assert pair == pytest.approx(unsharded[rank], rel=0.01)
        assert max(sharded[rank], sharded[rank + 2]) <= 0.7 * unsharded[rank]
    fsdp = last_step(made["grads"])["optimizer_state_bytes"]  # every tensor split in rows,
    whole = unsharded[0] + unsharded[1]  # over another split of the stages
    assert sum(fsdp) == pytest.approx(whole, rel=0.01)  # (each copy keeps its own step counts)
    assert fsdp[0] + fsdp[1] == pytest.approx(fsdp[2] + fsdp[3], rel=0.01)
    assert max(fsdp) <= 0.55 * max(unsharded)


def test_the_train_state_is_keyed_by_the_models_names(chain):
    root, _, model = chain
    spec_names = set(_model_names(model))
    for saved in ("ck_dp/step_2", "ck_back/step_4", "ck_sharded/step_5", "ck_grads/step_16"):
        entries = read_model_keyed(root / saved)
        weights = {k[len("model.") :] for k in entries if k.startswith("model.")}
        assert weights == spec_names, saved
        assert {k.rsplit(".", 1)[1] for k in entries if k.startswith("optim.")} == {
            "step", "exp_avg", "exp_avg_sq",
        }  # fmt: skip
        meta = json.loads((root / saved / "meta.json").read_text())
        assert meta["layout"] == "dcp" and meta["train"]["seed"] == 0


def test_export_reads_a_train_state_of_another_split(chain, tmp_path):
    root, _, _ = chain
    target = tmp_path / "w.safetensors"
    assert main(["export", str(root / "c4"), "--train-state", str(root / "ck_grads"),
                 "-o", str(target)]) == 0  # fmt: skip
    from safetensors.torch import load_file

    exported = load_file(target)
    saved = read_model_keyed(root / "ck_grads" / "step_16")  # written as FSDP's shards
    assert exported.keys() >= {k[len("model.") :] for k in saved if k.startswith("model.")}
    assert all(torch.equal(exported[k[6:]], v) for k, v in saved.items() if k[:6] == "model.")


def _model_names(path: str) -> list[str]:
    from tests.conftest import load_model_file

    model = load_model_file(path).model
    names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    names |= {n for n, _ in model.named_buffers()}
    return sorted(names - {"wte.weight"})  # tied: one entry, under its first name in order


def test_resume_into_another_model_is_refused(chain, tmp_path, capsys):
    root, _, _ = chain
    out = tmp_path / "mlp"
    assert main([str(EXAMPLES / "mlp.py"), "--stages", "2", "-q", "-o", str(out)]) == 0
    capsys.readouterr()
    argv = ["run", str(out), "-q", "--steps", "9", "--resume", str(root / "ck_dp")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "has no weight 'fc1.weight' (and 9 more)" in err and "saved from another model" in err, (
        err
    )


def test_a_missing_shard_is_named(chain, tmp_path, capsys):
    root, _, _ = chain
    damaged = tmp_path / "ck"
    shutil.copytree(root / "ck_dp", damaged)
    (damaged / "step_2" / "__1_0.distcp").unlink()
    argv = ["run", str(root / "c4"), "-q", "--steps", "3", "--resume", str(damaged)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"train state {damaged / 'step_2'} cannot be loaded" in err, err
    assert "missing or damaged" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--nproc", "3", "--dp", "2"], "--dp 2 does not divide --nproc 3"),
        (
            ["--nproc", "4", "--dp", "2", "--shard", "params", "--compile", "eager"],
            "--shard params: the stages' forwards run through torch.compile",
        ),
        (["--nproc", "2", "--shard", "optimizer"], "and there is one; add --dp D"),
        (["--dp", "2"], "--dp applies to the ranks of --nproc N"),
        (["--nproc", "6", "--dp", "2"], "run --nproc 4 (--dp 2 copies of 2)"),
        (["--nproc", "4", "--dp", "2", "--check"], "--check compares one pipeline"),
    ],
)
def test_mesh_options_that_cannot_run_are_refused(chain, capsys, argv, message):
    root, _, _ = chain
    assert main(["run", str(root / "c2"), "-q", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1, err


def test_dp_refuses_an_asynchronous_schedule(tmp_path, capsys):
    out = tmp_path / "pd"
    assert main([str(EXAMPLES / "mlp.py"), "--stages", "2", "--schedule", "pipedream", "-q",
                 "-o", str(out)]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["run", str(out), "--nproc", "4", "--dp", "2"]) == 2
    assert "--dp 2 needs a synchronous schedule" in capsys.readouterr().err


def test_a_dead_rank_anywhere_in_the_mesh_stops_every_rank(chain, capfd, monkeypatch):
    root, _, _ = chain
    monkeypatch.setenv("PIPECOMPILE_FAULT", "3:1B1:kill")  # copy 1's last stage
    argv = ["run", str(root / "c2"), "-q", "--nproc", "4", "--dp", "2", "--steps", "2"]
    assert main([*argv, "--metrics", os.devnull]) == 2
    err = capfd.readouterr().err
    assert "rank 3" in err and "Traceback" not in err, err
    for rank in (0, 1, 2):
        assert f"pipecompile: rank {rank}: stopping" in err, err
