"""Pass: profile_costs — measure each op's forward plus backward time on the real device.

Requires: a traced module and one real micro-batch of its inputs.
Guarantees: a copy of the module whose ops carry ``NodeInfo.time_ns``: the median over
``repeats`` runs (after ``warmup`` runs) of the op's forward and of the backward of its
tensor output, measured one op at a time on real values (their inputs computed by running
the graph once). Profiles are cached on disk, keyed by the graph's code, the input shapes,
the torch version, the device and the thread count, so a recompile measures nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from pipecompile.graph_copy import copy_graph_module
from pipecompile.node_info import with_info

__all__ = ["profile_costs", "default_cache"]

_OPS = ("call_function", "call_method", "call_module")


def default_cache() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "pipecompile" / "profiles"


def profile_costs(
    module: fx.GraphModule,
    *,
    inputs: list[Any],
    warmup: int = 2,
    repeats: int = 5,
    cache: Path | None = None,
    progress: bool = False,
) -> fx.GraphModule:
    """Return a copy of ``module`` whose ops carry measured ``time_ns`` (see the docstring)."""
    out = copy_graph_module(module)
    key = _key(out, inputs)
    path = (cache or default_cache()) / f"{key}.json"
    times = _load(path)
    if times is None:
        times = _measure(out, inputs, warmup, repeats, progress)
        _store(path, times)
    elif progress:
        print(f"    profile: {len(times)} ops from cache {path}", file=sys.stderr)
    for node in out.graph.nodes:
        if node.op in _OPS:
            with_info(node, time_ns=int(times.get(node.name, 0)))
    return out


def _measure(
    module: fx.GraphModule, inputs: list[Any], warmup: int, repeats: int, progress: bool
) -> dict[str, int]:
    env: dict[fx.Node, Any] = {}
    interpreter = fx.Interpreter(module)
    ops = [n for n in module.graph.nodes if n.op in _OPS]
    placeholders = iter(inputs)
    times: dict[str, int] = {}
    done = 0
    start = time.perf_counter()
    for node in module.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(placeholders)
            continue
        if node.op == "output":
            break
        args, kwargs = _args(node, env)
        run = _runner(interpreter, node, args, kwargs)
        with torch.no_grad():
            env[node] = run()
        if node.op in _OPS:
            times[node.name] = _time(run, args, kwargs, warmup, repeats, interpreter, node)
            done += 1
            if progress and (done % 200 == 0 or done == len(ops)):
                print(f"    profile: {done}/{len(ops)} ops "
                      f"({time.perf_counter() - start:.1f} s)", file=sys.stderr)  # fmt: skip
    return times


def _args(node: fx.Node, env: dict[fx.Node, Any]) -> tuple[tuple, dict]:
    args = fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
    return args, kwargs  # type: ignore[return-value]


def _runner(interpreter: fx.Interpreter, node: fx.Node, args: tuple, kwargs: dict) -> Callable:
    method = getattr(interpreter, node.op)
    return lambda: method(node.target, args, kwargs)


def _time(run: Callable, args: tuple, kwargs: dict, warmup: int, repeats: int,
          interpreter: fx.Interpreter, node: fx.Node) -> int:  # fmt: skip
    """Median forward + backward nanoseconds of one op on its real inputs."""
    grad_args = pytree.tree_map(_leaf, args)
    grad_kwargs = pytree.tree_map(_leaf, kwargs)
    wanted = [t for t in pytree.tree_leaves((grad_args, grad_kwargs)) if _wants_grad(t)]
    if node.op == "call_module":
        wanted += [p for p in interpreter.module.get_submodule(str(node.target)).parameters()]
    forward = _runner(interpreter, node, grad_args, grad_kwargs)
    try:
        return _samples(forward, wanted, warmup, repeats)
    except RuntimeError:  # an in-place op on a leaf: time the forward alone, on fresh copies
        fresh = _runner(interpreter, node, *pytree.tree_map(_copy, (args, kwargs)))
        with torch.no_grad():
            return _samples(fresh, [], warmup, repeats)


def _samples(forward: Callable, wanted: list, warmup: int, repeats: int) -> int:
    samples = []
    for k in range(warmup + repeats):
        begin = time.perf_counter_ns()
        out = forward()
        outs = [t for t in pytree.tree_leaves(out) if _wants_grad(t)]
        if outs and wanted:
            torch.autograd.grad(outs, wanted, [torch.ones_like(t) for t in outs],
                                allow_unused=True)  # fmt: skip
        if k >= warmup:
            samples.append(time.perf_counter_ns() - begin)
    return int(statistics.median(samples))


def _copy(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def _leaf(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().requires_grad_()
    return value


def _wants_grad(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad


def _key(module: fx.GraphModule, inputs: list[Any]) -> str:
    shapes = [tuple(t.shape) + (str(t.dtype),) for t in inputs if isinstance(t, torch.Tensor)]
    device = next((str(t.device) for t in inputs if isinstance(t, torch.Tensor)), "cpu")
    text = json.dumps([module.code, shapes, torch.__version__, device, torch.get_num_threads()],
                      default=str)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _load(path: Path) -> dict[str, int] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _store(path: Path, times: dict[str, int]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(times))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs the next compile a re-measurement
