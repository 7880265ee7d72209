"""Check a program before it runs: placement, counts, order, weight versions, no deadlock."""

from __future__ import annotations

from collections import Counter

from pipecompile.errors import ProgramError
from pipecompile.ir.programs.instr import BACKWARD_OPS, FORWARD_OPS, GRADIENT_OPS, Instr, Op
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.simulate import Costs, simulate
from pipecompile.ir.programs.topology import Topology

__all__ = ["Topology", "verify_program"]


def verify_program(program: Program, topology: Topology) -> None:
    """Raise ProgramError, showing the instructions around the problem, if ``program`` is bad.

    Checked: every instruction runs on its stage's device; each micro-batch has one forward
    (F or FC) and one backward (B, or I then W) per stage, the sends and receives its
    cross-device edges need, and either one STEP per stage or UPDATEs after the same
    micro-batches on every stage, the last one included (each one, or each window's last);
    no backward precedes its forward; a backward whose weights an UPDATE changed since its
    forward has a STASH; and the program runs to the end without deadlock (by simulation).
    """
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
    _check_order(program)
    _check_versions(program)
    simulate(program, topology, Costs.uniform(program.num_stages))


def _check_placement(program: Program) -> None:
    for d, k, instr in program.instructions():
        if not 0 <= instr.stage < program.num_stages:
            raise ProgramError(f"no stage {instr.stage}\n{program.show_around(d, k)}")
        if instr.microbatch is not None and instr.microbatch >= program.microbatches:
            raise ProgramError(
                f"{instr} names micro-batch {instr.microbatch} but the program has "
                f"{program.microbatches}\n{program.show_around(d, k)}"
            )
        if program.stage_device[instr.stage] != d:
            raise ProgramError(
                f"{instr} runs on device {d} but stage {instr.stage} is placed on device "
                f"{program.stage_device[instr.stage]}\n{program.show_around(d, k)}"
            )


def _expected(program: Program, topology: Topology, have: Counter[Instr]) -> Counter[Instr]:
    """The instruction counts a correct program has, given the forms ``have`` chose."""
    device = program.stage_device
    remote = {(s, t) for s, t in topology.edges if device[s] != device[t]}
    tied = {j for group in topology.tie_groups for j in group}
    want: Counter[Instr] = Counter()
    updated = _updated(program, have)
    for j in range(program.num_stages):
        updates = sum(have[Instr(Op.UPDATE, j, i)] for i in range(program.microbatches))
        asynchronous = updates > 0
        # a version per window on all stages: fewer updates than micro-batches
        windowed = updates < program.microbatches
        if asynchronous and j in tied and not windowed:
            raise ProgramError(
                f"stage {j} holds a parameter tied to another stage, which PipeDream's "
                "updates (UPDATE per micro-batch, a version per stage) would let drift apart; "
                "use a schedule that updates once a window or a synchronous one "
                "(docs/schedules/: each page says whether tied weights are allowed), or untie "
                "the parameter"
            )
        for i in range(program.microbatches):
            forward = Op.FC if have[Instr(Op.FC, j, i)] else Op.F
            want[Instr(forward, j, i)] = 1
            if have[Instr(Op.I, j, i)] or have[Instr(Op.W, j, i)]:
                want.update([Instr(Op.I, j, i), Instr(Op.W, j, i)])
            else:
                want[Instr(Op.B, j, i)] = 1
            if any(s == j for s, _ in remote):
                want.update([Instr(Op.SEND_F, j, i), Instr(Op.RECV_B, j, i)])
            if any(t == j for _, t in remote):
                want.update([Instr(Op.RECV_F, j, i), Instr(Op.SEND_B, j, i)])
            if asynchronous and i in updated:
                want[Instr(Op.UPDATE, j, i)] = 1
                if j in tied:
                    want[Instr(Op.ALLREDUCE_TIED, j, i)] = 1
            stash = Instr(Op.STASH, j, i)
            want[stash] = min(have[stash], 1)
        replicas = Instr(Op.ALLREDUCE_REPLICAS, j)
        want[replicas] = 0 if asynchronous else min(have[replicas], 1)
        if not asynchronous:
            want[Instr(Op.STEP, j)] = 1
            if j in tied:
                want[Instr(Op.ALLREDUCE_TIED, j)] = 1
    return want


def _updated(program: Program, have: Counter[Instr]) -> frozenset[int]:
    """The micro-batches after whose backward an asynchronous program updates: each one
    (PipeDream), or the last of each window (PipeDream-2BW); stage 0's, which every stage
    must share and which end with the last micro-batch."""
    m = program.microbatches
    mine = frozenset(i for i in range(m) if have[Instr(Op.UPDATE, 0, i)])
    if not mine:
        return frozenset(range(m))  # a synchronous stage 0: any UPDATE elsewhere is counted
    return mine | {m - 1}


def _check_counts(program: Program, topology: Topology) -> None:
    have = Counter(instr for _, _, instr in program.instructions())
    want = _expected(program, topology, have)
    for instr in sorted(set(have) | set(want)):
        if have[instr] != want[instr]:
            where = _find(program, instr)
            context = f"\n{program.show_around(*where)}" if where else ""
            raise ProgramError(
                f"instruction {instr} appears {have[instr]} times, expected {want[instr]}{context}"
            )


def _check_order(program: Program) -> None:
    """A backward before its own forward on the same device is reported as such, not as the
    deadlock it would cause."""
    for d, instrs in enumerate(program.devices):
        seen: set[tuple[int, int | None]] = set()
        for k, x in enumerate(instrs):
            if x.op in FORWARD_OPS:
                seen.add((x.stage, x.microbatch))
            elif x.op in BACKWARD_OPS and (x.stage, x.microbatch) not in seen:
                raise ProgramError(
                    f"backward {x} comes before the forward of stage {x.stage}, micro-batch "
                    f"{x.microbatch}\n{program.show_around(d, k)}"
                )


def _check_versions(program: Program) -> None:
    """An UPDATE between a micro-batch's forward and its backward changes the weights the
    backward would differentiate; only a STASH before the forward keeps them."""
    for d, instrs in enumerate(program.devices):
        stashed = {(x.stage, x.microbatch) for x in instrs if x.op == Op.STASH}
        open_: dict[tuple[int, int | None], int] = {}
        for k, x in enumerate(instrs):
            key = (x.stage, x.microbatch)
            if x.op in FORWARD_OPS and key not in stashed:
                open_[key] = k
            elif x.op in GRADIENT_OPS:
                open_.pop(key, None)
            elif x.op == Op.UPDATE:
                for j, i in list(open_):
                    if j == x.stage and (j, i) != key:
                        raise ProgramError(
                            f"{x} changes stage {j}'s weights between {j}F{i} and its "
                            f"backward; add {j}STASH{i} before {j}F{i} so the backward uses "
                            f"the weights the forward used\n{program.show_around(d, k)}"
                        )


def _find(program: Program, instr: Instr) -> tuple[int, int] | None:
    for d, k, other in program.instructions():
        if other == instr:
            return d, k
    return None
