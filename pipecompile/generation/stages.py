"""One decoding stage at run time: its prefill and decode modules (the compiled directory's
``prefill_stage_<j>.py`` and ``decode_stage_<j>.py``, built on the meta device and given
their tensors) and the KV cache of its blocks: for each block, keys and values of shape
(lanes, rows, heads, max length, head size), allocated once, zeroed, and written in place by
the modules at the positions each call gives. A lane is one group of sequences in flight; a
row one sequence of it. Positions past a row's own are masked, so what an earlier sequence
left there is never read.

A call runs one lane's turn: the prefill of the rows that start a sequence (each alone, its
prompt's tokens at positions 0..P-1) and the decode of the rows that continue one (together,
one token each at its own position). The first stage takes token ids, the others the values
the stage before hands on; the last gives each row's logits at its last position."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from pipecompile.files.names import decode_file, prefill_file
from pipecompile.generation.step_trace import GenerateError, causal_mask
from pipecompile.ir.records.generation_plan import DTYPES, GenerationPlan

__all__ = ["Call", "Rows", "DecodeStage", "stage_modules_from", "stage_class"]


@dataclass(frozen=True)
class Rows:
    """The rows of one lane a call runs, and each one's positions (rows x tokens)."""

    rows: tuple[int, ...]
    positions: torch.Tensor  # int64 (len(rows), tokens)

    def index(self) -> slice | torch.Tensor:
        """The rows of a lane's cache: a slice where they are consecutive (a view, no copy)."""
        first, n = self.rows[0], len(self.rows)
        if self.rows == tuple(range(first, first + n)):
            return slice(first, first + n)
        return torch.tensor(self.rows, dtype=torch.long)


@dataclass(frozen=True)
class Call:
    """One batch of a lane's turn: its rows and their positions."""

    rows: Rows

    @property
    def tokens(self) -> int:
        return int(self.rows.positions.shape[1])

    @property
    def kind(self) -> str:
        return "prefill" if self.tokens > 1 else "decode"


def stage_class(kind: str, j: int) -> str:
    """The class a stage file defines: ``DecodeStage<j>`` or ``PrefillStage<j>``."""
    return f"{kind.capitalize()}Stage{j}"


def stage_modules_from(
    read: Callable[[str], str],
    plan: GenerationPlan,
    j: int,
    tensors: dict[str, torch.Tensor],
    device: torch.device | str = "cpu",
    folder: Path | None = None,
) -> dict[str, nn.Module]:
    """Stage ``j``'s decode and prefill modules, their sources read by file name with
    ``read`` (from ``folder``, as messages name them), built on the meta device and given
    ``tensors`` (by the stage's names; both modules share them).

    Raises:
        GenerateError: a tensor is missing or has another shape (naming it).
    """
    out = {}
    for kind, name in (("decode", decode_file(j)), ("prefill", prefill_file(j))):
        module = _built(read, name, stage_class(kind, j), folder)
        wanted = module.state_dict(keep_vars=True)
        missing = [n for n in wanted if n not in tensors]
        if missing:
            raise GenerateError(
                f"the weights lack {', '.join(missing[:3])} of decoding stage {j} "
                f"({name}); pass the weights this model was compiled or trained with"
            )
        given = {}
        for n, t in wanted.items():
            value = tensors[n]
            if tuple(value.shape) != tuple(t.shape):
                raise GenerateError(
                    f"{n} of decoding stage {j} ({name}) has shape {tuple(value.shape)} in the "
                    f"weights, {tuple(t.shape)} in the stage: pass the weights this model was "
                    "compiled or trained with"
                )
            given[n] = value.to(device=device, dtype=t.dtype)
        module.load_state_dict(given, assign=True)
        out[kind] = module.eval()
    return out


def _built(read: Callable[[str], str], name: str, cls: str, folder: Path | None) -> nn.Module:
    """Class ``cls`` of the stage file ``name``, built on the meta device.

    Raises:
        GenerateError: the file is missing, or damaged (it does not run or define ``cls``).
    """
    shown = str(folder / name) if folder is not None else name
    try:
        source = read(name)  # (GenerateError: changed since the compile)
    except OSError as err:
        raise GenerateError(
            f"{shown} cannot be read ({err.strerror or err}): recompile with --generate"
        ) from None
    scope: dict[str, object] = {"__name__": f"pipecompile_generated_{cls}"}
    try:
        exec(compile(source, shown, "exec"), scope)  # the file pipecompile wrote
        with torch.device("meta"):
            return scope[cls]()  # type: ignore[operator,no-any-return]
    except Exception as err:
        first = str(err).splitlines()[0] if str(err) else ""
        raise GenerateError(
            f"{shown} is damaged ({type(err).__name__}: {first}): recompile with --generate"
        ) from None


class DecodeStage:
    """Stage ``index`` of ``plan`` running ``modules`` (``stage_modules_from``)."""

    def __init__(
        self,
        plan: GenerationPlan,
        index: int,
        modules: dict[str, nn.Module],
        device: torch.device | str = "cpu",
    ) -> None:
        self.plan, self.index, self.count = plan, index, plan.stages
        self.lanes, self.rows, self.max_length = plan.lanes, plan.rows, plan.max_length
        self.modules, self.device = modules, torch.device(device)
        self.dtype = DTYPES[plan.dtype]
        # the stage files make what they create (aranges, masks) on the default device
        self._here: AbstractContextManager[object] = (
            self.device if self.device.type != "cpu" else nullcontext()
        )
        self.cache = [
            torch.zeros(plan.cache_shape(i), dtype=self.dtype, device=device)
            for i in plan.stage_layers(index)
            for _ in (0, 1)
        ]

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    @property
    def cache_bytes(self) -> int:
        return sum(t.nbytes for t in self.cache)

    def takes(self, call: Call) -> int:
        """How many values a call brings this stage (the ids, on the first)."""
        return 1 if self.first else self.plan.stages_[self.index - 1].sends[call.kind]

    @torch.no_grad()
    def run(self, lane: int, calls: list[Call], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The values each call hands on, in order (``inputs`` likewise: each call's
        ``takes``); on the last stage each call's logits at its rows' last positions
        (rows, vocabulary), in float32, on this stage's device; inputs elsewhere are
        moved here first."""
        outs: list[torch.Tensor] = []
        given = iter(inputs)
        for call in calls:
            xs = [next(given).to(self.device) for _ in range(self.takes(call))]
            positions = call.rows.positions.to(self.device)
            index = call.rows.index()  # a slice (a view, written in place) where consecutive
            if not isinstance(index, slice):
                index = index.to(self.device)
            kv = [t[lane][index] for t in self.cache]
            mask = causal_mask(positions, self.max_length, self.dtype)
            module = self.modules["prefill" if call.tokens > 1 else "decode"]
            with self._here:
                out = module(*xs, positions, mask, *kv)
            if not isinstance(index, slice):  # rows gathered: their caches written back
                for t, part in zip(self.cache, kv):
                    t[lane][index] = part
            if self.last:
                outs.append(out.float())
            else:
                outs.extend(out)
        return outs
