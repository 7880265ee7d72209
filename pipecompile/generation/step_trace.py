"""A causal LM's decoding step as a graph: the model's own forward, called with a KV cache
(``row_cache``), each row's positions and an additive causal mask, captured by torch.export.

The step (``DecodingStep``) takes token ids (rows, tokens), their positions (rows, tokens), the
mask (rows, 1, tokens, max length) and every layer's keys and values of those rows (``kv``),
and returns the logits at each row's last token. ``trace_step`` captures it
twice: the prefill (one row, any number of tokens) and the decode (up to ``rows`` rows, one
token each). A model's forward must take the cache and the positions as keywords
(``StepCall``): Hugging Face's causal LMs do (``cache``, or ``past_key_values`` in older
versions, ``position_ids``, ``attention_mask``), and a model file may write its own forward
so (examples/gpt.py); a forward that does not, or a step export cannot capture, is refused
naming why and where."""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.fx as fx
from torch import nn

from pipecompile.errors import PipecompileError
from pipecompile.frontend.layout_free import views_as_reshapes
from pipecompile.frontend.quiet_logs import held_stderr, quiet_logs
from pipecompile.generation.row_cache import RowCache, hf_row_cache, probe_layers
from pipecompile.ir.graph.user_frame import innermost_outside

__all__ = [
    "GenerateError",
    "StepCall",
    "DecodingStep",
    "trace_step",
    "layer_shapes",
    "causal_mask",
    "float_dtype",
]

CACHE_WORDS = ("cache", "past_key_values")
# export logs a failing graph and the sizes it keeps fixed; the refusal names the line
_QUIET = ("torch.fx.experimental.symbolic_shapes", "torch._export.non_strict_utils")


class GenerateError(PipecompileError):
    """A model, option or prompt generation cannot take; the message says what to change."""


@dataclass(frozen=True)
class StepCall:
    """How ``model``'s forward takes one step: the keyword its cache goes under, the
    optional keywords it has, and whether it is a Hugging Face model (whose cache must be a
    ``transformers`` ``Cache``)."""

    cache_word: str
    keywords: frozenset[str]
    hf: bool

    @classmethod
    def of(cls, model: nn.Module) -> StepCall:
        """Raises GenerateError: the forward takes no cache, positions or mask keyword."""
        params = inspect.signature(model.forward).parameters
        word = next((w for w in CACHE_WORDS if w in params), None)
        lacking = [w for w in ("position_ids", "attention_mask") if w not in params]
        if word is None or lacking:
            what = ", ".join(([] if word else ["cache (or past_key_values)"]) + lacking)
            raise GenerateError(
                f"{type(model).__name__}.forward takes no {what} keyword: --generate traces the "
                "model's decoding step with a KV cache, and needs a forward taking position_ids, "
                "an additive attention_mask (rows, 1, tokens, keys) and a cache whose "
                "update(key, value, layer_idx) returns the layer's keys and values "
                "(docs/USAGE.md, 'Generation'; examples/gpt.py writes one): give the forward "
                "these keywords, or compile without --generate"
            )
        hub = sys.modules.get("transformers")
        hf = hub is not None and isinstance(model, hub.PreTrainedModel)
        return cls(word, frozenset(params), hf)


class DecodingStep(nn.Module):
    """One decoding call of ``model``; its logits at each row's last token."""

    def __init__(self, model: nn.Module, call: StepCall) -> None:
        super().__init__()
        self.model, self.call = model, call

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        kv: list[torch.Tensor],
    ) -> torch.Tensor:
        cache = (hf_row_cache if self.call.hf else RowCache)(kv, positions)
        return _last_logits(self.model, self.call, cache, ids, positions, mask)


def _last_logits(
    model: nn.Module,
    call: StepCall,
    cache: object,
    ids: torch.Tensor,
    positions: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """The model's logits at each row's last token, called for one step with ``cache``."""
    words = {"position_ids": positions, "attention_mask": mask, call.cache_word: cache}
    if "use_cache" in call.keywords:
        words["use_cache"] = True
    if "logits_to_keep" in call.keywords:
        words["logits_to_keep"] = 1
    out = model(ids, **words)
    logits = getattr(out, "logits", None)
    if logits is None:
        logits = out[0] if isinstance(out, (tuple, list)) else out
    return logits[:, -1, :]


def causal_mask(positions: torch.Tensor, length: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask (rows, 1, tokens, length): 0 where key position j <= the query's
    position, the dtype's lowest value elsewhere."""
    keys = torch.arange(length, device=positions.device)
    seen = keys.view(1, 1, 1, -1) <= positions[:, None, :, None]
    mask = torch.zeros(seen.shape, dtype=dtype, device=positions.device)
    return mask.masked_fill_(~seen, torch.finfo(dtype).min)


def layer_shapes(model: nn.Module, call: StepCall, layers_hint: int) -> list[tuple[int, int]]:
    """Each attention layer's (key/value heads, head size), from one eager call on two
    tokens (on the model's device: the meta device for a model without weights).

    Raises:
        GenerateError: the call fails, or writes no cache (naming where).
    """
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    dtype = float_dtype(model)
    ids = torch.zeros((1, 2), dtype=torch.long, device=device)
    positions = torch.arange(2, device=device).view(1, 2)
    cache, probe = probe_layers(call, layers_hint)
    try:
        with torch.no_grad():
            _last_logits(model, call, cache, ids, positions, causal_mask(positions, 2, dtype))
    except Exception as err:
        raise _refusal(model, f"run {type(model).__name__} with a KV cache", err) from None
    if not probe.shapes or sorted(probe.shapes) != list(range(len(probe.shapes))):
        raise GenerateError(
            f"{type(model).__name__} wrote no KV cache of layers 0..N-1 through its "
            f"{call.cache_word} keyword (it wrote layers {sorted(probe.shapes)}): its "
            "attention must call cache.update(key, value, layer_idx); compile without --generate"
        )
    return [probe.shapes[i] for i in range(len(probe.shapes))]


def float_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the model's first floating-point parameter (float32 where none)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def trace_step(
    model: nn.Module,
    call: StepCall,
    shapes: list[tuple[int, int]],
    *,
    kind: str,
    rows: int,
    max_length: int,
) -> fx.GraphModule:
    """The ``kind`` ("prefill" or "decode") step of ``model`` (in eval mode) as a graph: the
    prefill of one row, the decode of up to ``rows`` rows, over caches of ``max_length``
    positions.

    Raises:
        GenerateError: torch.export cannot capture it (the reason and the model's line).
    """
    from torch.export import Dim

    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    dtype = float_dtype(model)
    n, tokens = (1, min(3, max_length)) if kind == "prefill" else (min(2, rows), 1)
    kv = [
        torch.zeros((n, heads, max_length, size), dtype=dtype, device=device)
        for heads, size in shapes
        for _ in (0, 1)
    ]
    ids = torch.zeros((n, tokens), dtype=torch.long, device=device)
    positions = torch.arange(tokens, device=device).repeat(n, 1)
    args = (ids, positions, causal_mask(positions, max_length, dtype), kv)
    if kind == "prefill":
        t = Dim("tokens", min=2, max=max(2, max_length))
        dims: tuple[object, ...] | None = ({1: t}, {1: t}, {2: t}, [None] * len(kv))
    else:
        r = Dim("rows", min=1, max=rows) if rows > 1 else None
        dims = ({0: r}, {0: r}, {0: r}, [{0: r}] * len(kv)) if r else None
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), quiet_logs(*_QUIET), held_stderr():
            program = torch.export.export(
                DecodingStep(model, call), args, dynamic_shapes=dims, strict=False
            )
    except Exception as err:
        raise _refusal(model, f"trace {type(model).__name__}'s {kind} step", err) from None
    finally:
        model.train(was_training)
    module = program.module()
    views_as_reshapes(module)  # the layout traced on the host is not the one a GPU makes
    return module


def _refusal(model: nn.Module, doing: str, err: BaseException) -> GenerateError:
    """The error that names why the step failed and the line of the model's code."""
    here = Path(__file__).resolve().parents[1]
    frame = innermost_outside(err, [Path(torch.__file__).parent, here])
    where = f" ({frame.filename}, line {frame.lineno}: {frame.line})" if frame else ""
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return GenerateError(
        f"--generate cannot {doing}: {type(err).__name__}: "
        f"{reason[:300]}{where}; compile without --generate"
    )
