"""A Hugging Face model's own configs, as ``save_pretrained`` writes them, for ``export``.

A model the model file built from a config (``GPT2LMHeadModel(GPT2Config(...))``) carries its
sizes in ``model.config``; without a ``config.json`` beside exported weights, ``from_pretrained``
would build the default sizes and refuse the weights. The configs are taken at compile time
(the compiled directory keeps them, docs/FORMAT.md) so that export needs no model.
"""

from __future__ import annotations

import copy
import sys

from torch import nn

__all__ = ["model_configs", "unsaved_buffers"]


def model_configs(model: nn.Module) -> dict[str, str]:
    """``{"config.json": JSON, "generation_config.json": JSON}`` of a transformers
    ``PreTrainedModel`` (the second only for a model that generates), with what
    ``save_pretrained`` adds (``architectures``, ``dtype``); empty for any other model.

    Example:
        >>> model_configs(torch.nn.Linear(2, 2))  # doctest: +SKIP
        {}
    """
    transformers = sys.modules.get("transformers")  # imported by the model file, if used
    if transformers is None or not isinstance(model, transformers.PreTrainedModel):
        return {}
    config = copy.deepcopy(model.config)  # the user's model keeps its own
    config.architectures = [type(model).__name__]
    config.dtype = str(model.dtype).removeprefix("torch.")
    configs = {"config.json": config.to_json_string(use_diff=True)}
    generation = getattr(model, "generation_config", None)
    if model.can_generate() and generation is not None:
        configs["generation_config.json"] = generation.to_json_string(use_diff=True)
    return configs


def unsaved_buffers(model: nn.Module) -> tuple[str, ...]:
    """The names of ``model``'s buffers its own ``state_dict()`` leaves out (registered with
    ``persistent=False``, such as a rotary embedding's ``inv_freq``): the stages keep their
    values, and what pipecompile hands back as the model's state leaves them out too, so
    that ``model.load_state_dict`` takes it."""
    saved = set(model.state_dict(keep_vars=True))
    return tuple(
        sorted(n for n, _ in model.named_buffers(remove_duplicate=False) if n not in saved)
    )
