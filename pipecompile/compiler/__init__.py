"""The compiler driver: the pass list, run in order and verified after each pass."""

from pipecompile.compiler.driver import PASSES, compile_model
from pipecompile.compiler.options import CompileOptions
from pipecompile.ir.programs.topology import topology, topology_from_manifest  # their former home
from pipecompile.ir.records.compiled import Compiled

__all__ = [
    "PASSES",
    "CompileOptions",
    "Compiled",
    "compile_model",
    "topology",
    "topology_from_manifest",
]
