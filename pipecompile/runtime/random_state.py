"""Random numbers that belong to a (stage, micro-batch), not to the order instructions run in.

Each stage forward of micro-batch i on stage j runs with torch's generators seeded from the
step's base seed, j and i, inside ``torch.random.fork_rng`` (the caller's stream is left as it
was). A recomputation (``--checkpoint``, ``--memory-budget``, the decorator's backward) runs
with the same seed, so dropout draws the same mask as the forward it recomputes, whatever the
schedule did in between. The base seed is drawn from torch's global generator once per step
unless given (the decorator passes its forward's base to its backward).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import torch

__all__ = ["draw_base", "seeded"]


def draw_base() -> int:
    """A base seed from torch's global generator (so ``torch.manual_seed`` governs it)."""
    return int(torch.randint(0, 2**62, (), dtype=torch.int64))


def stage_seed(base: int, stage: int, microbatch: int) -> int:
    digest = hashlib.sha256(f"{base}:{stage}:{microbatch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


@contextlib.contextmanager
def seeded(base: int, stage: int, microbatch: int) -> Iterator[None]:
    """Run the block with every generator (CPU, and CUDA where initialised) seeded for
    (``base``, ``stage``, ``microbatch``); the previous states are restored after."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(stage_seed(base, stage, microbatch))
        yield
