"""The next token from the last stage's logits: greedy, or drawn with temperature, top-k and
top-p (applied in that order, as Hugging Face's ``generate`` does) from a generator of the
sequence's own, seeded by ``--seed`` and the sequence's number, so the tokens do not depend on
how many stages, lanes or processes ran it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Sampling", "Sampler", "picked"]


@dataclass(frozen=True)
class Sampling:
    """``temperature`` 0: greedy (top-k and top-p then change nothing)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


class Sampler:
    """Picks tokens as ``sampling`` says. Each sampled sequence's generator is kept until the
    sequence ends (``max_new_tokens`` picked, or ``eos``), so a long queue of prompts keeps
    only the generators of those in flight (each holds a few KiB of state)."""

    def __init__(
        self,
        sampling: Sampling,
        max_new_tokens: int | None = None,
        eos: tuple[int, ...] | list[int] = (),
    ) -> None:
        self.sampling, self.max_new_tokens, self.eos = sampling, max_new_tokens, tuple(eos)
        self._generators: dict[int, torch.Generator] = {}
        self._picked: dict[int, int] = {}

    def _generator(self, sequence: int) -> torch.Generator:
        found = self._generators.get(sequence)
        if found is None:
            seed = (self.sampling.seed * 1_000_003 + sequence) % (2**63)
            found = self._generators[sequence] = torch.Generator().manual_seed(seed)
        return found

    def _count(self, sequence: int, token: int) -> None:
        """One more token of ``sequence``: its generator goes when the sequence ends."""
        n = self._picked[sequence] = self._picked.get(sequence, 0) + 1
        if token in self.eos or (self.max_new_tokens is not None and n >= self.max_new_tokens):
            self._generators.pop(sequence, None)
            self._picked.pop(sequence, None)

    def pick(self, logits: torch.Tensor, sequences: list[int]) -> list[int]:
        """One token per row of ``logits`` (rows, vocabulary), row k being of sequence
        ``sequences[k]``."""
        s = self.sampling
        if s.greedy:  # on the logits' device: only the ids come back
            return logits.argmax(dim=-1).tolist()
        scores = logits.float().cpu() / s.temperature  # the generators are the host's
        if s.top_k is not None and s.top_k < scores.shape[-1]:
            kth = torch.topk(scores, s.top_k, dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if s.top_p is not None and s.top_p < 1.0:
            ordered, order = torch.sort(scores, dim=-1, descending=False)
            cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
            drop = cumulative <= 1 - s.top_p
            drop[:, -1] = False  # the likeliest token always stays
            scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        probs = scores.softmax(dim=-1)
        out = []
        for k, seq in enumerate(sequences):
            out.append(int(torch.multinomial(probs[k], 1, generator=self._generator(seq))))
            self._count(seq, out[-1])
        return out


def picked(sampler: Sampler, logits: list[torch.Tensor], sequences: list[list[int]]) -> list[int]:
    """The tokens of a turn's calls, in the turn's row order."""
    return [t for x, seqs in zip(logits, sequences) for t in sampler.pick(x, seqs)]
