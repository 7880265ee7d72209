"""The KV cache a traced decode step reads and writes: for each of the model's attention
layers, keys and values of shape (rows, heads, max length, head size), given to the step as
tensors. ``update`` writes each row's new keys and values at that row's own positions, in
place (one ``index_put_`` each), and returns the rows' whole cache (``index_select`` of the
rows the call runs): the positions a row has not reached are masked by the step's additive
mask, so whatever a slot held before is never read.

Two shapes of the same object: ``RowCache`` for a model whose forward takes a cache with
``update(key, value, layer_idx)`` (a model file's own step), and, for a Hugging Face model,
a ``transformers`` ``Cache`` whose layers write the same way (``hf_row_cache``).
``probe_layers`` runs the model once eagerly to learn each layer's key/value shape."""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["RowCache", "write_rows", "hf_row_cache", "probe_layers", "LayerShape"]

LayerShape = tuple[int, int]  # (key/value heads, head size)


def write_rows(
    keys: torch.Tensor,
    values: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write ``key``/``value`` (rows, heads, tokens, size) into ``keys``/``values`` at row
    ``i``, position ``positions[i, t]``; return them."""
    at = torch.arange(positions.shape[0], device=positions.device)[:, None].expand_as(positions)
    keys[at, :, positions] = key.transpose(1, 2).to(keys.dtype)
    values[at, :, positions] = value.transpose(1, 2).to(values.dtype)
    return keys, values


class RowCache:
    """Layer ``i``'s keys are ``kv[2i]``, its values ``kv[2i + 1]``; ``positions`` say where
    this call's tokens go."""

    def __init__(self, kv: list[torch.Tensor], positions: torch.Tensor) -> None:
        self.kv, self.positions = kv, positions

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.kv[2 * layer_idx], self.kv[2 * layer_idx + 1]
        return write_rows(keys, values, key, value, self.positions)


class _Probe:
    """Records each layer's key/value shape and returns the call's own keys: one eager call
    on a short sequence, with a mask over just its tokens."""

    def __init__(self) -> None:
        self.shapes: dict[int, LayerShape] = {}

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.shapes[layer_idx] = (int(key.shape[1]), int(key.shape[-1]))
        return key, value


@functools.cache
def _hf_classes() -> tuple[type, type, type]:
    """transformers' ``Cache`` and two layer kinds of ours (defined once transformers is
    imported, which a model without it never does)."""
    from transformers.cache_utils import Cache, CacheLayerMixin

    class RowLayer(CacheLayerMixin):
        is_sliding = False

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, where: Any) -> None:
            super().__init__()
            self.keys, self.values, self.where = keys, values, where  # where: the positions
            self.is_initialized = True

        def lazy_initialization(self, key_states: Any, value_states: Any) -> None:
            return None

        def update(self, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
            return write_rows(self.keys, self.values, key, value, self.where)

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return int(self.keys.shape[2]), 0

        def get_seq_length(self) -> int:
            return 0

        def get_max_length(self) -> int:
            return int(self.keys.shape[2])

    class ProbeLayer(RowLayer):
        def __init__(self, index: int, probe: _Probe) -> None:
            CacheLayerMixin.__init__(self)
            self.index, self.probe = index, probe

        def update(self, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
            return self.probe.update(key, value, self.index)

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return query_length, 0

        def get_max_length(self) -> int:
            return -1

    return Cache, RowLayer, ProbeLayer


def hf_row_cache(kv: list[torch.Tensor], positions: torch.Tensor) -> Any:
    """A ``transformers`` ``Cache`` whose layer ``i`` writes as ``RowCache`` does."""
    cache, layer, _ = _hf_classes()
    pairs = zip(kv[0::2], kv[1::2])
    return cache(layers=[layer(k, v, positions) for k, v in pairs])


def probe_layers(call: Any, layers_hint: int) -> tuple[Any, _Probe]:
    """A cache for one probing call (``call.hf``: a transformers one of ``layers_hint``
    layers) and the probe that records the shapes."""
    probe = _Probe()
    if not call.hf:
        return probe, probe
    cache, _, probe_layer = _hf_classes()
    return cache(layers=[probe_layer(i, probe) for i in range(layers_hint)]), probe
