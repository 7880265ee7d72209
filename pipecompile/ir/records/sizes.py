"""Byte sizes as people write them: ``512MiB``, ``2GB``, ``1.5G``, ``1048576``."""

from __future__ import annotations

import re

__all__ = ["parse_size", "format_size", "format_count", "counted"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes in ``text``; a bare K/M/G/T means the binary unit (KiB, MiB, ...).

    Raises:
        ValueError: not a number followed by one of B, K, KB, KiB, M, MB, MiB, G, GB, GiB,
            T, TB, TiB.
    """
    match = _PATTERN.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"cannot read {text!r} as a size; write e.g. 512MiB, 2GB, 1.5G or a byte count"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(count: float) -> str:
    """``count`` bytes in the largest binary unit that keeps it at least 1 (``3.46 GiB``)."""
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(count) >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count:.0f} B"


def format_count(value: float | None, unit: str = "") -> str:
    """``value`` with a decimal prefix (``3.17M``, ``241.41kB``); ``-`` for None."""
    if value is None:
        return "-"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{prefix}{unit}"
    return f"{value:.0f}{unit}"


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun`` in the right number: ``1 micro-batch``, ``4 micro-batches``."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {noun}es" if noun.endswith(("ch", "sh", "s", "x")) else f"{n} {noun}s"
