"""One model file eagerly, then (with ``--peer``) through torch.distributed.pipelining; run by
tools/qa/zoo.py in a child process with a time limit, one per model.

    python tools/qa/zoos/probe.py MODEL_FILE --microbatches 2 [--peer] [--max-params N]

Prints one JSON line per part, so that what finished before a time limit still counts:

* ``{"eager": "ok" | "ReasonError: message", "params": N, "deterministic": bool}``: the model
  built, and one forward, loss and backward on the example batch; a second build's forward on
  the same batch must give the same output (a model that draws random numbers, or whose
  weights are not seeded, cannot be compared with a pipeline);
* ``{"peer_split": bool, "peer_equal": bool, "peer_reason": str}``: ``pipeline(model,
  split_spec={NAME: SplitPoint.BEGINNING})`` with NAME the middle one of the model's top-level
  children (``list(model.named_children())[len // 2]``), traced on the first micro-batch
  (``batch / microbatches`` rows of every input); split = it made 2 stages; equal = the split
  graph's forward (``pipe.split_gm``, stages in a row, no schedule) on that micro-batch equals a
  fresh eager model's output, every output tensor within ``atol = rtol = 1e-5``.

The peer is skipped for a model that failed eagerly or has more than ``--max-params``
parameters.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

ATOL = RTOL = 1e-5


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("zoo_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def named_batch(module: ModuleType, model: Any) -> tuple[dict[str, Any], bool]:
    """The example inputs by forward()'s parameter names, and whether they are positional."""
    raw = module.example_inputs()
    if isinstance(raw, dict):
        return dict(raw), False
    names = list(inspect.signature(model.forward).parameters)
    return dict(zip(names, raw)), True


def call(model: Any, batch: dict[str, Any], positional: bool) -> Any:
    return model(*batch.values()) if positional else model(**batch)


def one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}"[:300]


def eager(module: ModuleType) -> dict[str, Any]:
    import torch

    model = module.build_model()
    params = sum(p.numel() for p in model.parameters())
    batch, positional = named_batch(module, model)
    output = call(model, batch, positional)
    module.loss_fn(output, *module.example_targets()).backward()
    again = module.build_model()
    torch.manual_seed(12345)  # random numbers drawn in forward now differ from the first's
    again = call(again, batch, positional)
    same = all(torch.equal(a, b) for a, b in zip(_tensors(output), _tensors(again), strict=True))
    return {"eager": "ok", "params": params, "deterministic": same}


def _tensors(tree: Any) -> list[Any]:
    import torch
    from torch.utils._pytree import tree_flatten

    return [leaf.detach() for leaf in tree_flatten(tree)[0] if isinstance(leaf, torch.Tensor)]


def peer(module: ModuleType, microbatches: int) -> dict[str, Any]:
    """torch.distributed.pipelining's split of the model at its middle top-level child."""
    import torch
    from torch.distributed.pipelining import SplitPoint, pipeline

    model = module.build_model()
    batch, positional = named_batch(module, model)
    micro = {k: v[: v.shape[0] // microbatches].clone() for k, v in batch.items()}
    children = [name for name, _ in model.named_children()]
    if not children:
        return {"peer_split": False, "peer_equal": False, "peer_reason": "no children"}
    point = children[len(children) // 2]
    args = tuple(micro.values()) if positional else ()
    kwargs = {} if positional else dict(micro)
    try:
        pipe = pipeline(
            model, mb_args=args, mb_kwargs=kwargs, split_spec={point: SplitPoint.BEGINNING}
        )
    except Exception as err:
        return {"peer_split": False, "peer_equal": False, "peer_reason": one_line(err)}
    split = pipe.num_stages == 2
    reason = "" if split else f"{pipe.num_stages} stage(s) at {point}"
    with torch.no_grad():
        want = _tensors(call(module.build_model(), micro, positional))
        try:
            gm = pipe.split_gm  # its own forward refuses to run: interpret it
            got = _tensors(torch.fx.Interpreter(gm).run(*_placeholders(gm, micro)))
        except Exception as err:
            return {
                "peer_split": split,
                "peer_equal": False,
                "peer_reason": f"split graph forward: {one_line(err)}",
            }
    equal, why = _compare(got, want)
    return {"peer_split": split, "peer_equal": equal, "peer_reason": reason or why}


def _placeholders(gm: Any, batch: dict[str, Any]) -> list[Any]:
    """The split graph's inputs, bound by placeholder name (defaults where unnamed)."""
    values = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            name = str(node.target).lstrip("*")
            values.append(batch[name] if name in batch else (node.args[0] if node.args else None))
    return values


def _compare(got: list[Any], want: list[Any]) -> tuple[bool, str]:
    import torch

    if len(got) != len(want):
        return False, f"{len(got)} output tensors, eager has {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape:
            return False, f"output {k}: shape {tuple(g.shape)}, eager {tuple(w.shape)}"
        if w.is_floating_point() and not torch.allclose(g, w, atol=ATOL, rtol=RTOL):
            return False, f"output {k}: max |diff| {float((g - w).abs().max()):.3e}"
        if not w.is_floating_point() and not torch.equal(g, w):
            return False, f"output {k} differs"
    return True, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_file", type=Path)
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--peer", action="store_true")
    parser.add_argument("--max-params", type=float, default=float("inf"))
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    try:
        module = load(args.model_file)
        found = eager(module)
    except Exception as err:
        found = {"eager": one_line(err)}
    print(json.dumps(found), flush=True)
    if args.peer and found["eager"] == "ok" and found["params"] <= args.max_params:
        try:
            print(json.dumps(peer(module, args.microbatches)), flush=True)
        except Exception as err:
            reason = f"peer failed: {one_line(err)}"
            print(json.dumps({"peer_split": False, "peer_equal": False, "peer_reason": reason}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
