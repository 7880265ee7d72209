"""Check a program before it runs: counts, order, matching communication, and no deadlock."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pipecompile.errors import ProgramError
from pipecompile.instr import Instr
from pipecompile.program import Program

__all__ = ["Topology", "verify_program", "show_around"]


@dataclass(frozen=True)
class Topology:
    """What a program needs to know about the stages: who feeds whom, who shares parameters."""

    num_stages: int
    edges: frozenset[tuple[int, int]]  # (producer stage, consumer stage)
    tie_groups: tuple[tuple[int, ...], ...] = ()


def verify_program(program: Program, topology: Topology) -> None:
    """Raise ProgramError, showing the instructions around the problem, if ``program`` is bad."""
    if program.num_stages != topology.num_stages:
        raise ProgramError(
            f"program places {program.num_stages} stages but the model has {topology.num_stages}"
        )
    if len(program.devices) != max(program.stage_device) + 1:
        raise ProgramError(
            f"program lists {len(program.devices)} devices but its stage -> device map "
            f"uses {max(program.stage_device) + 1}"
        )
    _check_placement(program)
    _check_counts(program, topology)
    _simulate(program, topology)


def show_around(program: Program, device: int, position: int, radius: int = 3) -> str:
    """The instructions of ``device`` near ``position``, the one at ``position`` marked."""
    instrs = program.devices[device]
    lo, hi = max(0, position - radius), min(len(instrs), position + radius + 1)
    rows = [f"device {device}:"]
    for k in range(lo, hi):
        mark = ">>" if k == position else "  "
        rows.append(f"  {mark} [{k}] {instrs[k]}")
    if position >= len(instrs):
        rows.append(f"  >> [{position}] (end of device {device})")
    return "\n".join(rows)


def _check_placement(program: Program) -> None:
    for d, k, instr in program.instructions():
        if not 0 <= instr.stage < program.num_stages:
            raise ProgramError(f"no stage {instr.stage}\n{show_around(program, d, k)}")
        if program.stage_device[instr.stage] != d:
            raise ProgramError(
                f"{instr} runs on device {d} but stage {instr.stage} is placed on device "
                f"{program.stage_device[instr.stage]}\n{show_around(program, d, k)}"
            )


def _expected(program: Program, topology: Topology) -> Counter[Instr]:
    device = program.stage_device
    remote = {(s, t) for s, t in topology.edges if device[s] != device[t]}
    tied = {j for group in topology.tie_groups for j in group}
    want: Counter[Instr] = Counter()
    for j in range(program.num_stages):
        for i in range(program.microbatches):
            want.update([Instr("F", j, i), Instr("B", j, i)])
            if any(s == j for s, _ in remote):
                want.update([Instr("SEND_F", j, i), Instr("RECV_B", j, i)])
            if any(t == j for _, t in remote):
                want.update([Instr("RECV_F", j, i), Instr("SEND_B", j, i)])
        want[Instr("STEP", j)] += 1
        if j in tied:
            want[Instr("ALLREDUCE_TIED", j)] += 1
    return want


def _check_counts(program: Program, topology: Topology) -> None:
    have = Counter(instr for _, _, instr in program.instructions())
    want = _expected(program, topology)
    for instr in sorted(set(have) | set(want)):
        if have[instr] != want[instr]:
            where = _find(program, instr)
            context = f"\n{show_around(program, *where)}" if where else ""
            raise ProgramError(
                f"instruction {instr} appears {have[instr]} times, expected {want[instr]}{context}"
            )


def _find(program: Program, instr: Instr) -> tuple[int, int] | None:
    for d, k, other in program.instructions():
        if other == instr:
            return d, k
    return None


def _simulate(program: Program, topology: Topology) -> None:
    """Run the program on dependencies alone; a state where no device can move is a deadlock."""
    done: set[Instr] = set()
    pcs = [0] * len(program.devices)
    while True:
        moved = False
        for d, instrs in enumerate(program.devices):
            while pcs[d] < len(instrs) and _ready(instrs[pcs[d]], done, pcs, program, topology):
                done.add(instrs[pcs[d]])
                pcs[d] += 1
                moved = True
        if all(pc == len(instrs) for pc, instrs in zip(pcs, program.devices)):
            return
        if not moved:
            stuck = "\n".join(
                show_around(program, d, pc)
                for d, pc in enumerate(pcs)
                if pc < len(program.devices[d])
            )
            raise ProgramError(f"the program deadlocks: no device can proceed\n{stuck}")


def _ready(
    instr: Instr, done: set[Instr], pcs: list[int], program: Program, topo: Topology
) -> bool:
    j, i = instr.stage, instr.microbatch
    device = program.stage_device
    producers = [s for s, t in topo.edges if t == j]
    consumers = [t for s, t in topo.edges if s == j]
    if instr.op == "F":
        local = all(Instr("F", s, i) in done for s in producers if device[s] == device[j])
        remote = any(device[s] != device[j] for s in producers)
        return local and (not remote or Instr("RECV_F", j, i) in done)
    if instr.op == "B":
        local = all(Instr("B", t, i) in done for t in consumers if device[t] == device[j])
        remote = any(device[t] != device[j] for t in consumers)
        return Instr("F", j, i) in done and local and (not remote or Instr("RECV_B", j, i) in done)
    if instr.op == "SEND_F":
        return Instr("F", j, i) in done
    if instr.op == "SEND_B":
        return Instr("B", j, i) in done
    if instr.op == "RECV_F":
        return all(Instr("SEND_F", s, i) in done for s in producers if device[s] != device[j])
    if instr.op == "RECV_B":
        return all(Instr("SEND_B", t, i) in done for t in consumers if device[t] != device[j])
    if instr.op == "ALLREDUCE_TIED":
        peers = {s for group in topo.tie_groups if j in group for s in group}
        return all(_at_or_past(program, pcs, Instr("ALLREDUCE_TIED", s)) for s in peers)
    if instr.op == "STEP":
        return all(Instr("B", j, m) in done for m in range(program.microbatches))
    return True


def _at_or_past(program: Program, pcs: list[int], instr: Instr) -> bool:
    d = program.stage_device[instr.stage]
    return instr in program.devices[d][: pcs[d] + 1]
