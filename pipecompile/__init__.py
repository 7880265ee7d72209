"""pipecompile: a pipeline-parallel compiler for PyTorch models."""

__version__ = "0.1.0"
__all__ = ["__version__"]
