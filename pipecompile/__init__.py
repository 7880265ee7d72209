"""pipecompile: a pipeline-parallel compiler for PyTorch models."""

from pipecompile.split_point import split_point

__version__ = "0.1.0"
__all__ = ["__version__", "split_point"]
