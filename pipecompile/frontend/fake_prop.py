"""Run an fx graph on fake tensors, recording each node's value in ``node.meta["val"]``."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree

from pipecompile.frontend.quiet_logs import quiet_logs
from pipecompile.ir.graph.swapped_call import functional_call

__all__ = ["propagate_fake", "fake_values"]


class _FakeInterpreter(fx.Interpreter):
    """An fx.Interpreter whose parameters, buffers and inputs are fake: no compute, no mutation."""

    def __init__(self, module: fx.GraphModule, mode: FakeTensorMode) -> None:
        super().__init__(module)
        self.mode = mode

    def fake(self, value: Any) -> Any:
        return pytree.tree_map_only(torch.Tensor, self.mode.from_tensor, value)

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        n.meta["val"] = out
        return out

    def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
        return self.fake(super().get_attr(target, args, kwargs))

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        submodule = self.fetch_attr(target)
        state = {k: self.fake(v) for k, v in submodule.state_dict(keep_vars=True).items()}
        return functional_call(submodule, state, tuple(args), dict(kwargs))


def propagate_fake(module: fx.GraphModule, inputs: list[torch.Tensor]) -> None:
    """Annotate every node of ``module`` (in place) with its fake output value."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    interp = _FakeInterpreter(module, mode)
    with mode:
        interp.run(*[mode.from_tensor(t) for t in inputs])


class _Recording(_FakeInterpreter):
    """Records each node's fake value in ``values`` instead of the node's meta."""

    def __init__(self, module: fx.GraphModule, mode: FakeTensorMode) -> None:
        super().__init__(module, mode)
        self.values: dict[str, Any] = {}
        self.current: fx.Node | None = None

    def run_node(self, n: fx.Node) -> Any:
        self.current = n
        out = fx.Interpreter.run_node(self, n)
        self.values[n.name] = out
        return out


def fake_values(
    module: fx.GraphModule, inputs: list[tuple[tuple[int, ...], torch.dtype]]
) -> tuple[dict[str, Any], fx.Node | None, Exception | None]:
    """Every node's fake value on inputs of these shapes and dtypes, the graph untouched;
    with the node that failed and its error when one does (values up to it)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    interp = _Recording(module, mode)
    try:  # fake_tensor logs a failing op's traceback; the caller reports it in one line
        with quiet_logs("torch._subclasses.fake_tensor"), mode:
            interp.run(*[torch.zeros(shape, dtype=dtype) for shape, dtype in inputs])
    except Exception as err:
        return interp.values, interp.current, err
    return interp.values, None, None
