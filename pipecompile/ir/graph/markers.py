"""Send and receive markers: call_function targets that stand for a stage boundary in a stage graph.

A stage graph receives a value with ``recv(name, src)`` and hands one on with
``send(value, name, dsts)``. Code generation lowers them to the stage's positional inputs and
its output tuple; they are never executed.
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx

__all__ = ["recv", "send", "is_recv", "is_send"]


@fx.wrap
def recv(name: str, src: int) -> Any:
    """Stands for value ``name`` arriving from stage ``src``."""
    raise RuntimeError("pipecompile.ir.graph.markers.recv is lowered by codegen and never runs")


@fx.wrap
def send(value: Any, name: str, dsts: tuple[int, ...]) -> None:
    """Stands for value ``name`` leaving for stages ``dsts``."""
    raise RuntimeError("pipecompile.ir.graph.markers.send is lowered by codegen and never runs")


def is_recv(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is recv


def is_send(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is send
