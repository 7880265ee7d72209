"""The same random model through a peer, ``torch.distributed.pipelining``, classified as
matched, refused, mismatch, internal or invalid, so that the docs can say how many random
models each tool handles.

This compares tracing and splitting only, not schedules: ``pipeline()`` traces the model
with ``torch.export`` on one micro-batch and cuts it at split points, and the split graph
(``pipe.split_gm``, the ``submod_*`` stages in a row) then runs forward, ``loss_fn`` and
backward on that same micro-batch in this process, without ``PipelineStage``, a schedule or
a process group.

* split points: the model's direct submodules (the items of a ``ModuleList`` or
  ``ModuleDict`` count as direct), in the order forward first calls them;
  ``SplitPoint.BEGINNING`` at ``stages - 1`` of them spread evenly, the first one left out
  unless every one is needed (a split before the first call would cut an empty stage);
  fewer when the model calls fewer; a module called twice splits before each call.
  ``stages`` is the case's Config's; the stages actually produced are recorded.
* the micro-batch: the first ``batch / microbatches`` rows of every input (integer and
  boolean ones too), as pipecompile's first micro-batch, and of every target; passed as
  ``mb_args`` when the model file's ``example_inputs`` is a tuple, else as ``mb_kwargs``.
* the run: ``torch.fx.Interpreter`` over ``pipe.split_gm`` (its own ``forward`` is replaced
  by one that raises, and ``Pipe.__call__`` detaches every stage's inputs, which would stop
  gradients at stage boundaries). Its outputs come back flat and are put back in the eager
  output's structure (dict, tuple) for ``loss_fn``.
* the comparison, with ``atol = rtol = 1e-5``: every output leaf, then every parameter's
  gradient, then every buffer a stage holds after the step (BatchNorm statistics, counters,
  running means). Stages keep the original qualified names (``submod_pp_1`` holds
  ``lin0.weight``); a parameter used by several stages is copied into each (``REPLICATE``)
  and its copies' gradients are summed (a module called twice is ``emb0`` and ``emb0@1``);
  tied parameters are compared under the name the eager model lists first; a missing
  gradient counts as zeros.

Verdicts: matched; refused (``pipeline()`` raised: the exception's class and first words are
the reason, with the ``torch.export`` error underneath when ``pipeline()`` wraps one);
mismatch (outputs, gradients or buffers differ, or fewer outputs); internal (anything else raised
while running the split graph, the loss or backward, or a hang); invalid (the model did not
run eagerly: a bug of the generator, also seen by ``run_case``).
"""

from __future__ import annotations

import re
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuzzing.generate import Case
from fuzzing.limits import Timeout, causes, failure_words, time_limit

PEER = "torch.distributed.pipelining"
PEER_TIMEOUT_S = 120
ATOL = RTOL = 1e-5
_CALL_SUFFIX = re.compile(r"@\d+(?=\.|$)")  # ``emb0@1``: emb0's second call in the graph
_EXPORT_WRAPPER = "It seems that we cannot capture your model"


@dataclass
class PeerOutcome:
    """What the peer did with one seed's model."""

    seed: int
    verdict: str  # matched, refused, mismatch, internal, invalid
    key: str = ""  # the reason, normalised as fuzzing.run's keys are
    detail: str = ""
    stages: int = 0  # the stages pipeline() produced
    wanted: int = 0  # the case's stage count
    seconds: float = 0.0


def run_peer(case: Case, workdir: Path | None = None) -> PeerOutcome:
    """``case``'s model through ``torch.distributed.pipelining``, classified."""
    start = time.perf_counter()
    outcome = PeerOutcome(case.seed, "matched", wanted=case.config.stages)
    with tempfile.TemporaryDirectory(prefix="fuzzpeer", dir=workdir) as tmp:
        try:
            with time_limit(PEER_TIMEOUT_S):
                _run(case, Path(tmp), outcome)
        except Exception as err:  # a hang (Timeout), or a failure outside the checks
            _set(outcome, "internal", err)
    outcome.seconds = time.perf_counter() - start
    return outcome


def _run(case: Case, tmp: Path, outcome: PeerOutcome) -> None:
    import torch
    from torch.distributed.pipelining import SplitPoint, pipeline
    from torch.utils._pytree import tree_flatten, tree_unflatten

    from pipecompile.ir.graph.microbatch import split_microbatches, split_targets
    from pipecompile.model.model_file import load_model_file

    path = tmp / "model.py"
    path.write_text(case.source)
    count = case.config.microbatches
    positional = "example inputs as a tuple" in case.features
    try:  # the eager reference on the first micro-batch, and where to split
        spec = load_model_file(str(path))
        batch = split_microbatches(spec.inputs, count)[0]
        targets = split_targets(spec.targets or (), count)[0]
        order = _call_order(load_model_file(str(path)).model, batch)
        want = spec.model(**_copy(batch))
        want_leaves, out_spec = tree_flatten(want)
        spec.loss_fn(want, *targets).backward()  # type: ignore[misc]
    except Exception as err:
        return _set(outcome, "invalid", err)
    points = _split_points(order, case.config.stages)
    peer = load_model_file(str(path)).model
    canonical = _canonical_names(peer)
    args = tuple(_copy(batch).values()) if positional else ()
    kwargs = {} if positional else _copy(batch)
    try:
        pipe = pipeline(
            peer,
            mb_args=args,
            mb_kwargs=kwargs,
            split_spec={name: SplitPoint.BEGINNING for name in points} or None,
        )
    except Timeout:
        raise
    except Exception as err:
        return _set(outcome, "refused", err)
    outcome.stages = pipe.num_stages
    try:
        gm = pipe.split_gm
        got = torch.fx.Interpreter(gm).run(*_placeholder_args(gm, _copy(batch)))
        got_leaves = tree_flatten(got)[0]
        failures = _compare_outputs(got_leaves, want_leaves)
        if failures:
            return _mismatch(outcome, failures)
        spec.loss_fn(tree_unflatten(got_leaves, out_spec), *targets).backward()  # type: ignore[misc]
        failures = _compare_grads(_split_grads(gm, canonical), spec.model, canonical)
        failures += _compare_buffers(gm, spec.model)
    except Timeout:
        raise
    except Exception as err:
        return _set(outcome, "internal", err)
    if failures:
        _mismatch(outcome, failures)
    return None


def _copy(batch: dict[str, Any]) -> dict[str, Any]:
    """A fresh copy of each input: a model may write its input in place."""
    return {name: t.clone() for name, t in batch.items()}


def _call_order(model: Any, batch: dict[str, Any]) -> list[str]:
    """The model's direct submodules (a ModuleList's or ModuleDict's items count as direct),
    in the order one forward first calls them."""
    import torch
    from torch import nn

    candidates: list[tuple[str, nn.Module]] = []
    stack = [("", model)]
    while stack:
        prefix, parent = stack.pop()
        for name, child in parent.named_children():
            qualified = f"{prefix}{name}"
            if isinstance(child, nn.ModuleList | nn.ModuleDict):
                stack.append((qualified + ".", child))
            else:
                candidates.append((qualified, child))
    order: list[str] = []
    handles = [
        child.register_forward_pre_hook(
            lambda m, a, n=name: order.append(n) if n not in order else None
        )
        for name, child in candidates
    ]
    try:
        with torch.no_grad():
            model(**_copy(batch))
    finally:
        for handle in handles:
            handle.remove()
    return order


def _split_points(order: list[str], stages: int) -> list[str]:
    """``stages - 1`` of the call sites spread evenly (all of them when there are fewer)."""
    cuts = min(stages - 1, len(order))
    if cuts <= 0:
        return []
    return [order[j * len(order) // (cuts + 1)] for j in range(1, cuts + 1)]


def _placeholder_args(gm: Any, batch: dict[str, Any]) -> list[Any]:
    """The split graph's inputs, bound by placeholder name as ``Pipe.forward`` binds them."""
    args = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        name = str(node.target).lstrip("*")
        if name in batch:
            args.append(batch[name])
        else:
            args.append(node.args[0] if node.args else None)
    return args


def _canonical_names(model: Any) -> dict[str, str]:
    """Every parameter name (tied ones too) -> the first name the model lists it under."""
    first: dict[int, str] = {}
    names = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names[name] = first.setdefault(id(param), name)
    return names


def _split_grads(gm: Any, canonical: dict[str, str]) -> dict[str, Any]:
    """The gradients of the stages' parameters by the eager name, copies summed."""
    grads: dict[str, Any] = {}
    seen: set[int] = set()
    for _, stage in gm.named_children():
        for name, param in stage.named_parameters(remove_duplicate=False):
            if id(param) in seen or param.grad is None:
                continue
            seen.add(id(param))
            name = _CALL_SUFFIX.sub("", name)
            key = canonical.get(name, f"(not in the model) {name}")
            grads[key] = param.grad if key not in grads else grads[key] + param.grad
    return grads


def _close(got: Any, want: Any) -> bool:
    import torch

    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
        return bool(got == want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if not want.is_floating_point():
        return bool(torch.equal(got, want))
    return torch.allclose(got.detach().double(), want.detach().double(), atol=ATOL, rtol=RTOL)


def _describe(t: Any) -> str:
    import torch

    if isinstance(t, torch.Tensor):
        return f"{t.dtype} {tuple(t.shape)}"
    return type(t).__name__


def _compare_outputs(got: list[Any], want: list[Any]) -> list[str]:
    if len(got) != len(want):
        return [f"{len(got)} outputs, eager has {len(want)}"]
    bad = []
    for k, (g, w) in enumerate(zip(got, want)):
        if not _close(g, w):
            bad.append(f"output {k} differs: {_describe(g)} vs eager {_describe(w)}")
    return bad


def _compare_grads(grads: dict[str, Any], model: Any, canonical: dict[str, str]) -> list[str]:
    import torch

    bad = []
    params = dict(model.named_parameters())
    for name in sorted(set(grads) - set(params)):
        bad.append(f"gradient of {name}: the eager model has no such parameter")
    for name, param in params.items():
        want = param.grad if param.grad is not None else torch.zeros_like(param)
        got = grads.get(name)
        got = got if got is not None else torch.zeros_like(param)
        if not _close(got, want):
            what = "missing" if name not in grads else "differs"
            bad.append(f"gradient of {name} {what}")
    return bad


def _compare_buffers(gm: Any, model: Any) -> list[str]:
    """The stages' buffers (BatchNorm statistics, counters, running means) after the step,
    against the eager model's; a buffer no stage holds (forward never reads it) is skipped,
    and so is one the model does not have (a constant torch.export lifted,
    ``lifted_tensor_0``)."""
    want = dict(model.named_buffers(remove_duplicate=False))
    bad, seen = [], set()
    for _, stage in gm.named_children():
        for qualified, buffer in stage.named_buffers():
            name = _CALL_SUFFIX.sub("", qualified)
            if name in seen:
                continue
            seen.add(name)
            if name in want and not _close(buffer, want[name]):
                bad.append(f"buffer {name} after the step differs")
    return bad


def _mismatch(outcome: PeerOutcome, failures: list[str]) -> None:
    outcome.verdict = "mismatch"
    outcome.key = failure_words(failures[0], 6)
    outcome.detail = "\n".join(f"  MISMATCH {f}" for f in failures)


def _set(outcome: PeerOutcome, verdict: str, err: BaseException) -> None:
    """The verdict, and the reason: the class and first words of ``err`` (and of the
    torch.export error under ``pipeline()``'s generic one)."""
    outcome.verdict = verdict
    key = f"{type(err).__name__}: {failure_words(str(err), 10 if verdict == 'refused' else 8)}"
    chain_of = causes(err)
    if _EXPORT_WRAPPER in str(err) and chain_of:
        cause = chain_of[0]
        key = f"torch.export: {type(cause).__name__}: {failure_words(str(cause), 10)}"
    outcome.key = re.sub(r"\b(submod(_pp)?)_\d+\b", r"\1_N", key)
    chain = f"{type(err).__name__}: {err}" + "".join(f"\n{type(e).__name__}: {e}" for e in chain_of)
    outcome.detail = chain + "\n" + "".join(traceback.format_exception(err))[-6000:]
