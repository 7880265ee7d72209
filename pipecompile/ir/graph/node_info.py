"""pipecompile's facts about one fx node, kept under ``node.meta["pipecompile"]``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch.fx as fx

__all__ = [
    "CONVOLUTION",
    "ELEMENTWISE",
    "MATMUL",
    "META_KEY",
    "NodeInfo",
    "info",
    "with_info",
]

META_KEY = "pipecompile"
ELEMENTWISE, MATMUL, CONVOLUTION = 0, 1, 2  # an op's kind for the cost model


@dataclass(frozen=True)
class NodeInfo:
    """Costs of a node (forward FLOPs, bytes) and, once balanced, the stage it belongs to."""

    flops: int = 0
    param_bytes: int = 0
    activation_bytes: int = 0
    time_ns: int = 0  # measured forward + backward time (``--balance time``), else 0
    contraction: bool = False  # a matmul-like op (its FLOPs exact), not an elementwise one
    convolution: bool = False  # a contraction that is a convolution (its own efficiency)
    stage: int | None = None

    @property
    def kind(self) -> int:
        """How the cost model prices the op's FLOPs: ``ELEMENTWISE``, ``MATMUL`` or
        ``CONVOLUTION``."""
        if self.convolution:
            return CONVOLUTION
        return MATMUL if self.contraction else ELEMENTWISE


def info(node: fx.Node) -> NodeInfo:
    """The node's NodeInfo; an unannotated node reads as zero cost and no stage."""
    return node.meta.get(META_KEY, NodeInfo())


def with_info(node: fx.Node, **changes: object) -> None:
    """Replace fields of the node's NodeInfo (used by passes on the copy they return)."""
    node.meta[META_KEY] = dataclasses.replace(info(node), **changes)  # type: ignore[arg-type]
