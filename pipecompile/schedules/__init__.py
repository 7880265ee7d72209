"""Schedule generators: compute-only programs that communication is added to afterwards.

Each generator is a pure function ``(stages, microbatches, **options) -> Program`` whose
docstring draws its timetable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pipecompile.errors import ProgramError
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.whole_batch import waits_for_whole_batch
from pipecompile.schedules import (
    dualpipev,
    gpipe,
    interleaved,
    looped_bfs,
    one_f_one_b,
    pipedream,
    pipedream_2bw,
    v_half,
    v_min,
    zb1p,
    zb2p,
    zbv,
)
from pipecompile.schedules.list_scheduler import Links
from pipecompile.schedules.on_graphs import build_on_graph, why_chain_only
from pipecompile.schedules.record import Schedule

__all__ = [
    "DEFAULT_SCHEDULE",
    "GRAPHS",
    "Links",
    "LOOPED",
    "ORDER",
    "REGISTRY",
    "REPLICABLE",
    "SCHEDULES",
    "SYNCHRONOUS",
    "V_SHAPED",
    "WHOLE_BATCH",
    "Schedule",
    "devices_for",
    "compute_program",
    "graph_program",
    "why_chain_only",
    "schedule_of",
]

# Every schedule, in the plan search's order of preference (a tie goes to the earlier one):
# the synchronous ones it searches, then the asynchronous ones it never chooses.
REGISTRY: dict[str, Schedule] = {
    s.name: s
    for s in (
        gpipe.SCHEDULE,
        one_f_one_b.SCHEDULE,
        zb1p.SCHEDULE,
        zb2p.SCHEDULE,
        interleaved.SCHEDULE,
        looped_bfs.SCHEDULE,
        zbv.SCHEDULE,
        v_half.SCHEDULE,
        v_min.SCHEDULE,
        dualpipev.SCHEDULE,
        pipedream.SCHEDULE,
        pipedream_2bw.SCHEDULE,
    )
}
SCHEDULES: dict[str, Callable[..., Program]] = {n: s.build for n, s in REGISTRY.items()}
ORDER = tuple(REGISTRY)
DEFAULT_SCHEDULE = gpipe.SCHEDULE.name  # a compile's schedule when none is given or searched
# Schedules whose step equals single-device training on the mini-batch.
SYNCHRONOUS = frozenset(n for n, s in REGISTRY.items() if s.synchronous)
V_SHAPED = tuple(n for n, s in REGISTRY.items() if s.placement == "v")
LOOPED = tuple(n for n, s in REGISTRY.items() if s.placement == "looped")
REPLICABLE = tuple(n for n, s in REGISTRY.items() if s.replicable)
GRAPHS = tuple(n for n, s in REGISTRY.items() if s.on_graph)  # those that run stage graphs
_BY_PROGRAM = {a: s for s in REGISTRY.values() for a in (s.name, *s.aliases)}


def schedule_of(name: str) -> Schedule:
    """The record of the schedule a program or ``--schedule`` names (a variant's name too)."""
    if name not in _BY_PROGRAM:
        raise ProgramError(f"unknown schedule {name!r}; available: {', '.join(REGISTRY)}")
    return _BY_PROGRAM[name]


def listed(names: Iterable[str], last: str = "or") -> str:
    """``names`` in a message: "a, b or c"."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def compute_program(
    name: str,
    stages: int,
    microbatches: int,
    *,
    virtual_stages: int | None = None,
    vertical_sync: bool = False,
) -> Program:
    """The compute-only program of schedule ``name``.

    Args:
        name: one of ``SCHEDULES``.
        stages: pipeline stages (for ``interleaved``: devices times ``virtual_stages``).
        microbatches: micro-batches per mini-batch.
        virtual_stages: stages per device, ``interleaved`` and ``looped_bfs`` only (default 2).
        vertical_sync: ``pipedream`` only: every stage uses the weight version stage 0 used.

    Raises:
        ProgramError: unknown schedule, or options the schedule cannot take.
    """
    if name not in REGISTRY:  # a program's variant name (pipedream-vsync) is no --schedule
        raise ProgramError(f"unknown schedule {name!r}; available: {', '.join(REGISTRY)}")
    schedule = REGISTRY[name]
    if microbatches < 1:
        raise ProgramError(f"--microbatches must be at least 1, got {microbatches}")
    if stages < 1:
        raise ProgramError(f"--stages must be at least 1, got {stages}")
    given = {"virtual_stages": virtual_stages is not None, "vertical_sync": vertical_sync}
    for option in (o for o, on in given.items() if on and o not in schedule.takes):
        takers = [n for n, s in REGISTRY.items() if option in s.takes]
        flag = "--" + option.replace("_", "-")
        raise ProgramError(
            f"{flag} applies to the {listed(takers, 'and')} schedule{'s' * (len(takers) > 1)}, "
            f"not {name}"
        )
    values = {
        "virtual_stages": schedule.stages_a_device(virtual_stages),
        "vertical_sync": vertical_sync,
    }
    return schedule.build(stages, microbatches, *(values[o] for o in schedule.takes))


def graph_program(
    name: str, links: Links, stage_device: tuple[int, ...], microbatches: int
) -> Program:
    """The compute-only program of schedule ``name`` on a stage graph (``on_graphs``)."""
    return build_on_graph(schedule_of(name), links, stage_device, microbatches)


def devices_for(name: str, stages: int, virtual_stages: int | None = None) -> int:
    """How many devices schedule ``name`` places ``stages`` stages on."""
    return stages // schedule_of(name).stages_a_device(virtual_stages)


def _waits(name: str) -> bool:
    """Whether ``name``'s last stage runs every forward before its first backward (on 4
    devices and 8 micro-batches: the order a schedule's timetable keeps at every size)."""
    looped = REGISTRY[name].placement == "looped"
    stages = 4 * REGISTRY[name].stages_a_device(2 if looped else None)
    program = compute_program(name, stages, 8, virtual_stages=2 if looped else None)
    return waits_for_whole_batch(program)


# The synchronous schedules that can wait for a loss over the whole batch (a contrastive
# loss, computed once a step on every micro-batch's outputs: runtime/state/whole_loss)
WHOLE_BATCH = tuple(n for n, s in REGISTRY.items() if s.synchronous and _waits(n))
