"""Draw DOT sources with Graphviz's programs (``dot``, ``neato``), or say how to get them."""

from __future__ import annotations

import shutil
from pathlib import Path

import graphviz  # type: ignore[import-untyped]

from pipecompile.errors import PipecompileError

__all__ = ["FORMATS", "INSTALL_HINT", "RenderError", "dot_available", "render"]

FORMATS = ("svg", "png", "pdf")
INSTALL_HINT = (
    "Graphviz's `dot` program is not on PATH; install it (apt-get install graphviz, "
    "brew install graphviz, or conda install -c conda-forge graphviz)"
)


class RenderError(PipecompileError):
    """Graphviz is missing or failed to draw a picture."""


def dot_available() -> bool:
    """Whether Graphviz's programs can be run (found on PATH)."""
    return shutil.which("dot") is not None


def render(graph: graphviz.Digraph, target: Path, *, engine: str = "dot") -> Path:
    """Draw ``graph`` with ``engine`` into ``target``, in the format its suffix names.

    ``engine="neato"`` runs ``neato -n2``: every node keeps the position it was given.

    Raises:
        RenderError: Graphviz is not installed, or it failed (its message included).
    """
    fmt = target.suffix.lstrip(".")
    if fmt not in FORMATS:
        raise RenderError(f"cannot draw {target.name}: choose one of {', '.join(FORMATS)}")
    if not dot_available():
        raise RenderError(INSTALL_HINT)
    try:
        data = graphviz.pipe(
            engine,
            fmt,
            graph.source.encode(),
            neato_no_op=2 if engine == "neato" else None,
            quiet=True,
        )
    except graphviz.ExecutableNotFound:
        raise RenderError(INSTALL_HINT) from None
    except graphviz.CalledProcessError as err:
        detail = (err.stderr or b"").decode(errors="replace").strip()
        raise RenderError(f"Graphviz's {engine} failed on {target.name}: {detail}") from None
    target.write_bytes(data)
    return target
