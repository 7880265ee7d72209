"""What the plan search knows of a model: per atom (a run of ops no stage boundary may split)
its forward FLOPs, op counts, parameter and saved bytes, and per boundary the bytes that
would cross it, all measured on one example micro-batch and scaled to any other size.

Everything but the parameters grows in proportion to the micro-batch: the search traces the
model once and prices every micro-batch count from these figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch.fx as fx

from pipecompile.balance.cut_bytes import atom_links, batch_readers, cut_bytes
from pipecompile.balance.node_memory import node_memory
from pipecompile.balance.partition_problem import AtomFacts, atom_cost
from pipecompile.balance.split_requests import requested_starts
from pipecompile.ir.graph.graph_copy import copy_graph_module
from pipecompile.ir.graph.node_info import info
from pipecompile.ir.graph.split_point import is_split_point
from pipecompile.ir.programs.cost_model import CostModel
from pipecompile.passes.balance_stages import atoms_of, compute_nodes, node_cost

__all__ = ["ModelFacts", "model_facts"]


@dataclass(frozen=True)
class ModelFacts:
    """Per atom at ``size`` samples per micro-batch; ``forced``: atoms a stage must start at."""

    size: int
    flops: tuple[int, ...]
    op_costs: tuple[tuple[tuple[int, int], ...], ...]  # per atom: (FLOPs, NodeInfo.kind) per op
    params: tuple[int, ...]
    saved: tuple[int, ...]
    forward: np.ndarray
    backward: np.ndarray
    forced: tuple[int, ...]
    reads: tuple[tuple[int, ...], ...] = ()  # per atom: the atoms it reads (a stage graph's)
    sent: tuple[int, ...] = ()  # per atom: the bytes of its values other atoms read
    readers: tuple[int, ...] = ()  # the atoms that read a model input

    @property
    def atoms(self) -> int:
        return len(self.flops)

    def walk_seconds(self, size: int, machine: CostModel) -> list[float]:
        """Per atom, the forward seconds of its ops that are not contractions (elementwise
        work and every op's overhead) at ``size`` samples: what a split backward's W walks
        again after I."""
        s = size / self.size
        return [  # the cost model's forward (a third of op_seconds) of these alone
            machine.op_seconds(0.0, sum(c * s for c, k in ops if not k), len(ops), 0) / 3
            for ops in self.op_costs
        ]

    def at(self, size: int, machine: CostModel) -> AtomFacts:
        """The balancer's facts for micro-batches of ``size`` samples under ``machine``."""
        s = size / self.size
        return AtomFacts(
            cost=[
                atom_cost([(c * s, k) for c, k in ops], "flops", machine) for ops in self.op_costs
            ],
            params=list(self.params),
            saved=[round(b * s) for b in self.saved],
            forward=np.rint(self.forward * s).astype(np.int64),
            backward=np.rint(self.backward * s).astype(np.int64),
        )


def model_facts(module: fx.GraphModule, size: int, split_at: Sequence[str] = ()) -> ModelFacts:
    """The facts of an annotated module traced on micro-batches of ``size`` samples, in graph
    order, with the boundaries ``split_at`` and ``split_point()`` markers ask for."""
    out = copy_graph_module(module)
    ops = [n for n in compute_nodes(out.graph) if not is_split_point(n)]
    atoms = atoms_of(ops)
    forced = requested_starts(out.graph, atoms, split_at)
    for node in [n for n in out.graph.nodes if is_split_point(n)]:
        out.graph.erase_node(node)
    out.recompile()
    saved = node_memory(out)
    forward, backward = cut_bytes(out.graph, atoms)
    reads, sent = atom_links(atoms)
    readers = batch_readers(atoms)
    op_costs = tuple(tuple((info(n).flops, info(n).kind) for n in atom) for atom in atoms)
    return ModelFacts(
        size=size,
        flops=tuple(sum(c for c, _ in ops) for ops in op_costs),
        op_costs=op_costs,
        params=tuple(sum(node_cost(n, out, "params") for n in atom) for atom in atoms),
        saved=tuple(sum(saved.get(n, 0) for n in atom) for atom in atoms),
        forward=forward,
        backward=backward,
        forced=tuple(forced),
        reads=reads,
        sent=sent,
        readers=readers,
    )
