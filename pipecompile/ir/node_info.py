"""pipecompile's facts about one fx node, kept under ``node.meta["pipecompile"]``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch.fx as fx

__all__ = ["NodeInfo", "META_KEY", "info", "with_info"]

META_KEY = "pipecompile"


@dataclass(frozen=True)
class NodeInfo:
    """Costs of a node (forward FLOPs, bytes) and, once balanced, the stage it belongs to."""

    flops: int = 0
    param_bytes: int = 0
    activation_bytes: int = 0
    time_ns: int = 0  # measured forward + backward time (``--balance time``), else 0
    contraction: bool = False  # a matmul-like op (its FLOPs exact), not an elementwise one
    stage: int | None = None


def info(node: fx.Node) -> NodeInfo:
    """The node's NodeInfo; an unannotated node reads as zero cost and no stage."""
    return node.meta.get(META_KEY, NodeInfo())


def with_info(node: fx.Node, **changes: object) -> None:
    """Replace fields of the node's NodeInfo (used by passes on the copy they return)."""
    node.meta[META_KEY] = dataclasses.replace(info(node), **changes)  # type: ignore[arg-type]
