"""``--compile``: each stage's forward runs through ``torch.compile``; a stage it cannot
compile runs eagerly, with a one-line note.

Each stage module is wrapped once (``torch.compile(module)``), so every stage keeps its own
compiled code; a weight-stashed forward calls the wrapper through ``functional_call`` with the
micro-batch's stashed leaves, which Dynamo takes as inputs like the module's own parameters.
Random ops keep their seeds: Inductor is told to draw from torch's generators
(``fallback_random``), which ``seeded`` and ``seed_op`` set, so a compiled stage draws the
dropout masks of the eager one and a recomputation replays them.

The backward of a compiled forward is one piece (AOTAutograd's), so it cannot be split into the
input gradients (I) and the weight gradients (W) of a zero-bubble schedule: there, I computes
both at once (``fused``) and W has nothing left to do. Gradients are unchanged; the schedule's
W slots are then free.

A compile that fails (Dynamo or the backend raising, a C++ compiler missing) is caught the
first time a stage meets a new kind of input: its buffers and random state are put back as
they were, a note names the stage and the reason, and the stage runs eagerly from then on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from pipecompile.errors import PipecompileError
from pipecompile.ir.graph.swapped_call import functional_call
from pipecompile.options.run import BACKENDS
from pipecompile.runtime.process import notes
from pipecompile.runtime.state.random_state import break_graphs_at_seeding

__all__ = ["BACKENDS", "CompiledStages", "check_backend", "resolve_backend"]

_PREFIX = "_orig_mod."  # where torch.compile's wrapper keeps the module


def check_backend(name: str | None, what: str) -> None:
    """Refuse a backend name torch.compile's stages cannot take, when it is given (``what``:
    the option or keyword that gave it)."""
    if name is not None and name not in (*BACKENDS, "off"):
        raise PipecompileError(
            f"{what} {name!r} is not a torch.compile backend pipecompile runs stages with; "
            f"choose one of {', '.join(BACKENDS)}, or off"
        )


def resolve_backend(asked: str | None, recorded: str | None) -> str | None:
    """The backend a run uses: what it asked for (``off``: none), else what the compile
    recorded in the manifest, else none.

    Raises:
        PipecompileError: either names no backend stages can be compiled with.
    """
    check_backend(asked, "compile")
    check_backend(recorded, "the compiled directory's compile")
    chosen = asked if asked is not None else recorded
    return None if chosen in (None, "off") else chosen


class CompiledStages:
    """The compiled forwards of the stages a process holds."""

    def __init__(
        self,
        modules: Sequence[nn.Module | None],
        backend: str,
        note: Callable[[str], None] | None = None,
        *,
        announce: bool = True,
    ) -> None:
        """``note`` prints a line (default: to stderr); ``announce``: say which stages
        compile."""
        if backend not in BACKENDS:
            raise ValueError(f"unknown torch.compile backend {backend!r}")
        if backend == "inductor":
            import torch._inductor.config as inductor

            inductor.fallback_random = True  # draw from torch's (seeded) generators
        break_graphs_at_seeding()
        self.backend = backend
        self.note = note or notes.note
        self._wrapped = {
            j: torch.compile(m, backend=backend) for j, m in enumerate(modules) if m is not None
        }
        self._seen: set[tuple[Any, ...]] = set()
        self.failed: dict[int, str] = {}  # stage -> why it runs eagerly
        if announce and self._wrapped:
            self.note(
                f"stage forwards run through torch.compile ({backend}), each compiled on its "
                "first call (the first step is slower)"
            )

    def active(self, j: int) -> bool:
        """Whether stage ``j``'s forward runs compiled."""
        return j in self._wrapped and j not in self.failed

    def call(
        self, j: int, module: nn.Module, args: list[Any], weights: dict[str, torch.Tensor] | None
    ) -> tuple[Any, ...] | None:
        """Stage ``j``'s forward, compiled; None when it cannot be compiled (the stage then
        runs eagerly: the caller calls ``module`` itself, with its state as it was)."""
        wrapped = self._wrapped[j]
        key = (j, torch.is_grad_enabled(), module.training, _signature(args))
        state = None if key in self._seen else _state(module)
        try:
            if weights is None:
                outs = wrapped(*args)
            else:
                leaves = {_PREFIX + n: t for n, t in weights.items()}
                outs = functional_call(wrapped, leaves, tuple(args))
        except torch._dynamo.exc.TorchDynamoException as err:
            if state is not None:
                _restore(module, state)
            self.failed[j] = _reason(err)
            self.note(
                f"stage {j}: torch.compile ({self.backend}) could not compile its forward "
                f"({self.failed[j]}); it runs eagerly"
            )
            return None
        self._seen.add(key)
        return tuple(outs)


def _signature(args: list[Any]) -> tuple[Any, ...]:
    return tuple(
        (tuple(a.shape), a.dtype, a.requires_grad) if isinstance(a, torch.Tensor) else type(a)
        for a in args
    )


def _state(module: nn.Module) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """What a failed first call may have changed: the buffers (BatchNorm statistics) and the
    random state."""
    buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
    return buffers, torch.get_rng_state()


def _restore(module: nn.Module, state: tuple[dict[str, torch.Tensor], torch.Tensor]) -> None:
    buffers, rng = state
    with torch.no_grad():
        for name, buffer in module.named_buffers():
            buffer.copy_(buffers[name])
    torch.set_rng_state(rng)


def _reason(err: BaseException) -> str:
    inner = getattr(err, "inner_exception", None) or err.__cause__ or err
    first = (str(inner).strip().splitlines() or [""])[0]
    return f"{type(inner).__name__}: {first}"[:200]
