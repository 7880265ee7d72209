"""The front end: a model captured as an fx graph (torch.fx, else torch.export), every node
annotated with its fake value, checked for what eager PyTorch would refuse."""

from pipecompile.frontend.tracer import trace
from pipecompile.ir.graph.traced import Traced
from pipecompile.model.own_forward import tracing

__all__ = ["trace", "Traced", "tracing"]
