"""Capture a model as an fx graph: torch.fx.symbolic_trace first, torch.export as the fallback."""

from __future__ import annotations

import inspect
import linecache
import os
import traceback
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from pipecompile.errors import TraceError
from pipecompile.frontend.batch_views import BatchView, batch_view, constant_view
from pipecompile.frontend.dtype_check import check_dtypes
from pipecompile.frontend.fake_prop import propagate_fake
from pipecompile.frontend.fx_wrapped import inlining_wrapped, opaque_calls
from pipecompile.frontend.inline_regions import (
    NO_GRAD,
    detach_no_grad_values,
    inline_grad_regions,
)
from pipecompile.frontend.layout_free import views_as_reshapes
from pipecompile.frontend.quiet_logs import held_stderr, quiet_logs
from pipecompile.ir.graph.leaf_modules import is_rebuildable_leaf
from pipecompile.ir.graph.split_point import recording
from pipecompile.ir.graph.traced import Traced
from pipecompile.ir.graph.values import without_nones
from pipecompile.model.own_forward import tracing

__all__ = ["trace"]


class _LeafTracer(fx.Tracer):
    """Keeps torch.nn modules that codegen can rebuild as call_module; traces through the rest.

    Buffers are proxied like parameters: otherwise ``self.count.add_(1)`` would run on the
    real buffer while tracing, changing the user's model and leaving no trace in the graph.
    """

    proxy_buffer_attributes = True

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return is_rebuildable_leaf(m)

    def create_node(self, kind: str, *args: Any, **kwargs: Any) -> fx.Node:
        # torch.fx runs `with torch.no_grad():` while tracing but records nothing of it: mark
        # the ops made with gradients off, whose values detach_no_grad_values then detaches.
        node = super().create_node(kind, *args, **kwargs)
        if kind.startswith("call_") and not torch.is_grad_enabled():
            node.meta[NO_GRAD] = True
        return node


def trace(
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    dynamic: dict[str, dict[int, str]] | None = None,
    *,
    microbatches: int = 1,
) -> Traced:
    """Trace ``model`` called as ``model(**inputs)``; raise TraceError with both tracers' reasons.
    ``dynamic`` (input -> dim -> symbol): dimensions torch.export keeps symbolic (torch.fx
    keeps every size it reads symbolic anyway). ``inputs`` is one of ``microbatches``
    micro-batches of the example: where both tracers fail because a view hard-codes the
    example's rows, the error names that view.

    Example:
        >>> traced = trace(torch.nn.Linear(4, 2), {"input": torch.randn(3, 4)})
        >>> traced.tracer, traced.input_names
        ('torch.fx', ('input',))
    """
    # fake_tensor logs each failing op's traceback; a failure is reported in one error here
    with tracing(), quiet_logs("torch._subclasses.fake_tensor"):
        traced = _trace(model, inputs, dynamic, microbatches)
    check_dtypes(traced.module)
    return traced


def _trace(
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    dynamic: dict[str, dict[int, str]] | None,
    microbatches: int,
) -> Traced:
    try:
        return _trace_fx_inlining(model, inputs, lines=dynamic is not None)
    except Exception as fx_err:
        fx_reason = _reason(fx_err, model)
        if "Expected more than 1 value per channel when training" in str(fx_err):
            shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in inputs.items())
            raise TraceError(
                f"the micro-batch is too small for BatchNorm in training mode, which needs more "
                f"than one value per channel (traced on {shapes}): use fewer --microbatches "
                "(a micro-batch is batch / microbatches rows) or a larger example batch"
            ) from None
    try:
        return _trace_export(model, inputs, dynamic)
    except _SplitPointUnderExport as err:
        raise TraceError(f"{err} (torch.fx: {fx_reason})") from None
    except Exception as export_err:
        export_reason = _reason(export_err, model)
    found = batch_view(model, inputs, microbatches)
    if found is not None:
        raise TraceError(_batch_view_message(found, model, microbatches)) from None
    raise TraceError(
        f"cannot trace {type(model).__name__}:\n"
        f"  torch.fx:     {fx_reason}\n"
        f"  torch.export: {export_reason}\n"
        "Make forward() traceable: avoid Python control flow that depends on tensor values "
        "(use torch.where or torch.cond), keep example inputs static, and check that "
        "model(**example_inputs()) runs eagerly."
    )


def fixed_batch_view(model: nn.Module, micro: dict[str, torch.Tensor]) -> str | None:
    """Where ``model`` writes the traced micro-batch's rows as a constant (a view that
    still asks for them at twice the rows), for the compile's note; None if nowhere."""
    rows = next((t.shape[0] for t in micro.values() if t.dim()), 0)
    found = constant_view(model, micro, rows, 2 * rows) if rows else None
    if found is None:
        return None
    where = _where(found.error, model)
    sizes = list(found.sizes)
    return f"the {found.call} at {where} asks for {sizes}, {rows} rows written as a constant"


def _batch_view_message(found: BatchView, model: nn.Module, microbatches: int) -> str:
    where = _where(found.error, model)
    view = f"the {found.call} at {where}" if where else f"a {found.call}"
    n = found.example_rows
    return (
        f"cannot trace {type(model).__name__}: {view} asks for "
        f"{list(found.sizes)}, the example batch's {n} rows written as a constant, but the "
        f"model is traced on one micro-batch of {found.rows} rows (--microbatches "
        f"{microbatches} splits the {n} rows): take the batch's size from the tensor "
        f"(x.shape[0], or -1, or x.flatten(1)) instead of {n}, or compile with --microbatches 1"
    )


class _SplitPointUnderExport(Exception):
    pass


def _trace_fx_inlining(model: nn.Module, inputs: dict[str, torch.Tensor], *, lines: bool) -> Traced:
    """fx's trace; where it left calls of Python helpers that ``torch.fx.wrap`` keeps opaque
    (torchvision's ``stochastic_depth``), which a stage file cannot import, the trace again
    with those helpers traced through. Raises when that fails (torch.export is next)."""
    graph = _fx_graph(model, inputs, lines=lines)
    opaque = opaque_calls(graph)
    if not opaque:
        return _trace_fx(model, graph, inputs)
    try:
        with inlining_wrapped():
            graph = _fx_graph(model, inputs, lines=lines)
        still = opaque_calls(graph)
        if still:
            raise _OpaqueCall(_opaque_reason(still, None))
        return _trace_fx(model, graph, inputs)
    except _OpaqueCall:
        raise
    except Exception as err:
        raise _OpaqueCall(_opaque_reason(opaque, err)) from err


class _OpaqueCall(Exception):
    pass


def _opaque_reason(nodes: list[fx.Node], err: BaseException | None) -> str:
    """Each helper once, with the first module calling it."""
    first: dict[str, str] = {}
    for node in nodes:
        first.setdefault(_function_name(node.target), _module_path(node))
    calls = "; ".join(f"{path} calls {helper}" for helper, path in first.items())
    failed = f"; traced through, they fail: {_reason(err)}" if err is not None else ""
    return (
        f"{calls}, which torch.fx.wrap keeps opaque (one call) and a stage file cannot "
        f"import{failed}"
    )


def _function_name(function: Any) -> str:
    """``name (file:line)`` for a Python function, ``module.name`` for another callable."""
    name = getattr(function, "__qualname__", str(function))
    code = getattr(function, "__code__", None)
    if code is not None:
        return f"{name} ({code.co_filename}:{code.co_firstlineno})"
    return f"{getattr(function, '__module__', '?')}.{name}"


def _module_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    path = next(reversed(stack.values()), ("",))[0] if stack else ""
    return f"module {path}" if path else "the model's forward"


def _fx_graph(model: nn.Module, inputs: dict[str, Any], *, lines: bool) -> fx.Graph:
    """``lines``: record each op's line in the model's source (``--dynamic`` names the op that
    fixes a size by it). A keyword of forward the inputs do not give keeps its default (a
    decoding step's cache, say: None), as it does when the model is called."""
    tracer = _LeafTracer()
    tracer.record_stack_traces = lines
    with recording(tracer), torch.enable_grad():  # only the model's own no_grad regions count
        return tracer.trace(model, concrete_args=_defaults(model, inputs) or None)


def _defaults(model: nn.Module, inputs: dict[str, Any]) -> dict[str, Any]:
    """forward's parameters the inputs do not give whose default is None."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {
        p.name: None
        for p in params
        if p.name not in inputs and p.default is None and p.kind is p.POSITIONAL_OR_KEYWORD
    }


def _trace_fx(model: nn.Module, graph: fx.Graph, inputs: dict[str, torch.Tensor]) -> Traced:
    module = fx.GraphModule(model, graph, class_name=type(model).__name__)
    names = _keep_placeholders(module, list(inputs))
    spec = _flatten_output(module)
    propagate_fake(module, [inputs[n] for n in names])
    detach_no_grad_values(module)
    return Traced(module, "torch.fx", tuple(names), spec, model)


def _trace_export(
    model: nn.Module, inputs: dict[str, torch.Tensor], dynamic: dict[str, dict[int, str]] | None
) -> Traced:
    shapes = None
    if dynamic:  # AUTO: export keeps each symbolic unless the model fixes it (then the probe says)
        auto = torch.export.Dim.AUTO
        shapes = {n: {d: auto for d in dynamic.get(n, {})} or None for n in inputs}
    # A failure prints (and symbolic_shapes logs) the partial graph; the error names its line.
    # symbolic_shapes logs a failing graph, non_strict_utils a size of 1 it keeps fixed (the
    # summary's sizes line says what may vary)
    quiet = ("torch.fx.experimental.symbolic_shapes", "torch._export.non_strict_utils")
    with recording(None) as missed, quiet_logs(*quiet):
        with held_stderr():
            exported = torch.export.export(
                model, (), dict(inputs), dynamic_shapes=shapes, strict=False
            )
    if missed:
        raise _SplitPointUnderExport(
            f"{type(model).__name__}.forward calls pipecompile.split_point(), which only the "
            "torch.fx tracer can record, and torch.fx could not trace the model; mark the "
            "boundaries with --split-at MODULE_PATH instead"
        )
    module = exported.module()
    module._forward_pre_hooks.clear()  # export's kwargs checker; the graph now takes flat inputs
    names = [n.target for n in module.graph.nodes if n.op == "placeholder"]
    if names != list(inputs):
        raise RuntimeError(f"exported placeholders {names} do not match inputs {list(inputs)}")
    spec = module._out_spec  # set by torch.export on the module it returns
    assert spec is not None
    output = next(n for n in reversed(module.graph.nodes) if n.op == "output")
    # a model output's field left None (LLaVA's): the spec puts it back, the graph returns
    # computed values only
    flat, spec = without_nones(list(output.args[0]), spec)
    output.args = (tuple(flat),)
    for node in [n for n in module.graph.nodes if n.op == "call_module" and not n.users]:
        if str(node.target).startswith("_guards"):  # export's input guard; stages fix shapes anyway
            module.graph.erase_node(node)
    module.graph.set_codegen(fx.graph.CodeGen())
    type(module).__name__ = type(model).__name__  # each GraphModule has a class of its own
    inline_grad_regions(module)
    for node in module.graph.nodes:  # export's stand-in for the size ops of a symbolic batch
        stack = node.meta.get("nn_module_stack") or {}
        if any(str(key).startswith("_empty_nn_module_stack") for key in stack):
            node.meta["nn_module_stack"] = {
                k: v for k, v in stack.items() if not str(k).startswith("_empty_nn_module_stack")
            }
    views_as_reshapes(module)  # a traced layout is not the one every device makes
    missing = [n.name for n in module.graph.nodes if n.op != "output" and "val" not in n.meta]
    if missing:
        raise RuntimeError(f"export left nodes without values: {missing[:5]}")
    if shapes is not None:  # the example's sizes for every value, as the passes expect
        propagate_fake(module, [inputs[str(n)] for n in names])
    return Traced(module, "torch.export", tuple(str(n) for n in names), spec, model)


def _keep_placeholders(module: fx.GraphModule, names: list[str]) -> list[str]:
    """Drop placeholders for parameters the inputs leave at their defaults (they must be unused)."""
    kept = []
    for node in [n for n in module.graph.nodes if n.op == "placeholder"]:
        for user in list(node.users):  # fx's check of a default given as a concrete argument
            if getattr(user.target, "__name__", "") == "_assert_is_none":
                module.graph.erase_node(user)
        if node.target in names:
            kept.append(str(node.target))
        elif node.users:
            raise RuntimeError(
                f"forward parameter {node.target!r} is used but has no example input"
            )
        else:
            module.graph.erase_node(node)
    module.recompile()
    return kept


def _flatten_output(module: fx.GraphModule) -> pytree.TreeSpec:
    output = next(n for n in reversed(module.graph.nodes) if n.op == "output")
    leaves, spec = pytree.tree_flatten(output.args[0])
    for k, leaf in enumerate(leaves):
        if not isinstance(leaf, fx.Node):
            raise RuntimeError(f"model output #{k} is the constant {leaf!r}, not a computed value")
    output.args = (tuple(leaves),)
    module.recompile()
    return spec


def _reason(err: BaseException, model: nn.Module | None = None) -> str:
    """The error's first line, and where in the user's code: the file and line of the
    innermost frame outside torch and pipecompile, and the module whose code it is."""
    if isinstance(err, _OpaqueCall):
        return str(err)
    text = (str(err).strip().splitlines() or [""])[0][:240]
    where = _where(err, model)
    return f"{type(err).__name__}: {text}{f' (at {where})' if where else ''}"


def _where(err: BaseException, model: nn.Module | None) -> str:
    """``FILE:LINE, in module PATH: `code``` of the innermost frame of ``err``'s traceback in
    the user's code, else in a library's (a Hugging Face model's own file), never torch's,
    pipecompile's or code generated at run time (``<string>``); empty when there is none."""
    frames = [
        (frame, line)
        for frame, line in traceback.walk_tb(err.__traceback__)
        if not _ours_or_generated(frame.f_code.co_filename)
    ]
    if not frames:
        return ""
    users = [(f, n) for f, n in frames if "site-packages" not in f.f_code.co_filename]
    where = _frame_text(*frames[-1], model)
    if users and users[-1] != frames[-1]:  # in a library the user's code called
        where += f", called from {_frame_text(*users[-1], model)}"
    return where


def _frame_text(frame: Any, line: int, model: nn.Module | None) -> str:
    code = linecache.getline(frame.f_code.co_filename, line).strip()
    shown = f": `{code}`" if code else ""
    return f"{frame.f_code.co_filename}:{line}{_in_module(frame, model)}{shown}"


def _ours_or_generated(filename: str) -> bool:
    """torch's, pipecompile's, or source made at run time (``<string>``, ``<eval_with_key>``)."""
    torch_dir = f"{os.sep}torch{os.sep}"
    return filename.startswith("<") or torch_dir in filename or "/pipecompile/" in filename


def _in_module(frame: Any, model: nn.Module | None) -> str:
    """', in module PATH' when the frame is a method of one of ``model``'s modules."""
    owner = frame.f_locals.get("self")
    if model is None or not isinstance(owner, nn.Module):
        return ""
    path = next((name for name, m in model.named_modules() if m is owner), None)
    if path is None:
        return ""
    return f", in module {path}" if path else ", in the model's forward"
