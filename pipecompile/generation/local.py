"""Generation with every stage in this process: each lane's turn runs the stages in order,
then the last stage's logits pick the rows' next tokens."""

from __future__ import annotations

from collections.abc import Callable

from pipecompile.generation.lanes import Lanes
from pipecompile.generation.sampler import Sampler, Sampling, picked
from pipecompile.generation.stages import DecodeStage

__all__ = ["generate_here"]


def generate_here(
    stages: list[DecodeStage],
    prompts: list[list[int]],
    max_new_tokens: int,
    sampling: Sampling,
    *,
    eos: tuple[int, ...] = (),
    on_token: Callable[[int, int], None] | None = None,
    on_start: Callable[[], None] | None = None,
    between_turns: Callable[[], object] | None = None,
) -> dict[int, list[int]]:
    """Each prompt's new tokens, by its number; ``between_turns`` is called after each lane's
    turn (the threads following the idle cores)."""
    lanes = stages[0].lanes
    book = Lanes(prompts, lanes, stages[0].rows, max_new_tokens, eos, on_token, on_start)
    sampler = Sampler(sampling, max_new_tokens, eos)
    while not book.done():
        for lane in range(lanes):
            turn = book.turn(lane)
            if turn is None:
                continue
            xs = turn.ids
            for stage in stages:
                xs = stage.run(lane, turn.calls, xs)
            book.give(turn, picked(sampler, xs, turn.sequences))
            if between_turns is not None:
                between_turns()
    return book.finished
