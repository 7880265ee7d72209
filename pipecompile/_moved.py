"""Old import paths of modules that moved into the layer packages keep working.

Before the layout of 0.2, every module sat in the package root (``pipecompile.cost_model``,
``pipecompile.onnx_chain``, ``pipecompile.viz.pictures``, ...). A finder on ``sys.meta_path``
answers each old name with the module at its new place (the same module object), so user code
and scripts written against the old paths run unchanged. pipecompile's own code uses the new
paths only (tests/test_layers.py checks).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

__all__ = ["MOVED", "install"]

_IR = ("markers", "stage_graph", "node_info", "values", "ties", "param_names", "graph_copy",
       "instr", "program", "program_deps", "topology", "verify_program", "simulate",
       "memory_model", "sizes", "cost_model", "leaf_modules")  # fmt: skip

# old module (or package: its submodules follow) -> new module
MOVED: dict[str, str] = {
    **{f"pipecompile.{name}": f"pipecompile.ir.{name}" for name in _IR},
    "pipecompile.runtime.microbatch": "pipecompile.ir.microbatch",
    "pipecompile.codegen.lower": "pipecompile.ir.lower",
    "pipecompile.fake_prop": "pipecompile.frontend.fake_prop",
    "pipecompile.inline_regions": "pipecompile.frontend.inline_regions",
    "pipecompile.dtype_check": "pipecompile.frontend.dtype_check",
    "pipecompile.model_file": "pipecompile.model.model_file",
    "pipecompile.fingerprint": "pipecompile.model.fingerprint",
    **{
        f"pipecompile.{name}": f"pipecompile.reports.{name}"
        for name in ("balance_table", "summary", "show", "timeline_text")
    },  # fmt: skip
    "pipecompile.viz": "pipecompile.reports.pictures",
    "pipecompile.viz.layers": "pipecompile.ir.layers",
    "pipecompile.onnx_export": "pipecompile.interop.onnx_export",
    "pipecompile.onnx_chain": "pipecompile.interop.onnx_chain",
}


def new_name(old: str) -> str | None:
    """Where module ``old`` lives now, or None if it did not move."""
    for before in sorted(MOVED, key=len, reverse=True):  # the most specific entry wins
        if old == before or old.startswith(before + "."):
            return MOVED[before] + old[len(before) :]
    return None


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object, target: object = None) -> object:
        target_name = new_name(fullname)
        if target_name is None:
            return None
        real = importlib.util.find_spec(target_name)
        if real is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, self, is_package=real.submodule_search_locations is not None
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(new_name(spec.name) or spec.name)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the module ran at its new place


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
