"""The compiler's result: the stage graph, the program, and what the compiler learned on the
way (stored bytes per stage, replica counts, the balance report, pass timings)."""

from __future__ import annotations

from dataclasses import dataclass

from pipecompile.ir.graph.dynamic import DynamicDims
from pipecompile.ir.graph.saved_bytes import StageMemory
from pipecompile.ir.graph.stage_graph import StageGraph
from pipecompile.ir.graph.tail import Tail
from pipecompile.ir.programs.program import Program
from pipecompile.ir.records.balance_report import BalanceReport
from pipecompile.ir.records.batch_coupling import Coupling
from pipecompile.ir.records.plan_record import PlanRecord

__all__ = ["Compiled"]


@dataclass(frozen=True)
class Compiled:
    """The result of compiling: the stage graph, the program and how long each pass took.

    ``timings`` holds ``(name, seconds)`` in the order they ran: each pass that ran (with its
    cheap IR check), and under ``verify_each`` each ``verify NAME``, the expensive checks of
    the IR a pass produced.
    """

    graph: StageGraph
    program: Program
    microbatch_size: int
    memory: tuple[StageMemory, ...] = ()
    replicas: tuple[int, ...] = ()
    balance: BalanceReport | None = None
    timings: tuple[tuple[str, float], ...] = ()
    fingerprint: str = ""  # of the traced graph, see ``graph_fingerprint``
    plan: PlanRecord | None = None  # the plan search's choice (manifest key ``plan``)
    dynamic: DynamicDims = DynamicDims()  # the dimensions batches may vary in (``dynamic``)
    # where the model mixes the samples of a batch (``batch_coupling``; None: not analysed)
    coupling: tuple[Coupling, ...] | None = None
    # the batch-coupled tail cut off the model, run once a step (``frontend/tail_cut``)
    tail: Tail | None = None
