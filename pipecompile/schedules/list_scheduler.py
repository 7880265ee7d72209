"""Schedules written by playing them: a list scheduler over uniform costs.

Some schedules are easiest to state as rules rather than as loops: "whenever a device is free,
run its most urgent ready instruction, and start a new forward only while it holds fewer than
its cap of micro-batches". ``list_schedule`` plays those rules with F = I = W = 1 clock (B = 2
when the backward is not split), no communication time, and records the order each device ran
its instructions in: that order is the program. The rules, for every device at every clock:

1. a backward (I, or B) is most urgent: the earliest micro-batch first, then the later stage
   (the one nearer the loss) first;
2. then a forward, if the device holds fewer stage-micro-batches than its cap: the earliest
   micro-batch first, then the later stage (depth first: a micro-batch goes on down the
   pipeline before a new one enters);
3. then a W (weight gradients) of the earliest micro-batch, later stage first.

With ``forward_first`` rules 1 and 2 swap: a ready forward (within the cap) goes before a
ready backward. With ``fill_drain`` a device starts no backward before it has run every
forward of its stages (GPipe's order).

An instruction is ready when what it consumes is done: F(j, i) after F(j-1, i); I or B(j, i)
after F(j, i) and the backward of (j+1, i); W(j, i) after I(j, i). Given a ``graph`` (each
stage's producer and consumer stages), F(j, i) waits for the forwards of j's producers and
the backward of (j, i) for its consumers' instead. A stage runs its forwards, its backwards
and its W's each in micro-batch order. A stage-micro-batch is held from its F to its last
backward (B, or W when split).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipecompile.errors import ProgramError
from pipecompile.ir.programs.instr import Instr, Op
from pipecompile.ir.programs.program import Program

__all__ = ["Links", "list_schedule", "stepped"]


@dataclass(frozen=True)
class Links:
    """Which stages each stage reads from (``producers``) and feeds (``consumers``)."""

    producers: tuple[tuple[int, ...], ...]
    consumers: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, stages: int, edges: frozenset[tuple[int, int]]) -> Links:
        """The links of ``stages`` stages joined by (producer, consumer) ``edges``."""
        return cls(
            tuple(tuple(sorted(s for s, t in edges if t == j)) for j in range(stages)),
            tuple(tuple(sorted(t for s, t in edges if s == j)) for j in range(stages)),
        )

    @classmethod
    def chain(cls, stages: int) -> Links:
        return cls(
            tuple((j - 1,) if j else () for j in range(stages)),
            tuple((j + 1,) if j < stages - 1 else () for j in range(stages)),
        )


def list_schedule(
    name: str,
    stage_device: Sequence[int],
    microbatches: int,
    caps: Sequence[int],
    *,
    split: bool,
    forward_first: bool = False,
    fill_drain: bool = False,
    graph: Links | None = None,
) -> Program:
    """The program the rules above give for stages placed by ``stage_device`` and at most
    ``caps[d]`` stage-micro-batches held on device d (each at least 1)."""
    stages, m = len(stage_device), microbatches
    links = graph or Links.chain(stages)
    forwards = [m * sum(1 for on in stage_device if on == d) for d in range(max(stage_device) + 1)]
    devices = max(stage_device) + 1
    back = Op.I if split else Op.B
    cost = {Op.F: 1, Op.I: 1, Op.W: 1, Op.B: 2}
    done: dict[tuple[Op, int, int], int] = {}  # finished at clock
    issued = {(op, j): 0 for op in (Op.F, back, Op.W) for j in range(stages)}  # next micro-batch
    held = [0] * devices
    free_at = [0] * devices
    running: list[tuple[int, Op, int, int] | None] = [None] * devices  # (end, op, stage, mb)
    orders: list[list[Instr]] = [[] for _ in range(devices)]
    total = stages * m * (3 if split else 2)
    placed = 0  # instructions ordered so far
    forwarded = [0] * devices  # forwards ordered so far, per device
    clock = 0
    while placed < total or any(running):
        for d in range(devices):  # finish what ends now
            work = running[d]
            if work is not None and work[0] <= clock:
                _, op, j, i = work
                done[(op, j, i)] = work[0]
                if op == (Op.W if split else Op.B):
                    held[d] -= 1
                running[d] = None
        for d in range(devices):
            if running[d] is not None or free_at[d] > clock:
                continue
            state = (d, stage_device, m, links, back, split, issued, done, clock)
            filling = fill_drain and forwarded[d] < forwards[d]
            pick = _most_urgent(*state, forward_first=forward_first or filling)
            if filling and (pick is None or pick[0] != Op.F):
                pick = None  # a backward waits until every forward here has run
            elif pick is None or (pick[0] == Op.F and held[d] >= caps[d]):
                pick = _most_urgent(*state, forward=False)
            if pick is None:
                continue
            op, j, i = pick
            issued[(op, j)] += 1
            placed += 1
            if op == Op.F:
                held[d] += 1
                forwarded[d] += 1
            end = clock + cost[op]
            running[d], free_at[d] = (end, op, j, i), end
            orders[d].append(Instr(op, j, i))
        clock += 1
        if clock > 4 * total + 4 * stages:
            raise ProgramError(f"{name}: the list scheduler made no progress (caps {list(caps)})")
    return stepped(name, m, stage_device, orders)


def stepped(
    name: str, microbatches: int, stage_device: Sequence[int], orders: Sequence[Sequence[Instr]]
) -> Program:
    """The program running ``orders[d]`` on device d, then a ``STEP`` of each stage it holds."""
    return Program(
        name,
        microbatches,
        tuple(stage_device),
        tuple(
            tuple(order) + tuple(Instr(Op.STEP, j) for j, on in enumerate(stage_device) if on == d)
            for d, order in enumerate(orders)
        ),
    )


def _most_urgent(
    d: int,
    stage_device: Sequence[int],
    m: int,
    links: Links,
    back: Op,
    split: bool,
    issued: dict[tuple[Op, int], int],
    done: dict[tuple[Op, int, int], int],
    clock: int,
    *,
    forward: bool = True,
    forward_first: bool = False,
) -> tuple[Op, int, int] | None:
    """Device d's most urgent ready instruction (``forward`` False: no F)."""
    mine = [j for j in range(len(stage_device)) if stage_device[j] == d]
    kinds = ([Op.F, back] if forward_first else [back, Op.F]) + [Op.W]
    if not forward:
        kinds.remove(Op.F)
    if not split:
        kinds = [k for k in kinds if k != Op.W]
    for op in kinds:
        ready = []
        for j in mine:
            i = issued[(op, j)]
            if i < m and _ready(op, j, i, links, back, done, clock):
                ready.append((i, -j, op, j))
        if ready:
            _, _, op, j = min(ready)
            return op, j, issued[(op, j)]
    return None


def _ready(
    op: Op, j: int, i: int, links: Links, back: Op, done: dict[tuple[Op, int, int], int], clock: int
) -> bool:
    def finished(key: tuple[Op, int, int]) -> bool:
        return key in done and done[key] <= clock

    if op == Op.F:
        return all(finished((Op.F, s, i)) for s in links.producers[j])
    if op == back:
        return finished((Op.F, j, i)) and all(finished((back, t, i)) for t in links.consumers[j])
    return finished((back, j, i))  # W
