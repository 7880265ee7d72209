"""A Hugging Face model's KV-cache output, turned off for training: built as people build it
(``GPT2LMHeadModel(config)``, ``use_cache`` at its default), its forward returns a
``DynamicCache`` beside the logits, which no tracer can return and no training step reads.
The compile traces it without the cache (restored afterwards on a model it was given), and a
model pipecompile builds from a model file runs without it, so its eager reference (``run
--check``) returns what the stages return. Decoding passes ``use_cache=True`` itself."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn

__all__ = ["caching_configs", "without_kv_cache", "drop_kv_cache", "CACHE_NOTE"]

CACHE_NOTE = (
    "{name} returns its KV cache (config.use_cache is True): traced without it, as a training "
    "step never reads it (the stages return the rest of its output)"
)


def caching_configs(model: nn.Module) -> list[Any]:
    """The configs among ``model``'s modules whose ``use_cache`` is on, each once."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "use_cache", None) is True:
            seen.setdefault(id(config), config)
    return list(seen.values())


@contextlib.contextmanager
def without_kv_cache(model: nn.Module) -> Iterator[bool]:
    """``model`` with its KV-cache output off while the block runs (yields whether any was
    on), as it was afterwards."""
    configs = caching_configs(model)
    for config in configs:
        config.use_cache = False
    try:
        yield bool(configs)
    finally:
        for config in configs:
            config.use_cache = True


def drop_kv_cache(model: nn.Module) -> bool:
    """Turn ``model``'s KV-cache output off for good (a model pipecompile built itself);
    returns whether any was on."""
    configs = caching_configs(model)
    for config in configs:
        config.use_cache = False
    return bool(configs)
