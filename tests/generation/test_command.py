"""`pipecompile MODEL --generate` and `pipecompile generate OUT` on the bundled GPT (the
examples' own layout): the plan recorded and shown, tokens equal to an eager greedy loop over
the same weights, one rank per stage equal to one process (greedy and sampled), the weights of
a training run, and a rank that is killed or hangs named, never waited on forever."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

import pipecompile
from pipecompile.generation.rank_model import WeightSource, stage_tensors
from pipecompile.generation.session import plan_of
from pipecompile.ir.records.manifest import read_manifest
from pipecompile.model.model_file import load_model_file
from pipecompile.surfaces.cli import main
from tests.conftest import SAMPLED_OUT
from tests.generation.conftest import ROOT

PROMPTS = [[5, 17, 3], [40], [9, 9, 9, 9, 9, 2], [77, 1]]


def _ids_args(prompts: list[list[int]]) -> list[str]:
    return [a for p in prompts for a in ("--prompt-ids", ",".join(map(str, p)))]


def _generate(capsys, directory, *extra: str, prompts=PROMPTS) -> dict[int, list[int]]:
    capsys.readouterr()
    argv = ["generate", str(directory), *_ids_args(prompts), "--max-new-tokens", "7"]
    assert main([*argv, "-q", *extra]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[")]
    return {int(x[1 : x.index("]")]): [int(t) for t in x.split("]")[1].split()] for x in lines}


def _eager(weights: dict[str, torch.Tensor], prompt: list[int], new: int) -> list[int]:
    """Greedy decoding the plain way: the whole sequence through the model for every token."""
    model = load_model_file(str(ROOT / "examples" / "gpt.py")).model
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert set(missing) <= {"wte.weight"} and not unexpected  # tied: lm_head.weight sets it
    assert model.wte.weight is model.lm_head.weight
    model.eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(new):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[0, len(prompt) :].tolist()


def test_the_plan_is_recorded_and_shown(gpt_generate, capsys):
    record = json.loads((gpt_generate / "manifest.json").read_text())["generate"]
    assert record["model"] == "GPT" and (record["lanes"], record["rows"]) == (2, 2)
    blocks = [s["blocks"] for s in record["stages"]]
    assert blocks[0][0] == 0 and blocks[-1][1] == 4  # every block, once, in order
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    assert record["layers"] == [[4, 16]] * 4  # 4 heads of 16 in each block's cache
    per = math.prod([2, 2, 4, record["max_length"], 16]) * 4  # lanes, rows, heads, L, size
    for k, stage in enumerate(record["stages"]):
        assert stage["cache_bytes"] == 2 * (stage["blocks"][1] - stage["blocks"][0]) * per
        assert (stage["decode"], stage["prefill"]) == (
            f"decode_stage_{k}.py",
            f"prefill_stage_{k}.py",
        )
        assert (gpt_generate / stage["decode"]).is_file() and stage["decode_flops"] > 0
    assert record["programs"]["decode"][0][0] == "recv_tokens 0 from 1"
    capsys.readouterr()
    assert main(["show", str(gpt_generate)]) == 0
    shown = capsys.readouterr().out
    assert "generate: GPT, decode and prefill traced with a KV cache" in shown
    assert "  stage 1: blocks" in shown and "  decode split: blocks 2 | 2" in shown
    assert "  decode program, lane 0's turn" in shown
    assert "    stage 1: recv 0 from 0, forward 0, sample 0, send_tokens 0 to 0" in shown


def test_tokens_equal_an_eager_greedy_loop(gpt_generate, capsys):
    weights = pipecompile.load(gpt_generate).state_dict()
    got = _generate(capsys, gpt_generate)
    assert got == {k: _eager(weights, p, 7) for k, p in enumerate(PROMPTS)}
    # the API on the same directory: a list of prompts of several lengths, a list back
    rows = pipecompile.load(gpt_generate).generate(PROMPTS, max_new_tokens=7)
    assert [r.tolist() for r in rows] == [p + got[k] for k, p in enumerate(PROMPTS)]


def test_one_rank_per_stage_samples_what_one_process_does(gpt_generate, capsys):
    """(Greedy: test_ranks_queue_prompts_and_free_rows_at_eos.)"""
    sampled = ["--temperature", "0.9", "--top-k", "50", "--seed", "4"]
    here = _generate(capsys, gpt_generate, *sampled)
    assert _generate(capsys, gpt_generate, "--nproc", "2", *sampled) == here


def test_ranks_queue_prompts_and_free_rows_at_eos(gpt_generate, capsys):
    """Nine prompts for four rows (2 lanes x 2), sequences ending at an EOS token: rows are
    refilled mid-flight on every rank alike, as in one process."""
    many = [[(7 * k + j) % 120 + 1 for j in range(1 + k % 4)] for k in range(9)]
    eos = str(_generate(capsys, gpt_generate, prompts=many)[0][2])  # one that comes
    here = _generate(capsys, gpt_generate, "--eos", eos, prompts=many)
    assert any(len(tokens) < 7 and tokens[-1] == int(eos) for tokens in here.values())
    assert _generate(capsys, gpt_generate, "--eos", eos, "--nproc", "2", prompts=many) == here


def test_the_command_as_a_user_runs_it(gpt_generate, capsys):
    """`python -m pipecompile generate --nproc 2` in a process of its own: the command forks
    the ranks' starter first thing (as `run --nproc` does), then prints what one process
    does here."""
    import subprocess
    import sys

    argv = ["generate", str(gpt_generate), *_ids_args(PROMPTS), "--max-new-tokens", "7", "-q"]
    done = subprocess.run(
        [sys.executable, "-m", "pipecompile", *argv, "--nproc", "2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    lines = [x for x in done.stdout.splitlines() if x.startswith("[")]
    got = {int(x[1 : x.index("]")]): [int(t) for t in x.split("]")[1].split()] for x in lines}
    assert got == _generate(capsys, gpt_generate)


def test_four_ranks_for_four_stages(tmp_path, capsys):
    out = tmp_path / "four"
    argv = [str(ROOT / "examples" / "gpt.py"), "--stages", "4", "--generate", "-o", str(out)]
    assert main([*argv, "-q"]) == 0
    weights = pipecompile.load(out).state_dict()
    got = _generate(capsys, out, "--nproc", "4", prompts=PROMPTS[:3])
    assert got == {k: _eager(weights, p, 7) for k, p in enumerate(PROMPTS[:3])}


def _rank_part(directory, stage: int, source) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """What generation rank ``stage`` holds, by the model's names (a tied weight by each)."""
    manifest = read_manifest(directory)
    plan = plan_of(directory, manifest)
    tensors = stage_tensors(directory, plan, stage, source)
    return {n: v for k, v in tensors.items() for n in plan.stages_[stage].params[k]}


def test_a_rank_holds_only_its_stage(gpt_generate):
    """A rank reads its own blocks' weights (and the embeddings or the head) alone, from the
    stage files; no model is built."""
    source = WeightSource("directory", gpt_generate, read_manifest(gpt_generate))
    weights = pipecompile.load(gpt_generate).state_dict()
    blocks = [s["blocks"] for s in read_manifest(gpt_generate).generate["stages"]]
    for stage, (first, stop) in enumerate(blocks):
        part = _rank_part(gpt_generate, stage, source)
        mine = [f"h.{i}." for i in range(first, stop)]
        mine += ["wte.", "wpe.", "lm_head."] if stage == 0 else ["ln_f.", "lm_head.", "wte."]
        assert part and all(any(n.startswith(p) for p in mine) for n in part), sorted(part)
        # (the head is tied to the embedding: the weight has both names)
        assert all(torch.equal(v, weights[n]) for n, v in part.items())
    assert len(_rank_part(gpt_generate, 0, source)) < len(weights) / 2 + 3


def test_the_weights_of_a_training_run(gpt_generate, tmp_path, capsys):
    state = tmp_path / "state"
    assert main(["run", str(gpt_generate), "--steps", "2", "--save", str(state), "-q"]) == 0
    from pipecompile.generation.session import train_state_weights

    trained = train_state_weights(state)
    got = _generate(capsys, gpt_generate, "--train-state", str(state), prompts=PROMPTS[:2])
    assert got == {k: _eager(trained, p, 7) for k, p in enumerate(PROMPTS[:2])}
    assert got != _generate(capsys, gpt_generate, prompts=PROMPTS[:2])  # it trained
    # a rank reads only its stage's tensors of the run's state
    part = _rank_part(gpt_generate, 1, WeightSource("train_state", state))
    held = [n for n in part if n in trained]  # the state keeps a tied weight under one name
    assert len(held) >= len(part) - 1 and all(torch.equal(part[n], trained[n]) for n in held)
    # the state is keyed by the model's names: a compile at another stage count reads it
    one = tmp_path / "one"
    argv = [str(ROOT / "examples" / "gpt.py"), "--stages", "1", "--generate", "-o", str(one)]
    assert main([*argv, "-q"]) == 0
    assert _generate(capsys, one, "--train-state", str(state), prompts=PROMPTS[:2]) == got


@pytest.mark.parametrize(
    ("fault", "said"),
    [("1:2:turn:kill", "generation rank 1 (stage 1) failed: killed by SIGKILL"),
     ("1:2:turn:hang", "nothing came back from the last stage for 1 s (--timeout)")],
)  # fmt: skip
def test_a_rank_killed_or_hung_is_named(gpt_generate, capsys, monkeypatch, fault, said):
    monkeypatch.setenv("PIPECOMPILE_FAULT", fault)
    argv = ["generate", str(gpt_generate), *_ids_args(PROMPTS), "--max-new-tokens", "7"]
    assert main([*argv, "--nproc", "2", "--timeout", "1", "-q"]) != 0
    assert said in capsys.readouterr().err


def _word_tokenizer(directory) -> list[str]:  # noqa: ANN001
    """A Hugging Face tokenizer of a few words (ids 0..5), saved as `save_pretrained` does."""
    import tokenizers
    import transformers
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    words = ["[UNK]", "hello", "world", "the", "cat", "sat"]
    tok = tokenizers.Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.save_pretrained(directory)
    return words


def test_text_prompts_through_a_tokenizer(gpt_generate, tmp_path, capsys):
    """--prompt TEXT and a --prompts file of text are encoded by --tokenizer DIR, and each
    sequence is printed as its prompt and new text, decoded by it."""
    words = _word_tokenizer(tmp_path / "tok")
    (tmp_path / "prompts.txt").write_text("the cat sat\nhello world\n")
    capsys.readouterr()
    argv = ["generate", str(gpt_generate), "--tokenizer", str(tmp_path / "tok")]
    argv += ["--prompts", str(tmp_path / "prompts.txt"), "--max-new-tokens", "3"]
    assert main(argv) == 0  # without -q: the prompt's text, then the new text
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[")]
    ids = _generate(capsys, gpt_generate, prompts=[[3, 4, 5], [1, 2]])
    # new ids past the tokenizer's 6 words decode to nothing (a word-level tokenizer skips them)
    said = {int(x[1]): x.split("] ", 1)[1] for x in lines}
    for k, prompt in enumerate(["the cat sat", "hello world"]):
        new = " ".join(words[t] for t in ids[k] if t < len(words))
        assert said[k] == " ".join(filter(None, [prompt, new]))


def test_an_edited_model_file_is_refused_or_not_read(gpt_generate, tmp_path, capsys):
    """Generation runs the stage files the compile wrote and proved: a model file edited since
    (fewer blocks) is refused as stale, and with --allow-stale it is never read, so the tokens
    are the compiled model's (ranks build their stages from the same files)."""
    import shutil

    here = _generate(capsys, gpt_generate, prompts=PROMPTS[:2])
    out = tmp_path / "out"
    shutil.copytree(gpt_generate, out)
    edited = tmp_path / "gpt.py"
    text = (ROOT / "examples" / "gpt.py").read_text()
    edited.write_text(text.replace("n_layer: int = 4", "n_layer: int = 2"))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["model"]["file"] = str(edited)
    (out / "manifest.json").write_text(json.dumps(manifest))
    argv = ["generate", str(out), *_ids_args(PROMPTS[:2]), "-q"]
    assert main(argv) == 2
    assert "gpt.py changed after it was compiled" in capsys.readouterr().err
    assert _generate(capsys, out, "--allow-stale", prompts=PROMPTS[:2]) == here


@SAMPLED_OUT  # for time; PIPECOMPILE_ALL_CASES=1 runs it
def test_a_model_compiled_on_the_meta_device_decodes_its_weights(tmp_path, capsys):
    """examples/llama_meta.py has no weights at compile: its stages' constants (the rotary
    frequencies) are read at generation by their names in the model, from the directory's
    weights, and the tokens are an eager greedy loop's over those weights."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from hf_llama import build_llama
    finally:
        sys.path.remove(str(ROOT / "examples"))
    out = tmp_path / "meta"
    argv = [str(ROOT / "examples" / "llama_meta.py"), "--stages", "2", "--generate"]
    assert main([*argv, "-o", str(out), "-q"]) == 0
    model = build_llama().eval()
    model.load_state_dict(pipecompile.load(out).state_dict())
    want = {}
    for k, prompt in enumerate(PROMPTS[:2]):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            for _ in range(7):
                ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        want[k] = ids[0, len(prompt) :].tolist()
    assert _generate(capsys, out, prompts=PROMPTS[:2]) == want
