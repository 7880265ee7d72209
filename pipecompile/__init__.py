"""pipecompile: a pipeline-parallel compiler for PyTorch models."""

from pipecompile.split_point import split_point

__version__ = "0.1.0"
__all__ = ["__version__", "split_point", "compile", "load", "pipeline", "CompiledPipeline"]


def __getattr__(name: str) -> object:
    """The API is imported on first use, so `import pipecompile` stays light."""
    if name in ("compile", "load", "CompiledPipeline"):
        from pipecompile import api

        return getattr(api, name)
    if name == "pipeline":
        from pipecompile.decorator import pipeline

        return pipeline
    raise AttributeError(f"module 'pipecompile' has no attribute {name!r}")
