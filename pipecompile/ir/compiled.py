"""The compiler's result: the stage graph, the program, and what the compiler learned on the
way (stored bytes per stage, replica counts, the balance report, pass timings)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipecompile.ir.program import Program
from pipecompile.ir.saved_bytes import StageMemory
from pipecompile.ir.stage_graph import StageGraph

__all__ = ["Compiled"]


@dataclass(frozen=True)
class Compiled:
    """The result of compiling: the stage graph, the program and how long each pass took."""

    graph: StageGraph
    program: Program
    microbatch_size: int
    memory: tuple[StageMemory, ...] = ()
    replicas: tuple[int, ...] = ()
    balance: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    fingerprint: str = ""  # of the traced graph, see ``graph_fingerprint``
