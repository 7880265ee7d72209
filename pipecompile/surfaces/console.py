"""The `pipecompile` command's entry point: Ctrl-C while torch is still loading is one line too."""

from __future__ import annotations

import os
import sys

__all__ = ["main"]


def main() -> int:
    """Load the command line, then run it; returns the exit status (130 after Ctrl-C).

    A command stopped by Ctrl-C or SIGTERM ends here without the interpreter's shutdown: a
    stop inside ``torch.save`` (a train state being written) leaves torch's zip writer behind,
    and its destructor, run by the shutdown's last garbage collection, writes to the file the
    stop already closed and aborts the process (exit -6, a C++ report) after the one line."""
    try:
        from pipecompile.surfaces.cli import main as run
    except KeyboardInterrupt:
        print("pipecompile: interrupted", file=sys.stderr)
        return 130
    status = run(command_line=True)
    if status == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status
