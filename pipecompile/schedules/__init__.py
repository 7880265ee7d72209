"""Schedule generators: compute-only programs that communication is added to afterwards.

Each generator is a pure function ``(stages, microbatches, **options) -> Program`` whose
docstring draws its timetable.
"""

from __future__ import annotations

from collections.abc import Callable

from pipecompile.errors import ProgramError
from pipecompile.ir.program import Program
from pipecompile.schedules.dualpipev import dualpipev
from pipecompile.schedules.gpipe import gpipe
from pipecompile.schedules.interleaved import interleaved
from pipecompile.schedules.looped_bfs import looped_bfs
from pipecompile.schedules.one_f_one_b import one_f_one_b
from pipecompile.schedules.pipedream import pipedream
from pipecompile.schedules.pipedream_2bw import pipedream_2bw
from pipecompile.schedules.v_half import v_half
from pipecompile.schedules.v_min import v_min
from pipecompile.schedules.zb1p import zb1p
from pipecompile.schedules.zb2p import zb2p
from pipecompile.schedules.zbv import zbv

__all__ = ["SCHEDULES", "SYNCHRONOUS", "V_SHAPED", "generate", "devices_for"]

SCHEDULES: dict[str, Callable[..., Program]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "pipedream": pipedream,
    "pipedream_2bw": pipedream_2bw,
    "interleaved": interleaved,
    "zb1p": zb1p,
    "zb2p": zb2p,
    "looped_bfs": looped_bfs,
    "zbv": zbv,
    "v_half": v_half,
    "v_min": v_min,
    "dualpipev": dualpipev,
}
# Schedules whose step equals single-device training on the mini-batch.
SYNCHRONOUS = frozenset(
    {"gpipe", "1f1b", "interleaved", "zb1p", "zb2p", "looped_bfs", "zbv", "v_half", "v_min",
     "dualpipev"}
)  # fmt: skip
V_SHAPED = ("zbv", "v_half", "v_min", "dualpipev")  # two stages per device, in a V
LOOPED = ("interleaved", "looped_bfs")  # v stages per device, stage j on device j mod p


def generate(
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
    if name not in SCHEDULES:
        raise ProgramError(f"unknown schedule {name!r}; available: {', '.join(SCHEDULES)}")
    if microbatches < 1:
        raise ProgramError(f"--microbatches must be at least 1, got {microbatches}")
    if stages < 1:
        raise ProgramError(f"--stages must be at least 1, got {stages}")
    if virtual_stages is not None and name not in LOOPED:
        raise ProgramError(
            f"--virtual-stages applies to the {' and '.join(LOOPED)} schedules, not {name}"
        )
    if vertical_sync and name != "pipedream":
        raise ProgramError(f"--vertical-sync applies to the pipedream schedule, not {name}")
    if name in LOOPED:
        v = 2 if virtual_stages is None else virtual_stages
        return SCHEDULES[name](stages, microbatches, v)
    if name == "pipedream":
        return pipedream(stages, microbatches, vertical_sync)
    return SCHEDULES[name](stages, microbatches)


def devices_for(name: str, stages: int, virtual_stages: int | None = None) -> int:
    """How many devices schedule ``name`` places ``stages`` stages on."""
    v = 2 if virtual_stages is None else max(virtual_stages, 1)
    if name in V_SHAPED:
        return stages // 2
    return stages // v if name in LOOPED else stages
