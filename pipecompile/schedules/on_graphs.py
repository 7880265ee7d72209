"""Schedules on a stage graph: branches on devices of their own, joined where the model joins.

A graph plan's stages form a DAG (an input stage, the branches side by side, the join), and a
device may hold several of them (a branch and the join after it). Its program is played by the
list scheduler (``list_scheduler.list_schedule``) over the graph's links, by the rule the
schedule declares (``Schedule.on_graph``):

- ``fill_drain`` (gpipe): every device runs every forward of its stages, then every backward,
  then steps; the last stage runs all its forwards before any backward, so a loss over the
  whole batch can wait for them.
- ``one_f_one_b`` (1f1b): a ready backward goes first; a device starts a new forward only
  while it holds fewer stage-micro-batches than the deepest of its stages has stages on to
  the end (in a chain 1F1B's cap, p - j for stage j), plus one for each other stage it
  holds, so that one micro-batch can always pass through all of them.
- ``zero_bubble`` (zb1p): that, with the backward split into I and W, the W's filling idle
  clocks.

The looped and V-shaped schedules place stage j by a rule of their own (j mod p, a V), which
is a chain's; the asynchronous ones update weights per micro-batch. They run chains only.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipecompile.errors import ProgramError
from pipecompile.ir.programs.program import Program
from pipecompile.schedules.list_scheduler import Links, list_schedule
from pipecompile.schedules.record import Schedule

__all__ = ["build_on_graph", "why_chain_only"]


def build_on_graph(
    schedule: Schedule, links: Links, stage_device: Sequence[int], microbatches: int
) -> Program:
    """The compute-only program of ``schedule`` on a stage graph (stage j on device
    ``stage_device[j]``, reading the stages ``links.producers[j]``)."""
    if schedule.on_graph is None:
        raise ProgramError(why_chain_only(schedule))
    stages, m = len(stage_device), microbatches
    devices = max(stage_device) + 1
    if schedule.on_graph == "fill_drain":
        caps = [stages * m] * devices
        return list_schedule(
            schedule.name, stage_device, m, caps, split=False, fill_drain=True, graph=links
        )
    depth = _depth(links)
    mine = [[j for j in range(stages) if stage_device[j] == d] for d in range(devices)]
    caps = [max(depth[j] for j in held) + len(held) - 1 for held in mine]
    split = schedule.on_graph == "zero_bubble"
    return list_schedule(schedule.name, stage_device, m, caps, split=split, graph=links)


def why_chain_only(schedule: Schedule) -> str:
    """Why ``schedule`` runs no stage graph (it has no ``on_graph`` rule)."""
    if not schedule.synchronous:
        return (
            f"{schedule.name} updates the weights after each micro-batch, with versions "
            "stashed along a chain of stages; it runs chain plans only"
        )
    return (
        f"{schedule.name} places its stages by its own rule "
        f"({'stage j on device j mod p' if schedule.placement == 'looped' else 'in a V'}), "
        "a chain's; it runs chain plans only"
    )


def _depth(links: Links) -> list[int]:
    """Per stage: the stages on the longest path from it to the end, itself included."""
    depth = [1] * len(links.consumers)
    for j in reversed(range(len(depth))):
        depth[j] = 1 + max((depth[t] for t in links.consumers[j]), default=0)
    return depth
