"""Which name in the pretrained weights (``--weights``) each model tensor is read from, and
which tensors they lack.

Pretrained weights saved from the base model (``GPT2Model``: ``h.0.attn...``) for a model with a
head (``GPT2LMHeadModel``: ``transformer.h.0.attn...``), or the other way round, differs by one
leading prefix. As Hugging Face's ``from_pretrained`` does with the model's
``base_model_prefix``, the prefix is added to or removed from the weights' names when that
makes them match; a model without one is tried with each single leading name component.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

__all__ = ["Coverage", "NameMap", "coverage", "match_names"]

MAX_CANDIDATES = 64  # leading components tried on a model without a base_model_prefix


@dataclass(frozen=True)
class NameMap:
    """The pretrained weights' names are the model's with ``added`` removed (they lack the
    prefix: it is added to their names to match) or with ``removed`` put in front (they carry
    an extra prefix). Both empty: the names are the same."""

    added: str = ""
    removed: str = ""

    def __call__(self, name: str) -> str:
        """The pretrained weights' name of the model's tensor ``name``."""
        if self.added:
            return name.removeprefix(self.added)
        return self.removed + name

    def __str__(self) -> str:
        if self.added:
            return f"prefix {self.added!r} added"
        if self.removed:
            return f"prefix {self.removed!r} removed"
        return "same names"


@dataclass(frozen=True)
class Coverage:
    """How many of the model's tensors (a tied group once) the pretrained weights
    hold, under a
    ``NameMap``, and the first name of each one it lacks."""

    names: NameMap
    total: int
    missing: tuple[str, ...]

    @property
    def loaded(self) -> int:
        return self.total - len(self.missing)


def match_names(model: nn.Module, pretrained: Iterable[str]) -> NameMap:
    """The ``NameMap`` under which ``pretrained`` holds the most of ``model``'s tensors: the
    names as they are, unless adding or removing one prefix (the model's
    ``base_model_prefix``, else one leading component) finds more, and at least half."""
    held = set(pretrained)
    groups = tensor_groups(model)
    best, best_count = NameMap(), _count(groups, held, NameMap())
    for candidate in _candidates(model, groups, held):
        count = _count(groups, held, candidate)
        if count > best_count and 2 * count >= len(groups):
            best, best_count = candidate, count
    return best


def coverage(model: nn.Module, pretrained: Iterable[str], names: NameMap) -> Coverage:
    """The model's tensors ``pretrained`` holds under ``names``; tensors Hugging Face models
    declare optional (``_keys_to_ignore_on_load_missing``) are not counted."""
    held = set(pretrained)
    optional = [
        re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_missing", None) or ()
    ]
    groups = [
        g for g in tensor_groups(model) if not all(any(p.search(n) for p in optional) for n in g)
    ]
    missing = tuple(g[0] for g in groups if not any(names(n) in held for n in g))
    return Coverage(names, len(groups), missing)


def tensor_groups(model: nn.Module) -> list[list[str]]:
    """The model's saved tensors (``state_dict``: non-persistent buffers excluded), each as the
    list of its names (several for a tied parameter)."""
    groups: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), []).append(name)
    return list(groups.values())


def _count(groups: list[list[str]], held: set[str], names: NameMap) -> int:
    return sum(1 for g in groups if any(names(n) in held for n in g))


def _candidates(model: nn.Module, groups: list[list[str]], held: set[str]) -> list[NameMap]:
    prefix = getattr(model, "base_model_prefix", None)
    if isinstance(prefix, str) and prefix:
        return [NameMap(added=f"{prefix}."), NameMap(removed=f"{prefix}.")]
    ours = {n.split(".", 1)[0] for g in groups for n in g if "." in n}
    theirs = {n.split(".", 1)[0] for n in held if "." in n}
    found = [NameMap(added=f"{c}.") for c in sorted(ours)]
    found += [NameMap(removed=f"{c}.") for c in sorted(theirs)]
    return found[:MAX_CANDIDATES]
