"""Pass: profile_costs — measure each op's forward plus backward time on the real device.

Requires: a traced module and one real micro-batch of its inputs.
Guarantees: a copy of the module whose ops carry ``NodeInfo.time_ns``: the fastest of
``repeats`` runs (after ``warmup`` runs) of the op's forward and of the backward of its
tensor output, measured one op at a time on real values (their inputs computed by running
the graph once). Profiles are cached on disk, keyed by the graph's code, the input shapes,
the torch version, the device and the thread count, so a recompile measures nothing. What
timing an op alone adds to it (starting a backward pass per op; measured on a tiny op, alone
and in a chain) is subtracted, since a stage runs one backward pass for all its ops, and the
times are then scaled so they add up to a measured forward and backward of the whole graph.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from pipecompile.files.cache_dir import cache_root
from pipecompile.ir.graph.graph_copy import copy_graph_module
from pipecompile.ir.graph.node_info import with_info

__all__ = ["profile_costs", "default_cache"]

_OPS = ("call_function", "call_method", "call_module")


def default_cache() -> Path:
    """``profiles`` in pipecompile's cache folder (``files.cache_dir``), beside the
    calibration."""
    return cache_root() / "profiles"


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
    overhead = _harness_overhead(warmup, repeats)
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
            measured = _time(run, args, kwargs, warmup, repeats, interpreter, node)
            # at least 1 ns: a run op is never free, though a tiny one can measure below the
            # harness overhead on a busy machine (and 0 would read as "not measured")
            times[node.name] = max(1, measured - overhead)
            done += 1
            if progress and (done % 200 == 0 or done == len(ops)):
                print(
                    f"    profile: {done}/{len(ops)} ops ({time.perf_counter() - start:.1f} s)",
                    file=sys.stderr,
                )
    return _scaled_to_whole(times, _whole_graph_ns(module, inputs, warmup, repeats))


def _whole_graph_ns(module: fx.GraphModule, inputs: list[Any], warmup: int, repeats: int) -> int:
    """Median time of one forward and backward of the whole graph on the real inputs."""
    params = [p for p in module.parameters() if p.requires_grad]

    def run() -> Any:
        return module(*inputs)

    return _samples(run, params, warmup, repeats)


def _scaled_to_whole(times: dict[str, int], whole: int) -> dict[str, int]:
    """The per-op times scaled so they add up to the whole graph's measured time: timing an
    op alone keeps its weights and inputs in cache and pays no share of the interpreter's
    memory traffic, so the parts add up to less (or, with tiny ops, more) than the whole."""
    total = sum(times.values())
    if total <= 0 or whole <= 0:
        return times
    # at least 1 ns again: a 1-ns op scaled down must not round to 0 ("not measured")
    return {name: max(1, round(t * whole / total)) for name, t in times.items()}


def _harness_overhead(warmup: int, repeats: int) -> int:
    """What timing one op alone adds to it (starting a backward pass, one op's dispatch):
    a tiny op timed alone minus the same op's share of a chain of 64 timed together."""
    x = torch.ones(8, requires_grad=True)

    def chain(length: int) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            y = x
            for _ in range(length):
                y = y * 1.0
            return y

        return run

    alone = _samples(chain(1), [x], warmup, 5 * repeats)
    shared = _samples(chain(64), [x], warmup, 5 * repeats) / 64
    return int(max(0.0, alone - shared))


def _args(node: fx.Node, env: dict[fx.Node, Any]) -> tuple[tuple, dict]:
    args = fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
    return args, kwargs  # type: ignore[return-value]


def _runner(interpreter: fx.Interpreter, node: fx.Node, args: tuple, kwargs: dict) -> Callable:
    method = getattr(interpreter, node.op)
    return lambda: method(node.target, args, kwargs)


def _time(
    run: Callable,
    args: tuple,
    kwargs: dict,
    warmup: int,
    repeats: int,
    interpreter: fx.Interpreter,
    node: fx.Node,
) -> int:
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
            torch.autograd.grad(outs, wanted, [torch.ones_like(t) for t in outs], allow_unused=True)
        if k >= warmup:
            samples.append(time.perf_counter_ns() - begin)
    return min(samples)  # noise only adds time: the fastest run is the steadiest figure


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
    key = ["scaled-to-whole, fastest", module.code, shapes, torch.__version__, device]
    text = json.dumps([*key, torch.get_num_threads()], default=str)
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
