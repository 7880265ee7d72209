"""Options that would do nothing or something unintended are refused; stale compiles and
non-finite results never pass."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES


@pytest.fixture(scope="module")
def model_and_out(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("options")
    model = root / "model.py"
    shutil.copy(EXAMPLES / "mlp.py", model)
    out = root / "out"
    assert main([str(model), "--stages", "2", "--microbatches", "2", "-q", "-o", str(out)]) == 0
    return model, out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "0"], "--steps: '0' is not a whole number of at least 1"),
        (["--steps", "-3"], "--steps: '-3'"),
        (["--nproc", "0"], "--nproc: '0'"),
        (["--atol", "-1"], "--atol: '-1' is not a finite number of at least 0"),
        (["--rtol", "nan"], "--rtol: 'nan'"),
        (["--lr", "-0.1"], "--lr: '-0.1'"),
        (["--lr", "nan"], "--lr: 'nan'"),
        (["--timeout", "0"], "--timeout: '0'"),
        (["--save-every", "2"], "--save-every needs --save"),
        (["--save-every", "-1", "--save", "x"], "--save-every: '-1'"),
    ],
)
def test_bad_run_options(model_and_out, capsys, argv, message):
    assert main(["run", str(model_and_out[1]), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--stages", "0"], "--stages: '0'"),
        (["--stages", "2", "--microbatches", "0"], "--microbatches: '0'"),
        (["--stages", "4", "--schedule", "interleaved", "--virtual-stages", "0"],
         "--virtual-stages: '0'"),
        (["--stages", "4", "--schedule", "interleaved", "--virtual-stages", "1"],
         "at least 2, got 1"),
        (["--stages", "2", "--steps", "3"], "--steps is an option of `pipecompile run OUT`, not "
         "of compiling: compile first, then `pipecompile run OUT --steps ...`"),
    ],
)  # fmt: skip
def test_bad_compile_options(model_and_out, tmp_path, capsys, argv, message):
    assert main([str(model_and_out[0]), *argv, "-q", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--check", "--precision", "bf16"], "cannot honour --precision: it compares fp32"),
        (["--check", "--accumulate", "2", "--steps", "3"],
         "cannot honour --steps: it runs one step; --accumulate: it compares one mini-batch"),
        (["--check", "--save", "ck"], "cannot honour --save: it trains nothing to save"),
        (["--check", "--epochs", "2"], "cannot honour --epochs"),
        (["--check", "--seed", "1"], "cannot honour --seed"),
        (["--timeout", "5"], "--timeout applies to the ranks of --nproc N"),
        (["--device", "cpu"], "--device applies to the ranks of --nproc N"),
        (["--atol", "0.1"], "--atol is a tolerance of --check"),
        (["--eval-every", "2"], "--eval-every 2: there is no eval_batches()"),
        (["--steps", "3", "--warmup-steps", "5"], "--warmup-steps 5 is longer than the run"),
        (["--lr", "0"], "--lr: '0' is not a finite number above 0"),
        (["--trace-steps", "2"], "--trace-steps 2 is how many steps --trace FILE traces, and "
         "this run traces none; drop it, or add --trace FILE"),
        (["--recompute", "always"], "--recompute is an option of compiling, which fixes the "
         "program `run` runs: recompile with it"),
    ],
)  # fmt: skip
def test_options_the_run_would_ignore_are_refused(model_and_out, capsys, argv, message):
    assert main(["run", str(model_and_out[1]), "-q", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


# A value for each training option that is not its default: the test below gives each to
# `run --check` (a new option must be added here, and declare what --check does with it).
SAMPLE = {"steps": "2", "epochs": "2", "accumulate": "2", "optimizer": "sgd", "lr": "0.01",
          "lr_schedule": "cosine", "warmup_steps": "1", "clip_grad_norm": "1.0",
          "precision": "bf16", "compile": "eager", "seed": "3", "skip_nonfinite": None,
          "save": "ck", "save_every": "2 --save ck", "resume": "ck", "force": None,
          "metrics": "m.jsonl", "eval_every": "2", "trace": "t.json", "trace_steps": "2",
          "quiet": None, "async_save": None}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SAMPLE))
def test_check_refuses_or_honours_every_training_option_by_its_declaration(
    model_and_out, tmp_path, capsys, monkeypatch, name
):
    """Each training option declares what `run --check` does with it: refused in one line with
    the declared reason (no traceback, nothing written), or honoured."""
    from pipecompile.options.fields import HONOURED, declared
    from pipecompile.options.run import TrainFlags

    options = {f.name: o for f, o in declared(TrainFlags)}
    assert set(options) == set(SAMPLE)  # every option has a sample and a declaration
    option = options[name]
    assert option.under_check, f"{option.flag} declares nothing for --check"
    monkeypatch.chdir(tmp_path)
    value = [] if SAMPLE[name] is None else SAMPLE[name].split()
    code = main(["run", str(model_and_out[1]), "--check", option.flag, *value])
    err = capsys.readouterr().err
    if option.under_check == HONOURED:
        assert code == 0, err
    else:
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "cannot honour" in err and f"{option.flag}: {option.under_check}" in err
        assert list(tmp_path.iterdir()) == []


def test_check_still_takes_what_it_honours(model_and_out, capsys):
    assert main(["run", str(model_and_out[1]), "--check", "--atol", "1e-4", "--rtol", "0"]) == 0
    assert "check passed" in capsys.readouterr().out


def test_init_seed_on_a_model_with_weights_and_a_shard_size_without_shards_are_refused(
    model_and_out, tmp_path, capsys
):
    model, out = model_and_out
    assert main([str(model), "--stages", "2", "--init-seed", "1", "-o", str(tmp_path / "o")]) == 2
    assert "MLP was built with its weights" in capsys.readouterr().err
    target = tmp_path / "w.safetensors"
    assert main(["export", str(out), "-o", str(target), "--shard-size", "1GB"]) == 2
    assert "--shard-size applies to a directory export" in capsys.readouterr().err
    assert not target.exists()
    assert main(["export", str(out), "-o", str(tmp_path / "hf"), "--shard-size", "0"]) == 2
    assert "'0' is no size to write a shard of" in capsys.readouterr().err


def test_options_in_any_order(model_and_out, tmp_path, capsys):
    model, out = model_and_out
    assert main(["-q", str(model), "--stages", "2", "-o", str(tmp_path / "o")]) == 0
    assert main(["-q", "run", str(out)]) == 0
    assert capsys.readouterr().out == ""


def test_resume_beyond_steps_is_refused(model_and_out, tmp_path, capsys):
    out = model_and_out[1]
    saved = tmp_path / "ck"
    assert main(["run", str(out), "-q", "--steps", "3", "--save", str(saved)]) == 0
    assert main(["run", str(out), "-q", "--steps", "3", "--resume", str(saved)]) == 2
    assert "continues after step 3" in capsys.readouterr().err
    assert main(["run", str(out), "-q", "--resume", str(saved)]) == 2  # would do nothing
    assert "the saved step is 3" in capsys.readouterr().err
    assert main(["run", str(out), "-q", "--steps", "4", "--resume", str(saved)]) == 0


def test_float64_inputs_to_a_float32_model_are_refused_at_compile(tmp_path, capsys):
    source = (EXAMPLES / "mlp.py").read_text()
    model = tmp_path / "m64.py"
    model.write_text(source.replace("generator=g),)", "generator=g).double(),)"))
    assert main([str(model), "--stages", "2", "-q", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "fc1" in err and "float32 and float64" in err
    assert not (tmp_path / "o").exists()


def test_a_changed_model_file_makes_the_compile_stale(tmp_path, capsys):
    model = tmp_path / "model.py"
    shutil.copy(EXAMPLES / "mlp.py", model)
    out = tmp_path / "out"
    assert main([str(model), "--stages", "2", "-q", "-o", str(out)]) == 0
    assert main(["run", str(out), "--check", "-q"]) == 0
    capsys.readouterr()
    model.write_text(model.read_text().replace("nn.ReLU()", "nn.GELU()"))
    for argv in (["run", str(out)], ["run", str(out), "--check"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "is stale" in err and "model.py changed" in err and "--allow-stale" in err
    assert main(["run", str(out), "-q", "--allow-stale"]) == 0


def test_nan_never_passes_a_check(model_and_out, tmp_path, capsys):
    out = model_and_out[1].parent / "nan"  # beside the model file the manifest names
    shutil.copytree(model_and_out[1], out)
    stage = out / "stage_1.py"
    source = stage.read_text()
    assert "        return (" in source
    stage.write_text(source.replace("        return (", "        return (float('nan') * ", 1))
    assert main(["run", str(out), "--check"]) == 1
    captured = capsys.readouterr()
    assert "not finite" in captured.out and "check FAILED" in captured.out
    assert "outputs  max |diff| nan" in captured.out


def write_old_format(directory: Path, root: Path, step: int) -> None:
    """A train state as pipecompile wrote it before its checkpoints were keyed by the model's
    names: per-stage weights and optimizer files, and the split's fingerprint."""
    import json

    import torch
    from safetensors.torch import save_model

    from pipecompile.runtime.pipeline import Pipeline
    from pipecompile.runtime.training.train_state import split_fingerprint

    pipe = Pipeline.load(directory)
    pipe.set_optimizer(lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    step_dir = root / f"step_{step}"
    step_dir.mkdir(parents=True)
    for optimizer in pipe.optimizers:  # as the run's: its schedule set their initial_lr
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    for j, module in enumerate(pipe.modules):
        save_model(module, str(step_dir / f"stage_{j}.safetensors"))
        torch.save(pipe.optimizers[j].state_dict(), step_dir / f"stage_{j}.optim.pt")
    meta = {"format": "pipecompile-checkpoint/1", "step": step, "stages": len(pipe.modules),
            "split": split_fingerprint(pipe.manifest), "train": {},
            "optimizer": "AdamW"}  # fmt: skip
    (step_dir / "meta.json").write_text(json.dumps(meta))
    (root / "latest").write_text(f"step_{step}\n")


def test_train_state_resumes_into_another_split_an_old_one_only_into_its_own(tmp_path, capsys):
    mlp = str(EXAMPLES / "mlp.py")
    for name, extra in (("a", ["--split-at", "fc2"]), ("b", ["--split-at", "fc4"]), ("c", [])):
        stages = "3" if name == "c" else "2"
        assert main([mlp, "--stages", stages, "-q", "-o", str(tmp_path / name), *extra]) == 0
    saved = tmp_path / "ck"
    assert main(["run", str(tmp_path / "a"), "-q", "--steps", "1", "--save", str(saved)]) == 0
    for other in ("b", "c"):
        assert main(["run", str(tmp_path / other), "-q", "--steps", "2", "--resume", str(saved),
                     "--metrics", str(tmp_path / f"{other}.jsonl")]) == 0  # fmt: skip
        target = tmp_path / f"{other}.safetensors"
        argv = ["export", str(tmp_path / other), "--train-state", str(saved), "-o", str(target)]
        assert main(argv) == 0 and target.exists()
    capsys.readouterr()
    old = tmp_path / "old"
    write_old_format(tmp_path / "a", old, 1)
    assert main(["run", str(tmp_path / "a"), "-q", "--steps", "2", "--resume", str(old)]) == 0
    for other, detail in (("b", "split differently;"), ("c", "(2 stages, this one 3)")):
        assert main(["run", str(tmp_path / other), "--steps", "2", "--resume", str(old)]) == 2
        err = capsys.readouterr().err
        assert detail in err and "compiled directory it was trained with" in err, err


def test_a_damaged_checkpoint_names_the_file(model_and_out, tmp_path, capsys):
    out = model_and_out[1]
    saved = tmp_path / "ck"
    assert main(["run", str(out), "-q", "--steps", "1", "--save", str(saved)]) == 0
    weights = saved / "step_1" / "__0_0.distcp"
    weights.write_bytes(weights.read_bytes()[:40])
    assert main(["run", str(out), "-q", "--steps", "2", "--resume", str(saved)]) == 2
    err = capsys.readouterr().err
    assert f"train state {saved / 'step_1'} cannot be loaded" in err, err
    assert "a file of it is missing or damaged" in err and "Traceback" not in err


# A value for each `run` option a mode decides about (None: a switch)
RUN_SAMPLE = {"atol": "0.1", "rtol": "0", "batch_shapes": "4", "dp": "2", "shard": "optimizer",
              "device": "cpu", "timeout": "5", "stats": None, "max_restarts": "2"}  # fmt: skip
MODES = {"plain": [], "check": ["--check"], "nproc": ["--nproc", "2"]}


def _run_cases() -> list[tuple[str, str]]:
    from pipecompile.options.fields import declared
    from pipecompile.options.run import RunFlags

    decided = [f.name for f, o in declared(RunFlags) if o.needs or o.under_check or o.under_nproc]
    return [(name, mode) for name in decided for mode in MODES]


@pytest.mark.parametrize(("name", "mode"), _run_cases())
def test_every_run_option_against_every_mode_by_its_declaration(
    model_and_out, tmp_path, capsys, monkeypatch, name, mode
):
    """Each `run` option declares the mode it needs and what `--check` and `--nproc` cannot
    honour; given under each mode it is refused in one line with that reason, before anything
    runs, or (where its declaration allows) reaches the run."""
    from pipecompile.options.fields import declared, flag_of
    from pipecompile.options.run import RunFlags

    option = {f.name: o for f, o in declared(RunFlags)}[name]
    assert option.needs in ("", "check", "nproc") and bool(option.needs) == bool(option.needs_why)
    refusal = None
    if option.needs and option.needs != mode:
        mode_flag = flag_of(RunFlags, option.needs)
        refusal = f"{option.flag} {option.needs_why}; drop {option.flag}, or add {mode_flag}"
    elif mode == "nproc" and option.under_nproc:
        refusal = f"{option.flag} {option.under_nproc}; drop it with --nproc"
    elif mode == "check" and option.under_check:
        refusal = f"{option.flag}: {option.under_check}"
    if refusal is None:
        pytest.skip("allowed under this mode: the run itself is other tests' (test_mesh, ...)")
    monkeypatch.chdir(tmp_path)
    value = [] if RUN_SAMPLE[name] is None else [RUN_SAMPLE[name]]
    code = main(["run", str(model_and_out[1]), *MODES[mode], option.flag, *value])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert refusal in err, err
    assert list(tmp_path.iterdir()) == []
