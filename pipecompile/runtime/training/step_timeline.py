"""``run --trace``: the tracer of a run's first steps, and the trace file rank 0 writes from
every rank's spans."""

from __future__ import annotations

from pathlib import Path

import torch

from pipecompile.ir.programs.topology import topology_from_manifest
from pipecompile.options.run import TrainFlags
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.timeline import Tracer
from pipecompile.runtime.timeline_file import RankSpan, trace_document, write_trace
from pipecompile.runtime.training.group import Group

__all__ = ["devices_here", "step_tracer", "write_step_trace"]


def step_tracer(pipe: Pipeline, options: TrainFlags, first: int) -> Tracer | None:
    if options.trace is None:
        return None
    return Tracer(pipe.program.stage_device, options.trace_steps, first)


def devices_here(pipe: Pipeline) -> list[int]:
    """The devices whose instructions run in this process."""
    return [pipe.device] if pipe.device is not None else list(range(len(pipe.program.devices)))


def write_step_trace(
    pipe: Pipeline, tracer: Tracer, group: Group, path: Path, one_process: bool
) -> None:
    """Gather every rank's spans on rank 0, which writes the trace."""
    mine = {
        "rank": group.rank,
        "threads": torch.get_num_threads(),
        "spans": [RankSpan(**s.as_dict(), rank=group.rank) for s in tracer.spans],
    }
    every = group.gather_objects(mine)
    if every is None:
        return
    spans: list[RankSpan] = [s for rank in every for s in rank["spans"]]
    threads = {rank["rank"]: rank["threads"] for rank in every}
    traced = sorted({s["step"] for s in spans if s["category"] == "step"})
    topology = topology_from_manifest(pipe.manifest)
    document = trace_document(
        spans, pipe.program, topology, one_process=one_process, traced_steps=traced, threads=threads
    )
    write_trace(path, document)
