"""The causal language models pipecompile generates with, and how a decode stage runs their
parts: the token embedding, one block with its slice of the KV cache, and the head.

Three families are recognised by their modules (``decoder_family``):

- ``llama``: Hugging Face ``LlamaForCausalLM`` and its kin (Mistral, Qwen2, Mixtral), whose
  decoder layers take a ``cache`` and rotary ``position_embeddings``: their own static-cache
  path, the cache being this stage's ``LaneCache``;
- ``gpt2``: Hugging Face ``GPT2LMHeadModel``, whose blocks take a ``cache`` likewise;
- ``nanogpt``: a GPT written as pipecompile's examples write it (``wte``, ``wpe``, ``h`` of
  blocks with ``ln_1``, ``attn.c_attn``, ``attn.c_proj``, ``attn.n_head``, ``ln_2``, ``mlp``,
  then ``ln_f`` and ``lm_head``), whose attention takes no cache: the front end runs the same
  block with the cache itself.

A compile with ``--generate`` proves the family's path against the model: the prefill's logits
must equal the eager model's (``generation.plan``), so a model that only looks like a family is
refused, not run wrong.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipecompile.errors import PipecompileError

__all__ = ["Family", "GenerateError", "decoder_family", "FAMILIES"]


class GenerateError(PipecompileError):
    """A model, option or prompt generation cannot take; the message says what to change."""


class Family:
    """One family's parts of ``model``: ``blocks`` in order, the module paths the first stage
    (``first``) and the last (``last``) need besides their blocks, and how each part runs."""

    name = ""
    blocks_path = ""
    first: tuple[str, ...] = ()
    last: tuple[str, ...] = ()
    every: tuple[str, ...] = ()  # modules without weights every stage uses (rotary tables)

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @property
    def blocks(self) -> nn.ModuleList:
        return self.model.get_submodule(self.blocks_path)

    def kv_shape(self) -> tuple[int, int]:
        """(key/value heads, head size) of every block's cache."""
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_submodule(self.last[-1]).weight.shape[0])

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def block(
        self, index: int, h: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        raise NotImplementedError

    def head(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def materialise_every(self) -> None:
        """Give the weightless modules every stage uses (``every``) memory, on a model
        built on the meta device."""
        for path in self.every:
            self.model.get_submodule(path).to_empty(device="cpu")

    def block_prefix(self, index: int) -> str:
        return f"{self.blocks_path}.{index}."


def _cache_keyword(layer: nn.Module) -> str:
    """The name this transformers version gives a layer's cache argument."""
    params = inspect.signature(layer.forward).parameters
    return next((n for n in ("cache", "past_key_values", "past_key_value") if n in params), "cache")


class Llama(Family):
    name = "llama"
    blocks_path = "model.layers"
    first = ("model.embed_tokens",)
    last = ("model.norm", "lm_head")
    every = ("model.rotary_emb",)

    def kv_shape(self) -> tuple[int, int]:
        c = self.model.config
        heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        size = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return int(heads), int(size)

    def materialise_every(self) -> None:
        """The rotary embedding anew from the config: its frequencies are a buffer no
        weights file holds."""
        old = self.model.model.rotary_emb
        if any(t.is_meta for t in old.buffers()):
            self.model.model.rotary_emb = type(old)(config=self.model.config)

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model.model.embed_tokens(ids)

    def block(self, index, h, positions, mask, cache):  # type: ignore[no-untyped-def]
        layer = self.blocks[index]
        rotary = self.model.model.rotary_emb(h, positions)
        keyword = {_cache_keyword(layer): cache}
        out = layer(
            h,
            attention_mask=mask,
            position_ids=positions,
            position_embeddings=rotary,
            use_cache=True,
            **keyword,
        )
        return out[0] if isinstance(out, tuple) else out

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self.model.model.norm(h))


class GPT2(Family):
    name = "gpt2"
    blocks_path = "transformer.h"
    first = ("transformer.wte", "transformer.wpe")
    last = ("transformer.ln_f", "lm_head")

    def kv_shape(self) -> tuple[int, int]:
        c = self.model.config
        return int(c.n_head), int(c.n_embd // c.n_head)

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        t = self.model.transformer
        return t.drop(t.wte(ids) + t.wpe(positions))

    def block(self, index, h, positions, mask, cache):  # type: ignore[no-untyped-def]
        layer = self.blocks[index]
        keyword = {_cache_keyword(layer): cache}
        out = layer(h, attention_mask=mask, position_ids=positions, use_cache=True, **keyword)
        return out[0] if isinstance(out, tuple) else out

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self.model.transformer.ln_f(h))


class NanoGPT(Family):
    name = "nanogpt"
    blocks_path = "h"
    first = ("wte", "wpe")
    last = ("ln_f", "lm_head")

    def kv_shape(self) -> tuple[int, int]:
        attn = self.blocks[0].attn
        width = attn.c_proj.weight.shape[0]
        return int(attn.n_head), int(width // attn.n_head)

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        m = self.model
        x = m.wte(ids) + m.wpe(positions)
        return m.drop(x) if hasattr(m, "drop") else x

    def block(self, index, h, positions, mask, cache):  # type: ignore[no-untyped-def]
        b = self.blocks[index]
        a = b.attn
        B, T, C = h.shape
        q, k, v = a.c_attn(b.ln_1(h)).split(C, dim=2)
        q, k, v = (t.view(B, T, a.n_head, C // a.n_head).transpose(1, 2) for t in (q, k, v))
        k, v = cache.update(k, v, index)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = a.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        h = h + y
        return h + b.mlp(b.ln_2(h))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self.model.ln_f(h))


FAMILIES: tuple[type[Family], ...] = (Llama, GPT2, NanoGPT)


def _has(model: nn.Module, paths: tuple[str, ...]) -> bool:
    for path in paths:
        try:
            model.get_submodule(path)
        except AttributeError:
            return False
    return True


def _looks(model: nn.Module, family: type[Family]) -> bool:
    if not _has(model, (family.blocks_path, *family.first, *family.last, *family.every)):
        return False
    blocks = model.get_submodule(family.blocks_path)
    if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0:
        return False
    if family is NanoGPT:
        return all(
            _has(b, ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp"))
            and isinstance(getattr(b.attn, "n_head", None), int)
            for b in blocks
        )
    return True


def decoder_family(model: nn.Module) -> Family:
    """The family ``model`` belongs to, holding it.

    Raises:
        GenerateError: it is none of them (a classifier, an encoder, a model of another
            layout): names what was looked for.
    """
    for family in FAMILIES:
        if _looks(model, family):
            return family(model)
    kinds = "; ".join(
        f"{f.name}: {', '.join((f.blocks_path, *f.first, *f.last))}" for f in FAMILIES
    )
    raise GenerateError(
        f"{type(model).__name__} is not a causal language model pipecompile can generate "
        f"with: --generate needs token embeddings, a list of decoder blocks and an LM head, "
        f"laid out as one of these ({kinds}); compile without --generate"
    )
