"""What each instruction waits for: the dependency rules shared by the verifier and simulator.

A program's compute instructions depend on each other through the stage graph: a forward on
its producers' forwards, a backward on its own forward and its consumers' input gradients.
Where a program carries communication, a cross-device value arrives by RECV_F/RECV_B after
the producer's SEND_F/SEND_B; in a compute-only program it arrives directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipecompile.ir.programs.instr import FORWARD_OPS, INPUT_GRADIENT_OPS, STEP_OPS, Instr, Op
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.topology import Topology

__all__ = ["Facts", "requirements"]

_COMM = frozenset({Op.SEND_F, Op.RECV_F, Op.SEND_B, Op.RECV_B})


@dataclass(frozen=True)
class Facts:
    """Per-program facts the rules need: which forward/backward form each (j, i) uses."""

    stage_device: tuple[int, ...]
    microbatches: int
    producers: tuple[tuple[int, ...], ...]
    consumers: tuple[tuple[int, ...], ...]
    forward: dict[tuple[int, int], Op]  # (j, i) -> Op.F or Op.FC
    split: frozenset[tuple[int, int]]  # (j, i) whose backward is I then W
    stashed: frozenset[tuple[int, int]]
    communicates: bool
    tie_peers: tuple[tuple[int, ...], ...]  # stage j -> stages sharing a parameter with it
    replicated: frozenset[int]  # stages with an ALLREDUCE_REPLICAS

    @classmethod
    def of(cls, program: Program, topology: Topology) -> Facts:
        n = topology.num_stages
        forward, split, stashed, replicated = {}, set(), set(), set()
        communicates = False
        for _, _, x in program.instructions():
            key = (x.stage, x.microbatch or 0)
            if x.op in FORWARD_OPS:
                forward[key] = x.op
            elif x.op == Op.I:
                split.add(key)
            elif x.op == Op.STASH:
                stashed.add(key)
            elif x.op == Op.ALLREDUCE_REPLICAS:
                replicated.add(x.stage)
            communicates |= x.op in _COMM
        return cls(
            stage_device=program.stage_device,
            microbatches=program.microbatches,
            producers=tuple(
                tuple(sorted({s for s, t in topology.edges if t == j})) for j in range(n)
            ),
            consumers=tuple(
                tuple(sorted({t for s, t in topology.edges if s == j})) for j in range(n)
            ),
            forward=forward,
            split=frozenset(split),
            stashed=frozenset(stashed),
            communicates=communicates,
            replicated=frozenset(replicated),
            tie_peers=tuple(
                tuple(sorted({s for g in topology.tie_groups if j in g for s in g}))
                for j in range(n)
            ),
        )

    def forward_of(self, j: int, i: int) -> Instr:
        return Instr(self.forward.get((j, i), Op.F), j, i)

    def input_grad_of(self, j: int, i: int) -> Instr:
        """The instruction after which stage j's input gradients for micro-batch i exist."""
        return Instr(Op.I if (j, i) in self.split else "B", j, i)

    def last_backward_of(self, j: int, i: int) -> Instr:
        """The instruction after which micro-batch i is finished on stage j."""
        return Instr(Op.W if (j, i) in self.split else "B", j, i)

    def remote(self, a: int, b: int) -> bool:
        return self.stage_device[a] != self.stage_device[b]


def requirements(instr: Instr, facts: Facts) -> list[Instr]:
    """The instructions that must have finished before ``instr`` may start."""
    j, i = instr.stage, instr.microbatch if instr.microbatch is not None else 0
    op = instr.op
    via_messages = facts.communicates
    if op in FORWARD_OPS:
        needs = [Instr(Op.STASH, j, i)] if (j, i) in facts.stashed else []
        for s in facts.producers[j]:
            if not (via_messages and facts.remote(s, j)):
                needs.append(facts.forward_of(s, i))
        if via_messages and any(facts.remote(s, j) for s in facts.producers[j]):
            needs.append(Instr(Op.RECV_F, j, i))
        return needs
    if op in INPUT_GRADIENT_OPS:
        needs = [facts.forward_of(j, i)]
        for t in facts.consumers[j]:
            if not (via_messages and facts.remote(j, t)):
                needs.append(facts.input_grad_of(t, i))
        if via_messages and any(facts.remote(j, t) for t in facts.consumers[j]):
            needs.append(Instr(Op.RECV_B, j, i))
        return needs
    if op == Op.W:
        return [Instr(Op.I, j, i)]
    if op == Op.SEND_F:
        return [facts.forward_of(j, i)]
    if op == Op.SEND_B:
        return [facts.input_grad_of(j, i)]
    if op == Op.RECV_F:
        return [Instr(Op.SEND_F, s, i) for s in facts.producers[j] if facts.remote(s, j)]
    if op == Op.RECV_B:
        return [Instr(Op.SEND_B, t, i) for t in facts.consumers[j] if facts.remote(j, t)]
    if op == Op.UPDATE:  # a tied stage (PipeDream-2BW) updates once its peers contributed
        peers = [Instr(Op.ALLREDUCE_TIED, s, i) for s in facts.tie_peers[j]]
        return [facts.last_backward_of(j, i), *peers]
    if op == Op.ALLREDUCE_TIED and instr.microbatch is not None:  # one window's gradients
        return [facts.last_backward_of(j, i)]
    if op in STEP_OPS:
        needs = [facts.last_backward_of(j, k) for k in range(facts.microbatches)]
        if op == Op.STEP:  # a tied stage steps once every holder has contributed its gradient
            needs += [Instr(Op.ALLREDUCE_TIED, s) for s in facts.tie_peers[j]]
            needs += [Instr(Op.ALLREDUCE_REPLICAS, j)] * (j in facts.replicated)
        return needs
    return []
