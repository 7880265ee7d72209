"""pipecompile: a pipeline-parallel compiler for PyTorch models.

The public names are loaded on first use, so that `import pipecompile` (and with it a rank of
a distributed run, or the command line before it parses its arguments) stays light.
"""

__version__ = "0.1.0"
__all__ = ["__version__", "split_point", "compile", "load", "pipeline", "CompiledPipeline"]


def __getattr__(name: str) -> object:
    if name in ("compile", "load", "CompiledPipeline"):
        from pipecompile.surfaces import api

        return getattr(api, name)
    if name == "pipeline":
        from pipecompile.surfaces.decorator import pipeline

        return pipeline
    if name == "split_point":
        from pipecompile.ir.graph.split_point import split_point

        return split_point
    raise AttributeError(f"module 'pipecompile' has no attribute {name!r}")
