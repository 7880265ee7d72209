"""Where pipecompile keeps what it measured on this machine (the plan search's calibration,
`--balance time`'s op profiles): ``$PIPECOMPILE_CACHE``, else ``$XDG_CACHE_HOME/pipecompile``,
else ``~/.cache/pipecompile`` (the XDG base directory convention), one root for both."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """The folder pipecompile's measurements of this machine are kept in."""
    own = os.environ.get("PIPECOMPILE_CACHE")
    if own:
        return Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "pipecompile"
