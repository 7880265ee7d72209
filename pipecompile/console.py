"""The `pipecompile` command's entry point: Ctrl-C while torch is still loading is one line too."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> int:
    """Load the command line, then run it; returns the exit status (130 after Ctrl-C)."""
    try:
        from pipecompile.cli import main as run
    except KeyboardInterrupt:
        print("pipecompile: interrupted", file=sys.stderr)
        return 130
    return run(command_line=True)
