"""The compiler driver: the pass list, run in order and verified after each pass."""

from pipecompile.compiler.driver import PASSES, Compiled, compile_model

__all__ = ["PASSES", "Compiled", "compile_model"]
