"""Pass: batch_coupling — find every op where the traced model mixes the samples of a batch.

Requires: a traced module and one real micro-batch of its inputs (a model on the meta device
is not run: the pass returns None, and the compile says the model was not analysed).
Guarantees: a tuple of ``Coupling``s, one per op whose value depends on other samples than
its own while its inputs do not (a product over the batch, a reduction or sort over it, a
loss over the batch), each with its kind (``ir/records/batch_coupling``), the op and the
user's line; batch norm in training mode is listed as such and its statistics kept per
micro-batch. The model's weights and buffers, and torch's random state, are as before.

The batch is followed through the graph by running it three times on the example: as given,
with the samples of its second half changed, and with those of its first half changed. A value
that depends on its own sample only keeps, along one of its dimensions of the batch's size,
the rows of the samples left alone; a value that changes there, or one with no dimension of
the batch's size that changes at all, depends on other samples. Random ops and batch norm keep
the first run's values in the rows left alone (they are per sample by the program's own rules:
random streams per sample's micro-batch, batch statistics per micro-batch). A sequence of one
value a sample (the batch unbound, a list of each image's features), item k depending on
sample k only, is per sample, and so is an item of it that ops read (to join them again); an
item the model returns alone is another sample's in a micro-batch, and is named.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from pipecompile.ir.graph.random_ops import is_random
from pipecompile.ir.graph.user_frame import op_place
from pipecompile.ir.records.batch_coupling import Coupling

__all__ = ["batch_coupling", "batch_facts", "BatchFacts"]

_SAMPLE, _CONST, _MIXED = "sample", "const", "mixed"
# a per-sample value whose every varying tensor holds the batch first, one row a sample: one
# that joins micro-batches by concatenation (what crosses into a whole-batch tail)
_FIRST = "sample, batch first"


@dataclass(frozen=True)
class BatchFacts:
    """What the pass found: the couplings, and each node's kind by name (``const``: no
    sample's; ``sample``: its own sample's; ``sample, batch first``: so, batch first;
    ``mixed``: other samples' too)."""

    couplings: tuple[Coupling, ...]
    kinds: dict[str, str]

    def per_sample(self, name: str) -> bool:
        return self.kinds.get(name) in (_SAMPLE, _FIRST)

    def batch_first(self, name: str) -> bool:
        return self.kinds.get(name) == _FIRST

    def constant(self, name: str) -> bool:
        return self.kinds.get(name) == _CONST


_RTOL = 1e-4  # of the value's largest magnitude: beyond rounding, far below a mixed value's change


def batch_coupling(
    module: fx.GraphModule, *, inputs: Sequence[Any], batch_dim: int = 0
) -> tuple[Coupling, ...] | None:
    """The couplings of ``module`` run on ``inputs`` (its placeholders' values, in order),
    whose batch is along ``batch_dim``; None where the batch has fewer than 2 samples or
    changing its samples changes none of the inputs (nothing to tell them apart by)."""
    facts = batch_facts(module, inputs=inputs, batch_dim=batch_dim)
    return facts.couplings if facts is not None else None


def batch_facts(
    module: fx.GraphModule, *, inputs: Sequence[Any], batch_dim: int = 0
) -> BatchFacts | None:
    """``batch_coupling``'s couplings with each node's kind (None where it returns None)."""
    rows = _rows(inputs, batch_dim)
    if rows is None or rows < 2:
        return None
    half = rows // 2
    runs = [list(inputs), _changed(inputs, batch_dim, rows, slice(half, rows))]
    runs.append(_changed(inputs, batch_dim, rows, slice(0, half)))
    if all(_same(a, b) for a, b in zip(runs[0], runs[1])):
        return None
    with _kept(module):
        kinds = _follow(module, runs, rows, half)
    return BatchFacts(_couplings(module, kinds), {n.name: k for n, k in kinds.items()})


def _rows(inputs: Sequence[Any], dim: int) -> int | None:
    sizes = [t.shape[dim] for t in inputs if isinstance(t, torch.Tensor) and t.dim() > dim]
    return sizes[0] if sizes else None


def _changed(inputs: Sequence[Any], dim: int, rows: int, part: slice) -> list[Any]:
    """``inputs`` with the samples of ``part`` changed: floats moved by noise of their own
    scale, integers (token ids) rolled along their last dimension and taken from other rows
    (every id stays one the model takes); masks and values of another row count are kept."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for t in inputs:
        if not isinstance(t, torch.Tensor) or t.dim() <= dim or t.shape[dim] != rows:
            out.append(t)
            continue
        t = t.clone()
        block = t.narrow(dim, part.start, part.stop - part.start)
        if t.is_floating_point() or t.is_complex():
            scale = float(block.abs().max()) or 1.0
            noise = torch.randn(block.shape, generator=gen, dtype=block.dtype)
            block.add_(noise.to(block.device) * scale)
        elif t.dtype != torch.bool:
            others = torch.arange(rows).roll(1)[part]  # each row of the part: another's values
            moved = t.index_select(dim, others.to(t.device))
            if moved.dim() > dim + 1:
                moved = moved.roll(1, dims=-1)
            block.copy_(moved)
        out.append(t)
    return out


@contextmanager
def _kept(module: nn.Module) -> Iterator[None]:
    """Run the graph without a trace: buffers (batch norm's running statistics) and torch's
    random state restored afterwards, no autograd."""
    saved = {k: b.detach().clone() for k, b in module.named_buffers()}
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            yield
    finally:
        with torch.no_grad():
            for k, b in module.named_buffers():
                if k in saved:
                    b.copy_(saved[k])


def _follow(
    module: fx.GraphModule, runs: list[list[Any]], rows: int, half: int
) -> dict[fx.Node, str]:
    """Each node's kind: ``sample`` (its own sample's rows), ``const`` (no sample's) or
    ``mixed``; runs 1 and 2 changed the second and the first half's samples."""
    interpreters = [fx.Interpreter(module) for _ in runs]
    for interp, args in zip(interpreters, runs):
        interp.args_iter = iter(args)
    last_use = _last_uses(module.graph)
    kinds: dict[fx.Node, str] = {}
    kept = (slice(0, half), slice(half, rows))  # the rows each changed run left alone
    by_item: set[fx.Node] = set()  # a sequence of one value a sample (unbind over the batch)
    for node in module.graph.nodes:
        if node.op == "output":
            break
        values = [interp.run_node(node) for interp in interpreters]
        if _per_sample_by_rule(module, node):
            for k in (1, 2):
                values[k] = _keep_rows(values[0], values[k], rows, kept[k - 1])
        kinds[node] = _kind(values, rows, kept)
        if kinds[node] == _MIXED and _one_a_sample(values, rows, kept):
            by_item.add(node)
            kinds[node] = _SAMPLE
        elif _item_taken(node, by_item):
            kinds[node] = _SAMPLE  # item k of such a sequence is sample k's, joined again
        for interp, value in zip(interpreters, values):
            interp.env[node] = value
            for done in last_use.get(node, ()):
                interp.env.pop(done, None)
    return kinds


def _item_taken(node: fx.Node, by_item: set[fx.Node]) -> bool:
    """An item of a sequence of one value a sample, read by ops only: a model output of
    sample k's value alone would be another sample's in a micro-batch."""
    if node.target is not operator.getitem or node.args[0] not in by_item:
        return False
    return all(u.op != "output" for u in node.users)


def _one_a_sample(values: list[Any], rows: int, kept: tuple[slice, slice]) -> bool:
    """Whether each run's value is a sequence of ``rows`` tensors of one shape, item k
    depending on sample k only (``x.unbind(0)``, a list of each image's features)."""
    if not all(isinstance(v, (tuple, list)) and len(v) == rows > 1 for v in values):
        return False
    items = [list(v) for v in values]
    if not all(isinstance(t, torch.Tensor) for v in items for t in v):
        return False
    if len({tuple(t.shape) for v in items for t in v}) != 1:
        return False
    stacked = [torch.stack(v) for v in items]
    return _leaf_kind(*stacked, rows, kept) == _FIRST


def _last_uses(graph: fx.Graph) -> dict[fx.Node, list[fx.Node]]:
    """The nodes whose last reader is each node (freed after it runs)."""
    last: dict[fx.Node, fx.Node] = {}
    for node in graph.nodes:
        for used in node.all_input_nodes:
            last[used] = node
    freed: dict[fx.Node, list[fx.Node]] = {}
    for used, node in last.items():
        freed.setdefault(node, []).append(used)
    return freed


def _per_sample_by_rule(module: fx.GraphModule, node: fx.Node) -> bool:
    """Random ops (drawn per micro-batch and op, so any split draws each sample's numbers
    alike) and batch norm (statistics per micro-batch, the pipeline's stated semantics)."""
    return is_random(node, module) or _batch_norm(module, node)


def _batch_norm(module: fx.GraphModule, node: fx.Node) -> bool:
    """Batch norm normalising by its batch's statistics (training mode)."""
    if node.op == "call_module":
        sub = module.get_submodule(str(node.target))
        return isinstance(sub, nn.modules.batchnorm._BatchNorm) and sub.training
    if node.op != "call_function":
        return False
    name = getattr(node.target, "__name__", str(node.target))
    if "batch_norm" not in name or "no_training" in name:
        return False
    training = node.kwargs.get("training", node.args[5] if len(node.args) > 5 else True)
    return bool(training)


def _keep_rows(first: Any, other: Any, rows: int, part: slice) -> Any:
    """``other`` with the first run's values in the rows of ``part`` (values without a
    dimension of the batch's size: the first run's whole)."""
    a, spec = pytree.tree_flatten(first)
    b = pytree.tree_leaves(other)
    kept = []
    for x, y in zip(a, b):
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            kept.append(y)
            continue
        dims = _dims_of(x, rows)
        if not dims or x.shape != y.shape:
            kept.append(x)
            continue
        y = y.clone()
        _rows_of(y, *dims[0], part).copy_(_rows_of(x, *dims[0], part))
        kept.append(y)
    return pytree.tree_unflatten(kept, spec)


def _dims_of(t: torch.Tensor, rows: int) -> list[tuple[int, int]]:
    """The dimensions that may hold the batch, each with the entries a sample has there: 1
    where the size is the batch's, k where the batch is flattened with k entries a sample
    (``x.view(-1, width)`` of a (batch, seq, width) value: k = seq), batch-major."""
    found = [(d, 1) for d, size in enumerate(t.shape) if size == rows]
    found += [
        (d, size // rows) for d, size in enumerate(t.shape) if size > rows and size % rows == 0
    ]
    return found


def _kind(values: list[Any], rows: int, kept: tuple[slice, slice]) -> str:
    leaves = [pytree.tree_leaves(v) for v in values]
    kinds = {_leaf_kind(a, b, c, rows, kept) for a, b, c in zip(*leaves)}
    if _MIXED in kinds:
        return _MIXED
    if _SAMPLE in kinds:  # one leaf holds the batch elsewhere
        return _SAMPLE
    return _FIRST if _FIRST in kinds else _CONST


def _leaf_kind(a: Any, b: Any, c: Any, rows: int, kept: tuple[slice, slice]) -> str:
    if not isinstance(a, torch.Tensor):
        return _CONST if a == b and a == c else _MIXED if _numbers(a, b, c) else _CONST
    if not isinstance(b, torch.Tensor) or not isinstance(c, torch.Tensor):
        return _CONST
    if a.shape != b.shape or a.shape != c.shape:
        return _MIXED  # the shape depends on the samples' values
    if _same(a, b) and _same(a, c):
        return _CONST
    first, second = kept
    for d, block in _dims_of(a, rows):
        if _same(_rows_of(a, d, block, first), _rows_of(b, d, block, first)) and _same(
            _rows_of(a, d, block, second), _rows_of(c, d, block, second)
        ):
            return _FIRST if (d, block) == (0, 1) else _SAMPLE
    return _MIXED


def _numbers(*values: Any) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _rows_of(t: torch.Tensor, dim: int, block: int, part: slice) -> torch.Tensor:
    """The entries of the samples ``part`` along ``dim`` (``block`` entries a sample)."""
    return t.narrow(dim, part.start * block, (part.stop - part.start) * block)


def _same(a: Any, b: Any) -> bool:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return True
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):  # the common case, bit for bit: no tolerance to work out
        return True
    if not (a.is_floating_point() or a.is_complex()) or a.numel() == 0:
        return a.numel() == 0
    x, y = a.double(), b.double()
    both = x.isfinite() & y.isfinite()
    if not torch.equal(both, x.isfinite()) or not torch.equal(both, y.isfinite()):
        return False
    scale = max(float(x[both].abs().max()) if both.any() else 0.0, 1e-30)
    return bool(((x - y)[both].abs() <= _RTOL * scale).all())


def _couplings(module: fx.GraphModule, kinds: dict[fx.Node, str]) -> tuple[Coupling, ...]:
    """The ops where mixing starts (a mixed value of unmixed inputs), in graph order, with
    batch norm's listed as such."""
    found = []
    for node, kind in kinds.items():
        if _batch_norm(module, node):
            found.append(Coupling("batch norm", op_place(node), node.name))
            continue
        if kind != _MIXED or any(kinds.get(n) == _MIXED for n in node.all_input_nodes):
            continue
        after = "middle" if _layers_after(module, node) else "tail"
        found.append(Coupling(after, op_place(node), node.name))
    return tuple(found)


def _layers_after(module: fx.GraphModule, start: fx.Node) -> bool:
    """Whether a layer with weights reads a value that depends on ``start``: a module with
    parameters, or a weight of more than one element (a scalar such as CLIP's logit scale
    is no layer)."""
    seen, todo = {start}, [start]
    while todo:
        node = todo.pop()
        for user in node.users:
            if user in seen:
                continue
            seen.add(user)
            todo.append(user)
            if user.op == "call_module":
                if any(True for _ in module.get_submodule(str(user.target)).parameters()):
                    return True
            for arg in user.all_input_nodes:
                if arg.op == "get_attr" and _weight(module, str(arg.target)):
                    return True
    return False


def _weight(module: fx.GraphModule, target: str) -> bool:
    try:
        value = module.get_parameter(target)
    except AttributeError:
        return False
    return value.numel() > 1
