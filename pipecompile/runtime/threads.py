"""How many intra-op threads each process of a run uses, so that ranks do not fight for cores.

A rank on a machine shared with ``k`` ranks takes its share of the cores this process may run
on (at least one); ``--threads N`` sets it for every process (one process: torch's default
otherwise, every core).
"""

from __future__ import annotations

import os

import torch

__all__ = ["cores", "fair_share", "use_threads"]


def cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this system
        return os.cpu_count() or 1


def fair_share(ranks_here: int) -> int:
    """The threads of one of ``ranks_here`` ranks on this machine."""
    return max(1, cores() // max(ranks_here, 1))


def use_threads(threads: int | None, ranks_here: int | None = None) -> int:
    """Set this process's intra-op threads to ``threads``, else to the fair share of one of
    ``ranks_here`` ranks (None: leave torch's default); returns the count in use."""
    count = threads or (fair_share(ranks_here) if ranks_here else None)
    if count is not None and count != torch.get_num_threads():
        torch.set_num_threads(count)
    return torch.get_num_threads()
