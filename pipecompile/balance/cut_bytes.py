"""Analysis: cut_bytes — the bytes a stage boundary before each atom would carry.

Requires: the balancer's atoms (runs of ops no boundary may split), in graph order, whose
nodes carry fake values (``meta["val"]``).
Guarantees: for every boundary k = 0..n (before atom k; 0 and n are the pipeline's ends and
carry nothing) the bytes of the tensors produced before it and read at or after it: forward
(every tensor) and backward (the gradients of the floating-point ones). A value read by a
stage further on is counted at every boundary it passes, which is what a stage in between
would relay; split_stages sends it directly, so for skips this is an upper bound and for
chains it is exact. Model inputs count as produced before atom 0; model outputs as read
after the last atom.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

__all__ = ["atom_links", "batch_readers", "cut_bytes", "value_bytes"]


def cut_bytes(graph: fx.Graph, atoms: list[list[fx.Node]]) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward bytes per boundary, each an int64 array of length n + 1."""
    n = len(atoms)
    where = {node: k for k, atom in enumerate(atoms) for node in atom}
    forward = np.zeros(n + 2, dtype=np.int64)  # difference arrays over boundaries
    backward = np.zeros(n + 2, dtype=np.int64)
    for node in graph.nodes:
        if node.op == "placeholder":
            made = -1
        elif node in where:
            made = where[node]
        else:
            continue
        last = max((where.get(u, n) for u in node.users), default=made)
        if last <= made:
            continue
        fwd, bwd = _bytes(node.meta.get("val"))
        first = made + 1
        forward[first] += fwd
        forward[last + 1] -= fwd
        backward[first] += bwd
        backward[last + 1] -= bwd
    fwd_cut, bwd_cut = np.cumsum(forward)[: n + 1], np.cumsum(backward)[: n + 1]
    for cut in (fwd_cut, bwd_cut):
        cut[0] = cut[n] = 0
    return fwd_cut, bwd_cut


def atom_links(
    atoms: list[list[fx.Node]],
) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """Per atom, the atoms it reads, and the forward bytes of its values other atoms read."""
    where = {node: k for k, atom in enumerate(atoms) for node in atom}
    reads = tuple(
        tuple(sorted({where[i] for n in atom for i in n.all_input_nodes if i in where} - {k}))
        for k, atom in enumerate(atoms)
    )
    sent = tuple(
        sum(
            _bytes(n.meta.get("val"))[0]
            for n in atom
            if any(where.get(u, -1) not in (k, -1) for u in n.users)
        )
        for k, atom in enumerate(atoms)
    )
    return reads, sent


def batch_readers(atoms: list[list[fx.Node]]) -> tuple[int, ...]:
    """The atoms that read one of the model's inputs."""
    return tuple(
        k
        for k, atom in enumerate(atoms)
        if any(i.op == "placeholder" for n in atom for i in n.all_input_nodes)
    )


def value_bytes(value: object) -> int:
    """The forward bytes of a (traced, fake) value: its tensors' bytes."""
    return _bytes(value)[0]


def _bytes(value: object) -> tuple[int, int]:
    fwd = bwd = 0
    for t in pytree.tree_leaves(value):
        if isinstance(t, torch.Tensor):
            size = t.numel() * t.element_size()
            fwd += size
            bwd += size if t.is_floating_point() else 0
    return fwd, bwd
