"""What generation cannot take is refused with a line that names it, before anything runs:
models that are no causal LM of a known family, or only look like one; options that do not
fit the plan; prompts that do not fit the model."""

from __future__ import annotations

import pytest

from pipecompile.cli import main
from tests.generation.conftest import ROOT

GPT = str(ROOT / "examples" / "gpt.py")


def _refused(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's refusals
        code = stop.code
    err = capsys.readouterr().err
    assert code not in (0, None) and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("extra", "said"),
    [(["--prompt-ids", ""], "prompt 0 is empty"),
     (["--prompt-ids", "1,500"], "token id 500, outside the model's vocabulary of 128"),
     (["--prompt-ids", "1,x"], "'1,x' is not token ids"),
     (["--prompt-ids", "1", "--max-new-tokens", "40"], "at most 31 new ones fit"),
     (["--prompt-ids", "1", "--max-new-tokens", "-1"], "--max-new-tokens -1: give 0 or more"),
     (["--prompt-ids", "1", "--eos", "999"], "--eos 999 is not a token"),
     (["--prompt-ids", "1", "--nproc", "3"], "give --nproc 2"),
     (["--prompt-ids", "1", "--temperature", "-1"], "--temperature -1.0: give 0"),
     (["--prompt-ids", "1", "--top-p", "0"], "--top-p 0.0: give a probability in (0, 1]"),
     (["--prompt-ids", "1", "--top-k", "0"], "--top-k 0: give 1 or more"),
     (["--prompt-ids", "1", "--timeout", "0"], "--timeout 0: give a positive"),
     (["--prompt", "hi"], "is text, and there is no tokenizer"),
     (["--prompts", "/nonexistent/prompts.txt"], "cannot read it"),
     ([], "no prompts given")],
)  # fmt: skip
def test_prompts_and_options_that_do_not_fit(gpt_generate, capsys, extra, said):
    assert said in _refused(capsys, ["generate", str(gpt_generate), *extra])


def test_a_directory_that_is_not_a_run_or_has_no_plan(gpt_generate, tmp_path, capsys):
    argv = ["generate", str(gpt_generate), "--prompt-ids", "1", "--train-state", str(tmp_path)]
    assert "holds no train state" in _refused(capsys, argv)
    plain = tmp_path / "plain"
    assert main([str(ROOT / "examples" / "mlp.py"), "--stages", "2", "-o", str(plain), "-q"]) == 0
    said = _refused(capsys, ["generate", str(plain), "--prompt-ids", "1"])
    assert "--generate" in said and str(plain) in said


@pytest.mark.parametrize(
    ("argv", "said"),
    [([str(ROOT / "examples" / "mlp.py"), "--generate"], "MLP is not a causal language model"),
     ([GPT, "--max-length", "16"], "--max-length without --generate: add --generate"),
     ([GPT, "--generate", "--max-length", "64"], "past the 32 positions GPT embeds"),
     ([GPT, "--generate", "--lanes", "0"], "argument --lanes: '0' is not a whole number"),
     ([GPT, "--generate", "--lane-rows", "0"], "argument --lane-rows: '0' is not a whole")],
)  # fmt: skip
def test_models_and_compile_options_generation_cannot_take(tmp_path, capsys, argv, said):
    out = tmp_path / "out"
    assert said in _refused(capsys, [*argv, "--stages", "2", "-o", str(out), "-q"])
    assert not out.exists()


def test_a_model_that_only_looks_like_a_family_is_proved_wrong(tmp_path, capsys):
    """The GPT with attention that sees the future has the examples' layout, and the
    compile-time proof finds its logits are not what decoding with a cache computes."""
    source = (ROOT / "examples" / "gpt.py").read_text()
    assert "is_causal=True" in source
    model = tmp_path / "bidirectional.py"
    model.write_text(source.replace("is_causal=True", "is_causal=False"))
    argv = [str(model), "--generate", "--stages", "2", "-o", str(tmp_path / "out"), "-q"]
    said = _refused(capsys, argv)
    assert "--generate: the nanogpt decode path's logits differ from the eager model's" in said
    assert not (tmp_path / "out").exists()
