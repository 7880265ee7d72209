"""Greedy decoding through the decode stages equals Hugging Face's ``generate`` token for token,
for architectures of every kind, at one, two and four stages, with lanes of several rows, with
prompts of different lengths sharing a lane, and stopping at an end-of-sequence token."""

from __future__ import annotations

import functools

import pytest
import torch

import pipecompile
from tests.conftest import SAMPLED_OUT
from tests.generation.conftest import VOCAB, tiny_decoder

# Sampled out for time (PIPECOMPILE_ALL_CASES=1 runs them): Llama, whose greedy tokens the
# test of the model's own EOS below compares with Hugging Face's at two stages, and at four
# (tests/generation/test_command.py runs four ranks for four stages); Qwen2; Mixtral, whose
# traced decode step tests/generation/test_step_split.py splits (the zoo decodes three
# mixtures of experts, tools/qa/zoo.py)
CASES = [("gpt2", 1, 1, 1), ("gpt2", 3, 2, 2)]
CASES += [pytest.param("llama", 2, 2, 1, marks=SAMPLED_OUT)]
CASES += [pytest.param("llama", 4, 2, 2, marks=SAMPLED_OUT)]
CASES += [pytest.param("qwen2", 2, 2, 1, marks=SAMPLED_OUT)]
CASES += [pytest.param("mixtral", 2, 1, 3, marks=SAMPLED_OUT)]
# any causal LM, traced: the zoo's generation column decodes 26 (tools/qa/zoo.py); these run
# here with PIPECOMPILE_ALL_CASES=1 (sampled out for time: the three above are traced alike)
CASES += [
    pytest.param(arch, 2, 2, 2, marks=SAMPLED_OUT)
    for arch in ("falcon", "gpt_neox", "opt", "phi3", "gemma", "qwen3", "olmoe")
]


def _reference(model: torch.nn.Module, prompt: list[int], new: int, eos: int | None) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, max_new_tokens=new, do_sample=False, eos_token_id=eos, pad_token_id=0,
        attention_mask=torch.ones_like(ids),
    )  # fmt: skip
    tokens = out[0, len(prompt) :].tolist()
    if eos is not None and eos in tokens:
        tokens = tokens[: tokens.index(eos) + 1]
    return tokens


@functools.cache
def _compiled(family: str, stages: int, lanes: int, rows: int):  # -> (model, pipeline)
    model = tiny_decoder(family)
    example = {
        "input_ids": torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    }
    pipe = pipecompile.compile(
        model, example, stages=stages, generate=True, max_length=40, lanes=lanes, lane_rows=rows
    )
    return model, pipe


@pytest.mark.parametrize(("family", "stages", "lanes", "rows"), CASES)
def test_greedy_equals_generate(family, stages, lanes, rows):
    model, pipe = _compiled(family, stages, lanes, rows)
    record = pipe.manifest.generate
    assert record["lanes"] == lanes and record["rows"] == rows and len(record["stages"]) == stages
    g = torch.Generator().manual_seed(2)
    batch = torch.randint(1, VOCAB, (3, 6), generator=g)
    got = pipe.generate(batch, max_new_tokens=10)
    want = model.generate(batch, max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want)

    prompts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (1, 9, 4, 13, 2)]
    got = pipe.generate(prompts, max_new_tokens=12)
    for prompt, row in zip(prompts, got):
        assert row.tolist() == prompt + _reference(model, prompt, 12, None)

    # an end-of-sequence token that greedy decoding reaches: the token it picks third
    eos = _reference(model, prompts[1], 3, None)[2]
    got = pipe.generate(prompts, max_new_tokens=12, eos_token_id=eos)
    for prompt, row in zip(prompts, got):
        assert row.tolist() == prompt + _reference(model, prompt, 12, eos)
    assert len(got[1]) <= len(prompts[1]) + 3  # it stopped early


def test_sampled_tokens_are_the_same_at_any_stage_lane_and_row_count():
    """Each sequence draws from a generator of its own: 3 stages of 2 lanes x 2 rows sample
    what 1 stage of 1 lane x 1 row does (the pipelines the greedy cases compiled); another
    seed samples something else."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (3, 7, 1, 5, 2)]
    sampled = dict(temperature=1.3, top_k=40, top_p=0.95, seed=11)
    _, two = _compiled("gpt2", 1, 1, 1)
    _, four = _compiled("gpt2", 3, 2, 2)
    a = [t.tolist() for t in two.generate(prompts, max_new_tokens=9, **sampled)]
    b = [t.tolist() for t in four.generate(prompts, max_new_tokens=9, **sampled)]
    assert a == b
    c = [t.tolist() for t in four.generate(prompts, max_new_tokens=9, **{**sampled, "seed": 12})]
    assert c != a
    greedy = [t.tolist() for t in four.generate(prompts, max_new_tokens=9)]
    assert a != greedy  # it sampled
    assert [t.tolist() for t in four.generate(prompts, max_new_tokens=9, top_k=1)] == greedy


def test_one_rank_per_stage_equals_generate():
    """A Hugging Face model compiled from Python, decoded with a rank per stage (3: each
    rank's neighbours differ): the ranks build their stages from the stage files and take
    the pipeline's weights."""
    model, pipe = _compiled("gpt2", 3, 2, 2)
    g = torch.Generator().manual_seed(4)
    batch = torch.randint(1, VOCAB, (3, 5), generator=g)
    want = model.generate(batch, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(pipe.generate(batch, max_new_tokens=8, nproc=3), want)


def test_pretrained_weights_given_at_compile(tmp_path):
    """``weights=`` a Hugging Face directory: the decode stages run those weights, not the
    compiled model's own random ones."""
    import transformers as tf

    trained = tiny_decoder("gpt2")
    trained.save_pretrained(tmp_path / "hf")
    fresh = tiny_decoder("gpt2")
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(0.5)  # other values than the directory's
    example = {"input_ids": torch.randint(0, VOCAB, (2, 8))}
    pipe = pipecompile.compile(fresh, example, stages=2, generate=True, weights=tmp_path / "hf")
    batch = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(5))
    loaded = tf.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    want = loaded.generate(batch, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(pipe.generate(batch, max_new_tokens=8), want)
    other = fresh.generate(batch, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert not torch.equal(want, other)  # the weights given matter


def test_the_models_own_eos_stops_a_sequence_as_hugging_face_does():
    """With no ``eos_token_id`` given, the model's own (its generation config) ends a
    sequence and the model's pad id pads it, as ``generate`` does by default."""
    model = tiny_decoder("llama")
    g = torch.Generator().manual_seed(4)
    batch = torch.randint(1, VOCAB, (3, 6), generator=g)
    free = model.generate(batch, max_new_tokens=12, do_sample=False, pad_token_id=0)
    eos = int(free[1, 6 + 2])  # the third token greedy picks for prompt 1
    model.config.eos_token_id = model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = 0
    example = {"input_ids": torch.randint(0, VOCAB, (2, 8), generator=g)}
    pipe = pipecompile.compile(model, example, stages=2, generate=True, max_length=40)
    want = model.generate(batch, max_new_tokens=12, do_sample=False)  # its own EOS and pad
    got = pipe.generate(batch, max_new_tokens=12)
    assert torch.equal(got, want)
    assert int((got[1, 6:] == eos).nonzero()[0]) == 2  # stopped at its EOS, then padded
