"""Schedules built from a repeated building block (Qi et al., "Pipeline Parallelism with
Controllable Memory", 2024), on two stages per device in a V.

A building block gives, for micro-batch 0, the clock at which each device runs the forward
of its first stage (going down), the forward of its second stage (coming back up), the
input-gradient half ``I`` of its second stage and ``I`` of its first stage. Micro-batch i's
block is the same shifted by 6i clocks: each device has 6 clocks of work per micro-batch
(F, I and W on two stages of one clock each), so in the steady state blocks interlock with
no idle clock, and the block's lifespan (first F to last W on a device) fixes how many
micro-batches a device holds: a short-lived block is a low-memory schedule.

``play_blocks`` turns a block into a program in three steps:

1. **Place the W's.** The W of an ``I`` goes into the first clock after it that no block
   occupies on that device (the oldest waiting W first).
2. **Cap.** Each device may hold at most as many stage-micro-batches as it does in the
   repeated blocks (held from F to W).
3. **Squeeze.** Played as placed, the blocks leave the warm-up and cool-down mostly idle.
   Taken in block-clock order, each instruction moves to the earliest free clock after its
   inputs on its device where the device still holds no more stage-micro-batches (F to W)
   at any clock than the repeated blocks did. Each device's order is the program; the
   memory a device holds depends only on its order, so the squeeze keeps the blocks' peak.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pipecompile.errors import ProgramError
from pipecompile.ir.programs.instr import Instr, Op
from pipecompile.ir.programs.memory_model import device_peak_bytes
from pipecompile.ir.programs.program import Program
from pipecompile.schedules.list_scheduler import stepped
from pipecompile.schedules.record import Bubble
from pipecompile.schedules.zbv import v_placement

__all__ = ["play_blocks", "Block", "idle_bubble"]

# Per device d: clocks of (F of stage d, F of stage 2p-1-d, I of stage 2p-1-d, I of stage d).
Block = Sequence[tuple[int, int, int, int]]
Key = tuple[Op, int, int]  # (op, stage, micro-batch)
PERIOD = 6  # clocks of work per micro-batch per device


def play_blocks(name: str, stages: int, microbatches: int, block: Block) -> Program:
    """The program of ``block`` repeated ``microbatches`` times on ``stages`` (= 2p) stages
    in a V, squeezed as the module doc says."""
    p, m = stages // 2, microbatches
    placement = v_placement(stages)
    placed = [_placed(d, p, m, block[d]) for d in range(p)]
    caps = [_held_peak(times) for times in placed]
    clocks = {key: t for times in placed for key, t in times.items()}
    busy = [set(times.values()) for times in placed]
    for key in sorted(clocks, key=clocks.get):
        d, was = placement[key[1]], clocks[key]
        after = max((clocks[x] + 1 for x in _inputs(key, stages)), default=0)
        free = [c for c in range(after, was) if c not in busy[d]]
        if key[0] == Op.F and free:  # held one clock longer from the new clock on
            room = _room(placed[d], free[0], was, caps[d])
            free = [c for c in free if room[c - free[0]]]
        if free:
            busy[d] ^= {was, free[0]}
            clocks[key] = placed[d][key] = free[0]
    orders = [[Instr(*key) for key in sorted(times, key=times.get)] for times in placed]
    return stepped(name, m, placement, orders)


def _placed(d: int, p: int, m: int, clocks: tuple[int, int, int, int]) -> dict[Key, int]:
    """Device d's instructions of every block, keyed (op, stage, micro-batch), at their block
    clocks, with the W's placed into the free clocks."""
    first, second = d, 2 * p - 1 - d
    kinds = ((Op.F, first), (Op.F, second), (Op.I, second), (Op.I, first))
    times = {
        (op, j, i): clock + PERIOD * i
        for i in range(m)
        for (op, j), clock in zip(kinds, clocks, strict=True)
    }
    by_clock = {t: key for key, t in times.items()}
    if len(by_clock) != len(times):
        raise ProgramError(f"building block of device {d} puts two instructions on one clock")
    pending: list[tuple[int, int]] = []  # (stage, micro-batch) whose W waits, oldest first
    clock, end = 0, max(by_clock)
    while clock <= end or pending:
        key = by_clock.get(clock)
        if key is not None:
            if key[0] == Op.I:
                pending.append(key[1:])
        elif pending:
            times[(Op.W, *pending.pop(0))] = clock
        clock += 1
    return times


def _held_peak(times: dict[Key, int]) -> int:
    """Most stage-micro-batches one device holds at once (F to W) at these clocks."""
    order = [Instr(*key) for key in sorted(times, key=times.get)]
    ones = [1] * (1 + max(j for _, j, _ in times))
    return device_peak_bytes(order, ones, ones)


def _room(times: dict[Key, int], start: int, end: int, cap: int) -> list[bool]:
    """For each clock c in [start, end): whether one more stage-micro-batch held from c to
    ``end`` keeps the device within ``cap`` at every clock."""
    held = 0
    at = [0] * (end - start)
    ordered = sorted(times.items(), key=lambda item: item[1])
    k = 0
    for c in range(end):
        while k < len(ordered) and ordered[k][1] <= c:
            held += {Op.F: 1, Op.W: -1}.get(ordered[k][0][0], 0)
            k += 1
        if c >= start:
            at[c - start] = held
    room, worst = [False] * len(at), 0
    for c in range(len(at) - 1, -1, -1):  # the most held from c to the end of the interval
        worst = max(worst, at[c])
        room[c] = worst < cap
    return room


def _inputs(key: Key, stages: int) -> list[Key]:
    """What instruction ``key`` waits for: what it consumes, and its stage's previous
    micro-batch of the same kind (a stage runs each kind in micro-batch order)."""
    op, j, i = key
    before = [(op, j, i - 1)] if i > 0 else []
    if op == Op.F:
        return before + ([(Op.F, j - 1, i)] if j > 0 else [])
    if op == Op.I:
        return before + [(Op.F, j, i)] + ([(Op.I, j + 1, i)] if j < stages - 1 else [])
    return before + [(Op.I, j, i)]


def idle_bubble(idle: Callable[[int], int]) -> Bubble:
    """The bubble of a schedule that repeats a block leaving ``idle(p)`` units of a device
    idle: idle / (6m + idle), for m >= p (each micro-batch's F, B and W on two stages)."""

    def bubble(p: int, m: int, v: int) -> float | None:
        return idle(p) / (6 * m + idle(p)) if m >= p else None

    return bubble
