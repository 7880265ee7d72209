"""What each part of a decoding step costs, and the stages that balance it.

The parts are the step's atoms: the embedding with block 0, each later block, and the head
(the ops after the last block). An op's cost is its FLOPs as torch's counter counts them
(``torch.utils.flop_counter``), run on the traced step itself: the decode at one token per
row against a full cache (attention reads every position), the prefill at ``tokens``
tokens. ``decode_bounds`` splits the atoms into contiguous stages by the exact min-max
partition the training balancer uses, on the decode's costs: a token's time is the slowest
stage's."""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.utils.flop_counter import FlopCounterMode

from pipecompile.balance.min_max_partition import min_max_partition
from pipecompile.generation.step_split import block_of
from pipecompile.generation.step_trace import GenerateError

__all__ = ["atom_costs", "decode_bounds", "stage_flops"]


class _Counting(fx.Interpreter):
    """Runs the step, adding each op's FLOPs to its atom."""

    def __init__(self, gm: fx.GraphModule, prefix: str, layers: int) -> None:
        super().__init__(gm)
        self.prefix, self.layers = prefix, layers
        self.costs = [0] * (layers + 1)  # block 0 (with the embedding) .. block n-1, head
        self.after = False

    def run_node(self, n: fx.Node) -> object:
        if n.op == "call_module" and n.target == "_guards_fn":
            return None  # export's checks of the inputs' shapes
        if n.op != "call_function":
            return super().run_node(n)
        block = block_of(n, self.prefix)
        if block == self.layers - 1:
            self.after = True
        atom = (
            block
            if block is not None and block < self.layers
            else (self.layers if self.after else 0)
        )
        with FlopCounterMode(display=False) as counter:
            out = super().run_node(n)
        self.costs[atom] += int(counter.get_total_flops())
        return out


def atom_costs(
    gm: fx.GraphModule,
    prefix: str,
    shapes: list[tuple[int, int]],
    *,
    tokens: int,
    max_length: int,
) -> list[int]:
    """FLOPs of each atom of ``gm`` (a traced step), called on one row of ``tokens`` tokens
    at the last positions of a cache of ``max_length``."""
    from pipecompile.generation.step_trace import causal_mask

    params = [p for p in gm.parameters()] + [b for b in gm.buffers()]
    device = params[0].device if params else torch.device("cpu")
    dtype = next((p.dtype for p in params if p.is_floating_point()), torch.float32)
    start = max_length - tokens
    positions = torch.arange(start, max_length, device=device).view(1, tokens)
    kv = [
        torch.zeros((1, h, max_length, d), dtype=dtype, device=device)
        for h, d in shapes
        for _ in (0, 1)
    ]
    ids = torch.zeros((1, tokens), dtype=torch.long, device=device)
    mask = causal_mask(positions, max_length, dtype)
    counting = _Counting(gm, prefix, len(shapes))
    with torch.no_grad():
        counting.run(ids, positions, mask, *kv)
    return counting.costs


def decode_bounds(costs: list[int], stages: int) -> tuple[tuple[int, int], ...]:
    """Each stage's blocks (first, stop) of the min-max split of ``costs`` (``atom_costs``:
    the blocks', then the head's) into ``stages``; the head may be a stage of its own.

    Raises:
        GenerateError: fewer atoms than stages.
    """
    layers = len(costs) - 1
    if stages > len(costs):
        raise GenerateError(
            f"--generate splits the model's {layers} blocks and its head into stages, and "
            f"{stages} stages are more than those {len(costs)} parts: compile with --stages "
            f"{len(costs)} or fewer"
        )
    starts = [*min_max_partition(costs, stages), len(costs)]
    return tuple((min(a, layers), min(b, layers)) for a, b in zip(starts, starts[1:]))


def stage_flops(costs: list[int], bounds: tuple[tuple[int, int], ...]) -> list[int]:
    """Each stage's share of ``costs`` under ``bounds`` (the head on the last stage)."""
    out = [sum(costs[a:b]) for a, b in bounds]
    out[-1] += costs[-1]
    return out
