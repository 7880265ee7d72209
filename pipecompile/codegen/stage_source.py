"""Write one stage as readable, standalone Python: an ``nn.Module`` that imports only torch."""

from __future__ import annotations

import re

import torch
import torch.fx as fx
from torch import nn

from pipecompile import __version__
from pipecompile.errors import EmitError
from pipecompile.ir.graph.leaf_modules import leaf_constructor
from pipecompile.ir.graph.stage_graph import Stage

__all__ = ["stage_source", "tail_source", "step_source", "class_name", "TAIL_CLASS"]

TAIL_CLASS = "Tail"

# Names fx's generated code may use, and how a file that imports only torch defines them.
_PREAMBLE = {
    "inf": 'inf = float("inf")',
    "nan": 'nan = float("nan")',
    "device": "device = torch.device",
    "NoneType": "NoneType = type(None)",
}


def class_name(index: int) -> str:
    return f"Stage{index}"


def stage_source(stage: Stage, lowered: fx.GraphModule, *, num_stages: int, model: str) -> str:
    """Python source of stage ``stage.index`` whose ``forward`` is ``lowered``'s graph."""
    docstring = [
        f"Stage {stage.index} of {num_stages} of {model}, by pipecompile {__version__}.",
        "",
        f"Inputs:  {', '.join(stage.inputs) or '(none)'}",
        f"Outputs: {', '.join(stage.outputs) or '(none)'}",
    ]
    return _module_source(lowered, class_name(stage.index), docstring, f"stage {stage.index}")


def tail_source(module: fx.GraphModule, inputs: tuple[str, ...], model: str) -> str:
    """Python source of the batch-coupled tail of ``model``: an ``nn.Module`` whose ``forward``
    takes the body's outputs joined over every micro-batch (``inputs``) and returns the
    model's outputs."""
    docstring = [
        f"The batch-coupled tail of {model}, by pipecompile {__version__}: run once a step",
        "on every micro-batch's values joined along the batch.",
        "",
        f"Inputs:  {', '.join(inputs)}",
    ]
    return _module_source(module, TAIL_CLASS, docstring, "the tail")


def step_source(
    module: fx.GraphModule, cls: str, doc: str, inputs: tuple[str, ...], outputs: tuple[str, ...]
) -> str:
    """Python source of one stage of a decoding step (``generation.step_split``): class
    ``cls``, described by ``doc``, whose ``forward`` takes ``inputs`` and returns ``outputs``.
    """
    docstring = [doc, "", f"Inputs:  {', '.join(inputs)}", f"Outputs: {', '.join(outputs)}"]
    return _module_source(module, cls, docstring, cls)


def _module_source(module: fx.GraphModule, cls: str, docstring: list[str], what: str) -> str:
    """A standalone file of class ``cls`` whose ``forward`` is ``module``'s graph.

    Raises:
        EmitError: the graph calls something outside torch (``what`` names the module).
    """
    code = module.graph.python_code("self")
    body = code.src.strip("\n")
    for name, value in code.globals.items():
        if name not in _PREAMBLE and name not in ("torch", "getattr") and _uses(body, name):
            raise EmitError(
                f"{what} calls {value!r} (as {name}), which is not part of torch; a file "
                "pipecompile writes may import only torch - keep that call out of the traced "
                "model"
            )
    lines = [
        f'"""{docstring[0]}',
        *docstring[1:],
        '"""',
        "",
        "import torch",
        "",
        *[_PREAMBLE[name] for name in _PREAMBLE if _uses(body, name)],
        "",
        "",
        f"class {cls}(torch.nn.Module):",
        "    def __init__(self) -> None:",
        "        super().__init__()",
        *("        " + line for line in _init_lines(module)),
        "",
        *("    " + line if line else "" for line in body.splitlines()),
        "",
    ]
    return "\n".join(lines).replace("\n\n\n\n\n", "\n\n\n")


def _uses(body: str, name: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(name)}\b", body) is not None


def _init_lines(module: nn.Module) -> list[str]:
    lines, ties = [], []
    owner: dict[int, str] = {}
    for name, child in module.named_children():
        source = leaf_constructor(child)
        if source is None:
            raise EmitError(f"submodule {name} ({type(child).__name__}) cannot be written as code")
        lines.append(f"self.{name} = {source}")
        for pname, tensor in child.state_dict(keep_vars=True).items():
            owner.setdefault(id(tensor), f"{name}.{pname}")
    for name, tensor in [
        *module.named_parameters(recurse=False),
        *module.named_buffers(recurse=False),
    ]:
        if id(tensor) in owner:
            ties.append(f"self.{name} = self.{owner[id(tensor)]}  # tied")
            continue
        owner[id(tensor)] = name
        lines.append(_tensor_line(name, tensor))
    for name, child in module.named_children():
        for pname, tensor in child.state_dict(keep_vars=True).items():
            path = f"{name}.{pname}"
            if owner[id(tensor)] != path:
                ties.append(f"self.{path} = self.{owner[id(tensor)]}  # tied")
            elif isinstance(tensor, nn.Parameter) and not tensor.requires_grad:
                lines.append(f"self.{path}.requires_grad_(False)")
    return lines + ties


def _tensor_line(name: str, tensor: torch.Tensor) -> str:
    zeros = f"torch.zeros({tuple(tensor.shape)}, dtype={tensor.dtype})"
    if isinstance(tensor, nn.Parameter):
        frozen = "" if tensor.requires_grad else ", requires_grad=False"
        return f"self.{name} = torch.nn.Parameter({zeros}{frozen})"
    return f'self.register_buffer("{name}", {zeros})'
