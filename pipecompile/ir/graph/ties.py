"""Tied parameters: one logical parameter held by several stages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["tied_groups", "tied_params"]

StageParams = Sequence[Mapping[str, Sequence[str]]]


def tied_params(stage_params: StageParams) -> dict[tuple[str, ...], dict[int, str]]:
    """Each logical parameter held by two or more stages -> {stage: its name in that stage}.

    ``stage_params[j]`` maps stage j's parameter names to the original model's names; a
    logical parameter is identified by its tuple of original names.
    """
    holders: dict[tuple[str, ...], dict[int, str]] = {}
    for j, params in enumerate(stage_params):
        for name, originals in params.items():
            holders.setdefault(tuple(originals), {}).setdefault(j, name)
    return {key: held for key, held in holders.items() if len(held) > 1}


def tied_groups(stage_params: StageParams) -> list[tuple[int, ...]]:
    """The sets of stages that must sum gradients together, one per tied logical parameter."""
    return sorted({tuple(sorted(held)) for held in tied_params(stage_params).values()})
