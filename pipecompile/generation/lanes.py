"""Which sequences run where: prompts wait in a queue, each lane has ``rows`` slots, and a
lane's turn prefills the prompts that just took a free slot and decodes the rows that
continue. A sequence that stops (at one of the ``eos`` ids, or after ``max_new_tokens``) frees
its slot for the next prompt at the lane's next turn: continuous batching across lanes.

Pure bookkeeping: the stages and the transport (one process or one rank per stage) are the
runner's."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from pipecompile.generation.stages import Call, Rows

__all__ = ["Turn", "Lanes"]


@dataclass
class _Sequence:
    number: int
    prompt: list[int]
    new: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Turn:
    """One lane's turn: its calls (prefills first, then one decode of the continuing rows),
    each call's token ids and sequence numbers."""

    lane: int
    calls: list[Call]
    ids: list[torch.Tensor]
    sequences: list[list[int]]

    @property
    def rows(self) -> list[int]:
        return [r for call in self.calls for r in call.rows.rows]


class Lanes:
    """The queue and the lanes' slots; ``on_start()`` hears that generation begins (every
    stage built), ``on_token(sequence, token)`` hears every new token,
    ``on_done(sequence, tokens)`` every sequence that stops."""

    def __init__(
        self,
        prompts: list[list[int]],
        lanes: int,
        rows: int,
        max_new_tokens: int,
        eos: tuple[int, ...] = (),
        on_token: Callable[[int, int], None] | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        self.waiting = deque(_Sequence(k, list(p)) for k, p in enumerate(prompts))
        self.slots: list[list[_Sequence | None]] = [[None] * rows for _ in range(lanes)]
        self.max_new_tokens, self.eos = max_new_tokens, eos
        self.on_token = on_token
        self.finished: dict[int, list[int]] = {}
        self.count = len(prompts)
        if max_new_tokens == 0:
            self.finished = {s.number: [] for s in self.waiting}
            self.waiting.clear()
        if on_start is not None:  # the stages are built: the clock of the first token starts
            on_start()

    def done(self) -> bool:
        return len(self.finished) == self.count

    def turn(self, lane: int) -> Turn | None:
        """The lane's next turn (None: it has nothing to run)."""
        slots = self.slots[lane]
        calls, ids, sequences = [], [], []
        going = [r for r, s in enumerate(slots) if s is not None]
        for r, s in enumerate(slots):
            if s is None and self.waiting:
                s = slots[r] = self.waiting.popleft()
                n = len(s.prompt)
                calls.append(Call(Rows((r,), torch.arange(n).view(1, n))))
                ids.append(torch.tensor([s.prompt], dtype=torch.long))
                sequences.append([s.number])
        if going:
            seqs = [slots[r] for r in going]
            last = [[s.new[-1]] for s in seqs]
            where = [[len(s.prompt) + len(s.new) - 1] for s in seqs]
            calls.append(Call(Rows(tuple(going), torch.tensor(where, dtype=torch.long))))
            ids.append(torch.tensor(last, dtype=torch.long))
            sequences.append([s.number for s in seqs])
        return Turn(lane, calls, ids, sequences) if calls else None

    def give(self, turn: Turn, tokens: list[int]) -> None:
        """The tokens the last stage picked for ``turn``'s rows, in its order."""
        slots = self.slots[turn.lane]
        for row, token in zip(turn.rows, tokens):
            s = slots[row]
            assert s is not None
            s.new.append(token)
            if self.on_token is not None:
                self.on_token(s.number, token)
            if token in self.eos or len(s.new) >= self.max_new_tokens:
                self.finished[s.number] = s.new
                slots[row] = None
