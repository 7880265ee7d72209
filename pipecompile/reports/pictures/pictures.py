"""An emitted directory's pictures: ``stages`` and ``schedule``, as DOT sources and drawn.

The DOT sources are always written; the drawings only where Graphviz is installed
(``Pictures.drawn`` is empty otherwise, and ``INSTALL_HINT`` says how to get it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipecompile.errors import EmitError
from pipecompile.files.disk import writing
from pipecompile.files.owned import record, unrecorded
from pipecompile.reports.pictures.render import dot_available, render
from pipecompile.reports.pictures.schedule_picture import schedule_dot, simulated_timeline
from pipecompile.reports.pictures.stage_picture import stage_dot
from pipecompile.runtime.load import open_emitted

__all__ = ["Pictures", "write_pictures"]


@dataclass(frozen=True)
class Pictures:
    """The files written: DOT sources, and the drawings (none without Graphviz)."""

    sources: tuple[Path, ...]
    drawn: tuple[Path, ...]


def write_pictures(directory: Path, *, out: Path | None = None, fmt: str = "svg") -> Pictures:
    """Write ``stages.dot`` and ``schedule.dot`` for the pipeline in ``directory`` into ``out``
    (default: ``directory``) and, if Graphviz is installed, ``stages.<fmt>`` and
    ``schedule.<fmt>``.

    Example:
        >>> write_pictures(Path("out/gpt2")).drawn  # doctest: +SKIP
        (PosixPath('out/gpt2/stages.svg'), PosixPath('out/gpt2/schedule.svg'))

    Raises:
        EmitError: ``directory`` holds no readable manifest or program.
        ProgramError: the program deadlocks when simulated.
        EmitError: ``out`` cannot be written (named, with the reason).
        RenderError: Graphviz failed, or ``fmt`` is not svg, png or pdf.
    """
    directory = Path(directory)
    out = directory if out is None else Path(out)
    _, manifest, program = open_emitted(directory)
    timeline, unit = simulated_timeline(manifest, program)
    graphs = {
        "stages": (stage_dot(manifest, program), "dot"),
        "schedule": (schedule_dot(timeline, program, unit=unit), "neato"),
    }
    sources, drawn = [], []
    elsewhere = out.resolve() != directory.resolve()  # outside the emitted directory
    if elsewhere:
        _refuse_foreign(out, [out / f"{name}.{ext}" for name in graphs for ext in ("dot", fmt)])
    with writing("write pictures to", out):
        out.mkdir(parents=True, exist_ok=True)
        for name, (graph, _) in graphs.items():
            sources.append(out / f"{name}.dot")
            sources[-1].write_text(graph.source)
        if dot_available():
            for name, (graph, engine) in graphs.items():
                drawn.append(render(graph, out / f"{name}.{fmt}", engine=engine))
        if elsewhere:
            record([*sources, *drawn])
    return Pictures(tuple(sources), tuple(drawn))


def _refuse_foreign(out: Path, targets: list[Path]) -> None:
    """Outside an emitted directory a picture file is replaced only if pipecompile wrote it
    (its digest in the directory's ledger): never a user's file, nor one changed since."""
    foreign = unrecorded(targets)
    if foreign:
        raise EmitError(
            f"viz -o {out}: {', '.join(p.name for p in foreign)} exist there and pipecompile "
            "did not draw them (or they changed since); they are never replaced: choose another "
            "-o, or move them away"
        )
