"""Random numbers that belong to the program, not to the order instructions run in.

Each stage forward of micro-batch i on stage j runs inside ``torch.random.fork_rng`` (the
caller's stream is left as it was) with torch's generators seeded from the step's base seed,
j and i. Within it, every random op the compiler found (``ir/graph/random_ops``; the stage's
``random_ops`` in the manifest) is seeded again just before it runs from (base, i, the op's
name in the traced graph) by ``seed_op``, which the runtime puts into the stage's forward
(``op_seeds``). So an op draws the same numbers whichever stage holds it: for one base seed,
losses and weights do not depend on the stage count, schedule, recompute policy or rank count.
A recomputation (``--recompute``, ``--memory-budget``, the decorator's backward) runs with
the same seeds, so dropout draws the mask of the forward it recomputes. The base seed is
drawn from torch's global generator once per step unless given (``run --seed S`` derives it
from S and the step: ``step_base``).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator

import torch

__all__ = ["draw_base", "seeded", "seed_op", "step_base"]

_current = threading.local()  # (base, micro-batch) of the stage forward running on this thread


def draw_base() -> int:
    """A base seed from torch's global generator (so ``torch.manual_seed`` governs it)."""
    return int(torch.randint(0, 2**62, (), dtype=torch.int64))


def step_base(seed: int, step: int, part: int = 0) -> int:
    """The base seed of mini-batch ``part`` of optimizer step ``step`` (counting from 0) of a
    run with ``--seed seed``."""
    return _hash(f"run:{seed}:{step}:{part}")


def stage_seed(base: int, stage: int, microbatch: int) -> int:
    return _hash(f"{base}:{stage}:{microbatch}")


def op_seed(base: int, microbatch: int, name: str) -> int:
    return _hash(f"{base}:{microbatch}:{name}")


def _hash(text: str) -> int:
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


@contextlib.contextmanager
def seeded(base: int, stage: int, microbatch: int) -> Iterator[None]:
    """Run the block with every generator (CPU, and CUDA where initialised) seeded for
    (``base``, ``stage``, ``microbatch``), and ``seed_op`` active for (``base``,
    ``microbatch``); the previous states are restored after."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    outer = getattr(_current, "value", None)
    with torch.random.fork_rng(devices=devices):
        _seed_all(stage_seed(base, stage, microbatch))
        _current.value = (base, microbatch)
        try:
            yield
        finally:
            _current.value = outer


def seed_op(name: str) -> None:
    """Seed torch's generators for the random op ``name`` of the stage forward now running
    (a no-op outside one, e.g. when a stage module is called directly)."""
    _seed_named(name)


def _seed_named(name: str) -> None:
    current = getattr(_current, "value", None)
    if current is None:
        return
    _seed_all(op_seed(current[0], current[1], name))


def break_graphs_at_seeding() -> None:
    """Make a compiled stage (``--compile``) break its graph at each ``seed_op`` and seed
    eagerly. Done when stages are compiled, not at import: ``torch.compiler.disable`` loads
    torch's compiler, seconds of start-up for every rank that never compiles."""
    global _seed_named
    if not getattr(_seed_named, "_torchdynamo_disable", False):
        _seed_named = torch.compiler.disable(_seed_named)


def _seed_all(seed: int) -> None:
    """Seed the CPU generator, and the GPUs' where CUDA is initialised. Not
    ``torch.manual_seed``: without CUDA initialised it queues a seeding of the GPUs for later
    with the stack it was called from, formatted (0.7 ms, more than a small stage's forward)."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)
