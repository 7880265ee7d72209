"""The facts of one schedule, declared beside its generator: what the compiler, the plan search,
the runtime's checks and the reports know of it. Every list of schedules anywhere in
pipecompile is derived from these records (``pipecompile.schedules.REGISTRY``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pipecompile.ir.programs.program import Program

__all__ = ["Bubble", "GraphRule", "Placement", "Schedule"]

# "one": stage j on device j; "looped": v stages a device, stage j on device j mod p (the
# option --virtual-stages, default 2); "v": two stages a device, in a V (stage j and 2p-1-j)
Placement = Literal["one", "looped", "v"]
Bubble = Callable[[int, int, int], "float | None"]
# how a schedule orders a stage graph's instructions (schedules/on_graphs.py): "fill_drain"
# every forward then every backward, "one_f_one_b" a backward first within a cap of
# micro-batches held, "zero_bubble" that with the backward split (I, then W)
GraphRule = Literal["fill_drain", "one_f_one_b", "zero_bubble"]


@dataclass(frozen=True)
class Schedule:
    """One schedule.

    Attributes:
        name: what ``--schedule`` takes and the program records.
        build: the generator, ``(stages, microbatches, *options) -> Program`` (``options``:
            virtual stages for a looped placement, vertical sync for pipedream).
        synchronous: a step equals single-device training on the mini-batch (gradients
            accumulate and one optimizer step follows); False: weights update per micro-batch.
        placement: where its stages run (``Placement``).
        split_backward: its backward runs as two instructions, input gradients (I) then
            weight gradients (W), as the zero-bubble schedules do.
        replicable: the plan search may give each stage replicas (data-parallel copies).
        bubble: the bubble fraction with uniform costs (F = I = W = 1, B = 2 a stage) as its
            paper states it, from (devices, micro-batches, stages a device); None where it
            has no closed form for that shape.
        takes: the options its generator takes after stages and micro-batches, in order
            (``virtual_stages``, ``vertical_sync``).
        aliases: other names its programs carry (a variant's, such as ``pipedream-vsync``).
        weight_versions: the weights a micro-batch's forward and backward see: ``step``
            (synchronous: the step's one version), ``stage`` (PipeDream: each stage the
            version it stashed for that micro-batch, its own), ``window`` (PipeDream-2BW: one
            version per window of micro-batches on every stage, one update stale).
        on_graph: how it runs a stage graph (branches on devices of their own, joined where
            the model joins them; ``GraphRule``), or None: it runs chains only.
    """

    name: str
    build: Callable[..., Program]
    synchronous: bool
    placement: Placement
    split_backward: bool
    replicable: bool
    bubble: Bubble
    takes: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    weight_versions: Literal["step", "stage", "window"] = "step"
    on_graph: GraphRule | None = None

    def stages_a_device(self, virtual_stages: int | None = None) -> int:
        """How many stages it places on one device (``virtual_stages``: a looped one's)."""
        if self.placement == "v":
            return 2
        if self.placement == "looped":
            return 2 if virtual_stages is None else max(virtual_stages, 1)
        return 1


def fill_drain(p: int, m: int, v: int) -> float | None:
    """GPipe's and 1F1B's bubble: (p - 1) / (m + p - 1)."""
    return (p - 1) / (m + p - 1)


def zero_bubble(p: int, m: int, v: int) -> float | None:
    """ZB-H1's and ZB-H2's (split backward, one stage a device): (p - 1) / (3m + p - 1),
    for m >= p."""
    return (p - 1) / (3 * m + p - 1) if m >= p else None
