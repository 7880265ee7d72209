"""The sampler draws from the distribution it is asked for: temperature, then top-k, then
top-p, as Hugging Face's logits warpers do, one generator per sequence."""

from __future__ import annotations

import torch

from pipecompile.generation.sampler import Sampler, Sampling

LOGITS = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0]])
DRAWS = 4000


def _counts(sampling: Sampling) -> torch.Tensor:
    sampler = Sampler(sampling)
    counts = torch.zeros(LOGITS.shape[1])
    for sequence in range(DRAWS):  # one draw from each of DRAWS sequences' generators
        counts[sampler.pick(LOGITS, [sequence])[0]] += 1
    return counts / DRAWS


def _expected(temperature: float, keep: list[int]) -> torch.Tensor:
    scores = torch.full_like(LOGITS[0], float("-inf"))
    scores[keep] = LOGITS[0, keep] / temperature
    return scores.softmax(-1)


def test_temperature_draws_from_the_softmax():
    for t in (0.5, 1.0, 2.0):
        got = _counts(Sampling(temperature=t, seed=1))
        assert (got - _expected(t, list(range(8)))).abs().max() < 0.03, t


def test_top_k_and_top_p_keep_only_the_likeliest():
    got = _counts(Sampling(temperature=1.0, top_k=3, seed=2))
    assert (got - _expected(1.0, [0, 1, 2])).abs().max() < 0.03
    # softmax(LOGITS): 0.405, 0.245, 0.149, 0.090, ...: the fewest likeliest tokens whose
    # mass reaches p stay (0.405 + 0.245 = 0.65 reaches 0.6, not 0.7)
    for p, keep in ((0.7, [0, 1, 2]), (0.6, [0, 1]), (0.4, [0])):
        got = _counts(Sampling(temperature=1.0, top_p=p, seed=3))
        assert (got - _expected(1.0, keep)).abs().max() < 0.03, p
    got = _counts(Sampling(temperature=1.0, top_k=2, top_p=0.99, seed=4))
    assert (got - _expected(1.0, [0, 1])).abs().max() < 0.03


def test_greedy_is_the_argmax_and_a_sequence_draws_the_same_anywhere():
    assert Sampler(Sampling()).pick(LOGITS.repeat(2, 1), [0, 1]) == [0, 0]
    rows = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    one, other = Sampler(Sampling(1.0, seed=5)), Sampler(Sampling(1.0, seed=5))
    together = [one.pick(rows, [7, 8, 9]) for _ in range(5)]
    alone = [[other.pick(rows[k : k + 1], [s])[0] for k, s in ((2, 9), (0, 7), (1, 8))]
             for _ in range(5)]  # fmt: skip
    assert [[t[2], t[0], t[1]] for t in together] == alone


def test_a_sequence_keeps_its_generator_only_while_it_runs():
    """A long queue of sampled prompts holds the generators of those in flight alone."""
    sampler = Sampler(Sampling(1.0, seed=6), max_new_tokens=3, eos=())
    rows = torch.zeros(2, 8)
    for _ in range(3):
        sampler.pick(rows, [0, 1])
    assert sampler._generators == {}  # both picked 3 tokens: ended
    first = sampler.pick(rows, [2])
    assert list(sampler._generators) == [2]
    alone = Sampler(Sampling(1.0, seed=6)).pick(rows[:1], [2])
    assert first == alone  # the same draws as a sampler that never forgot
