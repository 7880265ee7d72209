"""``run --skip-nonfinite``: a step whose loss is NaN or infinite leaves no trace (weights and
optimizer state as if it had not run), locally and across ranks; refused for asynchronous
schedules, whose updates cannot wait for the step's losses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES

# loss_fn returns NaN on the calls listed in BAD (two micro-batches per step: calls 3 and 4
# are step 2's), so a run of 3 steps with step 2 skipped must end where 2 clean steps end.
COUNTED_LOSS = """

CALLS = [0]
BAD = {bad}


def loss_fn(output, target):
    CALLS[0] += torch.is_grad_enabled()  # the training's calls, not the checks' (no_grad)
    loss = F.mse_loss(output, target, reduction="mean")
    return loss * float("nan") if CALLS[0] in BAD else loss
"""


def _compile(root: Path, name: str, bad: set[int], schedule: str = "1f1b") -> Path:
    source = (EXAMPLES / "mlp.py").read_text()
    model = root / f"{name}.py"
    model.write_text(source + COUNTED_LOSS.format(bad=sorted(bad) or "set()"))
    out = root / f"{name}-out"
    argv = [str(model), "--stages", "2", "--microbatches", "2", "--schedule", schedule]
    assert main([*argv, "-q", "-o", str(out)]) == 0
    return out


def _weights(out: Path, checkpoints: Path) -> dict[str, torch.Tensor]:
    target = checkpoints.parent / f"{checkpoints.name}.safetensors"
    assert main(["export", str(out), "--checkpoint", str(checkpoints), "-o", str(target)]) == 0
    return load_file(str(target))


@pytest.fixture(scope="module")
def clean_weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The weights after 2 clean steps, run locally: the reference of both runs below (a run
    under --nproc equals the local one bit for bit, as test_distributed.py checks)."""
    root = tmp_path_factory.mktemp("clean")
    clean = _compile(root, "clean", set())
    assert main(["run", str(clean), "--steps", "2", "--save", str(root / "ck-clean"),
                 "--lr", "0.01", "-q"]) == 0  # fmt: skip
    return _weights(clean, root / "ck-clean")


@pytest.mark.parametrize("nproc", [None, 2], ids=["local", "nproc2"])
def test_a_skipped_step_leaves_no_trace(nproc, tmp_path, capfd, clean_weights):
    extra = ["--nproc", str(nproc)] if nproc else []
    capfd.readouterr()
    nan = _compile(tmp_path, "nan", {3, 4})
    argv = ["run", str(nan), "--steps", "3", "--save", str(tmp_path / "ck-nan"), "--lr", "0.01"]
    assert main([*argv, "--skip-nonfinite", *extra]) == 0
    out, err = capfd.readouterr()
    assert "step 2/3  loss nan" in out and "skipped: the loss is not finite" in out, out
    assert "step 3/3  loss nan" not in out, out
    assert "skipped 1 of 3 steps whose loss was not finite (steps 2)" in err, err

    want, have = clean_weights, _weights(nan, tmp_path / "ck-nan")
    assert set(have) == set(want)
    for name in want:
        assert torch.equal(have[name], want[name]), name  # AdamW's step count too


def test_without_the_option_the_run_stops_at_the_step(tmp_path, capfd):
    nan = _compile(tmp_path, "nan", {3})
    assert main(["run", str(nan), "--steps", "3"]) == 2
    out, err = capfd.readouterr()
    assert "step 2, micro-batch 0: the loss is nan; training stops here" in err, err
    assert "--skip-nonfinite drops such steps instead" in err
    assert "step 3/3" not in out


def test_refused_for_an_asynchronous_schedule(tmp_path, capfd):
    out = _compile(tmp_path, "async", set(), schedule="pipedream")
    assert main(["run", str(out), "--steps", "2", "--skip-nonfinite"]) == 2
    err = capfd.readouterr().err
    assert "--skip-nonfinite needs a synchronous schedule: pipedream applies" in err, err
    assert "Traceback" not in err
