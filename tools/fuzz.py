"""Fuzz pipecompile with random models: generate, compile, run the pipeline, compare with eager.

Each seed makes one random model and one random compile configuration. The model is a DAG of
ops over a pool of live values of known shapes (float, integer and boolean, with or without
the batch dimension); every op picks values that fit, so the model always runs eagerly. It is
written as a model file (``build_model``, ``example_inputs``, ``example_targets``,
``loss_fn``), which ``--show`` prints and ``pipecompile run`` reads. The configuration picks
the stages (1-4, at most the ops), the schedule (``interleaved`` with an even stage count),
the micro-batches (1, 2 or 4 of a batch of 8) and the checkpoint policy.

The ops (``OPS``, each a function that returns False when no live value fits): Linear (shared
or with a frozen weight), activations (functional, methods, modules), in-place writes
(``relu_``, ``nn.ReLU(inplace=True)``, ``F.relu(inplace=True)``, ``add_``, ``+=``, ``mul_``,
``masked_fill_``, ``x[mask] = 0``; only where eager autograd allows them), residual adds,
sigmoid gates, cat, chunk, split, LayerNorm, BatchNorm1d/2d in training, Conv1d/2d, max and
average pooling, flatten and unflatten by shape arithmetic (``x.view(x.size(0), -1)``),
transposes, Embedding (of ids, of ``arange`` positions), a head tied to an embedding, attention
(1-2 heads, causal or padding masks, softmax), boolean masks, ``masked_fill``/``where``,
integer values (cumsum, remainder, argmax, arange), bare parameters and values made from them,
buffers (persistent or not; a counter and a running mean mutated in forward), constants,
reductions, dropout with p=0, ``torch.no_grad()`` regions, a Python branch on a shape (which
sends the model to torch.export), submodules with children (a Block class, nn.Sequential, an
nn.ModuleList loop) and parameters, buffers or submodules forward never reads. Inputs: 1-3
floats, ids or masks, maybe one unused, passed as a dict or a tuple, maybe a parameter left at
its default; outputs: one tensor, a tuple or a dict, with the dead ends summed into one more,
sometimes an integer, a model input or the same value twice.

Every model goes through ``compile_model``, ``emit``, ``Pipeline.load`` of the emitted stage
files and ``check_step`` (``check_async_step`` for ``pipedream``) with ``atol = rtol = 1e-5``;
for a synchronous schedule every buffer after the step is also compared with the eager model
run micro-batch after micro-batch, as the stages run them. With ``--distributed-every K``
every K-th model that matched also runs ``pipecompile run OUT --nproc N --check``. The outcome
is one of:

* matched: the pipeline's loss, outputs, gradients (or weights) and buffers equal eager's;
* refused: compile failed with a clear pipecompile error (its class and the first words of
  its message are the reason key);
* internal: an ``InternalError``, any other exception, any failure after a successful compile,
  or a hang: a bug (a cause listed in ``KNOWN`` is named as such);
* mismatch: the check failed: the worst bug;
* invalid: the generated model itself did not run eagerly: a bug of this tool.

Usage::

    python tools/fuzz.py --quick                       # a few models, a few seconds
    python tools/fuzz.py --count 200 --seed 1000 --jobs 2
    python tools/fuzz.py --seed 1017 --show            # replay one seed: source and traceback
    python tools/fuzz.py --count 2000 --jobs 2 --distributed-every 200
    python tools/fuzz.py --count 200 --no-inplace      # no in-place ops (another model set)

The exit status is 1 when any model is internal, mismatch or invalid.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BATCH = 8
SIZES = (4, 6, 8, 12, 16)
SCHEDULES = ("gpipe", "1f1b", "zb1p", "interleaved", "pipedream")
POLICIES = ("never", "except_last", "always")
CASE_TIMEOUT_S = 120
DIST_TIMEOUT_S = 300
# Known failure causes, by a phrase of the error text, reported under their own name.
# Causes of internal errors being fixed elsewhere, {name: a phrase of the error chain}, so a long
# run reports them apart from new ones. Both earlier entries (in-place writes to a stage input;
# weights forward never reads, left out of the stages) are fixed.
KNOWN: dict[str, str] = {}


# ---------------------------------------------------------------------------------------------
# The generator: values of known shapes and ops that fit them, written as a model file.


@dataclass(eq=False)
class Value:
    """A live value of the forward: a Python name in the generated source and what it holds."""

    name: str
    kind: str  # "f" float32, "i" int64, "b" bool
    shape: tuple[int, ...]  # after the batch dimension when ``batch``, else the whole shape
    batch: bool = True
    vocab: int = 0  # integer values: every element is in [0, vocab)
    grad: bool = False  # depends on a trainable parameter
    writable: bool = False  # an in-place write keeps eager autograd valid
    base: Value | None = None  # the value this one is a view of
    contiguous: bool = True
    uses: int = 0


class Model:
    """A model being generated: ``__init__`` and ``forward`` lines, the live values, features."""

    def __init__(self, rng: random.Random, inplace: bool) -> None:
        self.rng, self.inplace = rng, inplace
        self.init: list[str] = []
        self.body: list[str] = []
        self.values: list[Value] = []
        self.inputs: list[tuple[str, str]] = []  # (name, expression making the example input)
        self.features: Counter[str] = Counter()
        self.modules: dict[str, list[str]] = {}  # constructor source -> attribute names
        self.embeddings: list[tuple[str, int, int]] = []  # (attribute, vocab, dim)
        self._count = Counter[str]()
        self._reads: list[Value] = []  # read since the last new value
        self.classes: dict[str, str] = {}  # helper nn.Module classes the file defines
        self.defaults: list[str] = []  # forward parameters with defaults, never passed
        self.positional = False  # example_inputs() returns a tuple rather than a dict

    # names, lines, modules

    def fresh(self, prefix: str) -> str:
        self._count[prefix] += 1
        return f"{prefix}{self._count[prefix] - 1}"

    def line(self, text: str) -> None:
        self.body.append(text)

    def module(self, prefix: str, ctor: str, *, reuse: float = 0.0) -> str:
        """``self.<name>``, a new module built by ``ctor``, or (with chance ``reuse``) an
        existing one of the same construction: a submodule called several times."""
        same = self.modules.get(ctor, [])
        if same and self.rng.random() < reuse:
            self.features["submodule called twice"] += 1
            return f"self.{self.rng.choice(same)}"
        name = self.fresh(prefix)
        self.init.append(f"self.{name} = {ctor}")
        self.modules.setdefault(ctor, []).append(name)
        return f"self.{name}"

    # values

    def new(self, kind: str, shape: Iterable[int], **facts: object) -> Value:
        """A new value; unless told, it is contiguous when everything read since the last
        new value was (elementwise ops keep their inputs' strides: conservative elsewhere)."""
        facts.setdefault("contiguous", all(v.contiguous for v in self._reads))
        self._reads = []
        value = Value(self.fresh("v"), kind, tuple(shape), **facts)  # type: ignore[arg-type]
        self.values.append(value)
        return value

    def pick(self, ok: Callable[[Value], bool], *, avoid: Iterable[Value] = ()) -> Value | None:
        """A live value satisfying ``ok``, favouring recent and unused ones (deep chains)."""
        skip = set(map(id, avoid))
        found = [v for v in self.values if ok(v) and id(v) not in skip]
        if not found:
            return None
        weights = [(1 + k) * (3 if v.uses == 0 else 1) for k, v in enumerate(found)]
        return self.rng.choices(found, weights)[0]

    def read(self, *values: Value, saved: bool = False) -> None:
        """Record a use; ``saved``: the op keeps the value for backward, so writing it (or
        the tensor it views) in place later would break eager autograd."""
        for value in values:
            value.uses += 1
            self._reads.append(value)
            node: Value | None = value
            while saved and node is not None:
                node.writable = False
                node = node.base

    def view_of(
        self, value: Value, shape: Iterable[int], *, contiguous: bool | None = None
    ) -> Value:
        """A new value viewing ``value`` (as contiguous as it unless told); neither is written
        in place afterwards."""
        self.read(value)
        value.writable = False
        contiguous = value.contiguous if contiguous is None else contiguous
        return self.new("f", shape, grad=value.grad, base=value, contiguous=contiguous)


def is_float(v: Value) -> bool:
    return v.kind == "f" and v.batch


def is_float_rank(*ranks: int) -> Callable[[Value], bool]:
    return lambda v: is_float(v) and len(v.shape) in ranks


# ---------------------------------------------------------------------------------------------
# Ops. Each takes the model, adds lines and values, and returns False when nothing fits.


def op_linear(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    n_in, n_out = x.shape[-1], m.rng.choice(SIZES)
    bias = m.rng.random() < 0.8
    lin = m.module("lin", f"nn.Linear({n_in}, {n_out}, bias={bias})", reuse=0.4)
    frozen = f"{lin}.weight.requires_grad_(False)"
    if bias and m.rng.random() < 0.08 and frozen not in m.init:  # the bias still trains
        m.init.append(frozen)
        m.features["frozen parameter"] += 1
    m.read(x, saved=True)
    y = m.new("f", (*x.shape[:-1], n_out), grad=True, writable=True)
    m.line(f"{y.name} = {lin}({x.name})")
    m.features["Linear"] += 1
    return True


ACTIVATIONS = {  # source template, whether the backward keeps the output (not the input)
    "relu": ("torch.relu({x})", True),
    "gelu": ("F.gelu({x})", False),
    "tanh": ("{x}.tanh()", True),
    "sigmoid": ("torch.sigmoid({x})", True),
    "silu": ("F.silu({x})", False),
    "leaky_relu": ("F.leaky_relu({x}, 0.1)", False),
}
ACTIVATION_MODULES = {"relu": "nn.ReLU()", "gelu": "nn.GELU()", "tanh": "nn.Tanh()"}


def op_activation(m: Model) -> bool:
    x = m.pick(is_float)
    if x is None:
        return False
    name = m.rng.choice(sorted(ACTIVATIONS))
    template, keeps_output = ACTIVATIONS[name]
    if name in ACTIVATION_MODULES and m.rng.random() < 0.4:
        call = f"{m.module('act', ACTIVATION_MODULES[name], reuse=0.5)}({x.name})"
    else:
        call = template.format(x=x.name)
    m.read(x, saved=not keeps_output)
    y = m.new("f", x.shape, grad=x.grad, writable=not keeps_output)
    m.line(f"{y.name} = {call}")
    m.features[f"activation {name}"] += 1
    return True


def op_inplace(m: Model) -> bool:
    """An in-place write: relu_, ReLU(inplace=True), add_, +=, mul_, masked_fill_, x[m] = 0."""
    if not m.inplace:
        return False
    x = m.pick(lambda v: is_float(v) and v.writable)
    if x is None:
        return False
    choice = m.rng.choice(["relu_", "module", "functional", "add_", "iadd", "mul_", "mask"])
    if choice in ("relu_", "module", "functional"):
        if choice == "relu_":
            m.line(f"{x.name}.relu_()")
        elif choice == "module":
            relu = m.module("relu", "nn.ReLU(inplace=True)", reuse=0.5)
            m.line(f"{x.name} = {relu}({x.name})")
        else:
            m.line(f"{x.name} = F.relu({x.name}, inplace=True)")
        x.writable = False  # relu keeps its output for backward
        m.features[f"in-place {'nn.ReLU(inplace=True)' if choice == 'module' else choice}"] += 1
    elif choice in ("add_", "iadd"):
        y = m.pick(
            lambda v: v.kind == "f" and _broadcasts(v, x) and _root(v) is not _root(x), avoid=[x]
        )
        if y is None:
            return False
        m.read(y)
        m.line(f"{x.name}.add_({y.name})" if choice == "add_" else f"{x.name} += {y.name}")
        x.grad = x.grad or y.grad
        m.features[f"in-place {choice}"] += 1
    elif choice == "mul_":
        m.line(f"{x.name}.mul_(0.5)")
        m.features["in-place mul_"] += 1
    else:
        mask = m.pick(lambda v: v.kind == "b" and v.batch and v.shape in (x.shape, x.shape[:-1]))
        if mask is None:  # a mask made from the value itself, before the write
            mask = m.new("b", x.shape)
            m.line(f"{mask.name} = {x.name} > 0.5")
        m.read(mask)
        index = mask.name if mask.shape == x.shape else f"{mask.name}.unsqueeze(-1)"
        if m.rng.random() < 0.5:
            m.line(f"{x.name}.masked_fill_({index}, 0.0)")
            m.features["in-place masked_fill_"] += 1
        elif mask.shape == x.shape:
            m.line(f"{x.name}[{mask.name}] = 0.0")
            m.features["in-place x[mask] = 0"] += 1
        else:
            return False
    x.uses += 1
    return True


def _root(v: Value) -> Value:
    while v.base is not None:
        v = v.base
    return v


def _broadcasts(small: Value, big: Value) -> bool:
    """Whether ``small`` broadcasts onto the batch value ``big`` without changing its shape."""
    if small.batch:
        return small.shape == big.shape
    return len(small.shape) <= len(big.shape) and big.shape[
        len(big.shape) - len(small.shape) :
    ] == (small.shape)


def op_residual(m: Model) -> bool:
    x = m.pick(is_float)
    if x is None:
        return False
    y = m.pick(lambda v: is_float(v) and v.shape == x.shape, avoid=[x])
    if y is None:
        return False
    m.read(x, y)
    z = m.new("f", x.shape, grad=x.grad or y.grad, writable=True)
    form = m.rng.choice(["{x} + {y}", "{x} - {y}", "torch.add({x}, {y}, alpha=0.5)"])
    m.line(f"{z.name} = {form.format(x=x.name, y=y.name)}")
    m.features["residual add"] += 1
    return True


def op_gate(m: Model) -> bool:
    x = m.pick(is_float)
    if x is None:
        return False
    g = m.pick(lambda v: is_float(v) and v.shape == x.shape) or x
    m.read(x, g, saved=True)
    z = m.new("f", x.shape, grad=x.grad or g.grad)
    m.line(f"{z.name} = torch.sigmoid({g.name}) * {x.name}")
    m.features["gate sigmoid(g) * x"] += 1
    return True


def op_cat(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    dim = m.rng.choice([-1, 1]) if len(x.shape) >= 2 else -1
    axis = len(x.shape) - 1 if dim == -1 else 0

    def fits(v: Value) -> bool:
        same = [d for k, d in enumerate(v.shape) if k != axis] == [
            d for k, d in enumerate(x.shape) if k != axis
        ]
        return is_float(v) and len(v.shape) == len(x.shape) and same

    y = m.pick(fits) or x
    m.read(x, y)
    shape = list(x.shape)
    shape[axis] += y.shape[axis]
    z = m.new("f", shape, grad=x.grad or y.grad, writable=True)
    m.line(f"{z.name} = torch.cat([{x.name}, {y.name}], dim={dim})")
    m.features["cat"] += 1
    return True


def op_chunk(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1 and v.shape[-1] >= 4)
    if x is None:
        return False
    n = x.shape[-1]
    if n % 2 == 0 and m.rng.random() < 0.5:
        sizes, call = [n // 2, n // 2], f"{x.name}.chunk(2, dim=-1)"
        m.features["chunk"] += 1
    else:
        k = m.rng.randint(1, n - 1)
        sizes, call = [k, n - k], f"torch.split({x.name}, [{k}, {n - k}], dim=-1)"
        m.features["split"] += 1
    parts = [m.view_of(x, (*x.shape[:-1], s), contiguous=False) for s in sizes]
    x.uses -= 1
    m.line(f"{', '.join(p.name for p in parts)} = {call}")
    return True


def op_layernorm(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    norm = m.module("norm", f"nn.LayerNorm({x.shape[-1]})", reuse=0.4)
    m.read(x, saved=True)
    y = m.new("f", x.shape, grad=True)
    m.line(f"{y.name} = {norm}({x.name})")
    m.features["LayerNorm"] += 1
    return True


def op_batchnorm(m: Model) -> bool:
    x = m.pick(is_float_rank(1, 2, 3))
    if x is None:
        return False
    kind = "BatchNorm2d" if len(x.shape) == 3 else "BatchNorm1d"
    norm = m.module("bn", f"nn.{kind}({x.shape[0]})")
    m.read(x, saved=True)
    y = m.new("f", x.shape, grad=True)
    m.line(f"{y.name} = {norm}({x.name})")
    m.features[f"{kind} (training)"] += 1
    return True


def op_conv(m: Model) -> bool:
    x = m.pick(is_float_rank(2, 3))
    if x is None:
        return False
    channels, kernel = m.rng.choice(SIZES), m.rng.choice([1, 3])
    kind = "Conv1d" if len(x.shape) == 2 else "Conv2d"
    conv = m.module("conv", f"nn.{kind}({x.shape[0]}, {channels}, {kernel}, padding={kernel // 2})")
    m.read(x, saved=True)
    y = m.new("f", (channels, *x.shape[1:]), grad=True, writable=True)
    m.line(f"{y.name} = {conv}({x.name})")
    m.features[kind] += 1
    return True


def op_pool(m: Model) -> bool:
    x = m.pick(lambda v: is_float_rank(2, 3)(v) and all(d % 2 == 0 for d in v.shape[1:]))
    if x is None:
        return False
    dims = "1d" if len(x.shape) == 2 else "2d"
    kind = m.rng.choice(["max", "avg"])
    if m.rng.random() < 0.5:
        call = f"F.{kind}_pool{dims}({x.name}, 2)"
    else:
        pool = m.module("pool", f"nn.{kind.capitalize()}Pool{dims}(2)", reuse=0.5)
        call = f"{pool}({x.name})"
    m.read(x, saved=True)  # max keeps its input; avg pool 1d is avg pool 2d of a view
    shape = (x.shape[0], *(d // 2 for d in x.shape[1:]))
    y = m.new("f", shape, grad=x.grad, writable=kind == "avg")
    m.line(f"{y.name} = {call}")
    m.features[f"{kind} pool {dims}"] += 1
    return True


def op_flatten(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 2)
    if x is None:
        return False
    forms = ["{x}.reshape({x}.size(0), -1)", "{x}.flatten(1)", "torch.flatten({x}, 1)"]
    if x.contiguous:
        forms += ["{x}.view({x}.shape[0], -1)"]
        if len(x.shape) == 2:
            forms += ["{x}.view({x}.size(0), {x}.size(1) * {x}.size(2))"]
    total = 1
    for d in x.shape:
        total *= d
    y = m.view_of(x, (total,))
    m.line(f"{y.name} = {m.rng.choice(forms).format(x=x.name)}")
    m.features["flatten / view (shape arithmetic)"] += 1
    return True


def op_unflatten(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) == 1 and v.contiguous and v.shape[0] >= 8)
    if x is None:
        return False
    n = x.shape[0]
    splits = [d for d in (2, 3, 4) if n % d == 0 and n // d >= 2]
    if not splits:  # a prime size (a vocabulary of 17)
        return False
    a = m.rng.choice(splits)
    b = n // a
    forms = [
        f"{{x}}.view({{x}}.size(0), {a}, -1)",
        f"{{x}}.view({{x}}.size(0), {{x}}.size(1) // {b}, {b})",
        f"{{x}}.unflatten(1, ({a}, {b}))",
    ]
    y = m.view_of(x, (a, b))
    m.line(f"{y.name} = {m.rng.choice(forms).format(x=x.name)}")
    m.features["unflatten / view (shape arithmetic)"] += 1
    return True


def op_transpose(m: Model) -> bool:
    x = m.pick(is_float_rank(2))
    if x is None:
        return False
    y = m.view_of(x, (x.shape[1], x.shape[0]), contiguous=False)
    m.line(f"{y.name} = {x.name}.transpose(1, 2)")
    m.features["transpose"] += 1
    return True


def op_embedding(m: Model) -> bool:
    ids = m.pick(lambda v: v.kind == "i" and v.vocab > 0)
    if ids is None:
        return False
    dim = m.rng.choice(SIZES)
    emb = m.module("emb", f"nn.Embedding({ids.vocab}, {dim})", reuse=0.3)
    m.embeddings.append((emb, ids.vocab, dim))
    m.read(ids)
    y = m.new("f", (*ids.shape, dim), grad=True, batch=ids.batch, writable=True)
    m.line(f"{y.name} = {emb}({ids.name})")
    m.features["Embedding" if ids.batch else "Embedding of positions (no batch)"] += 1
    return True


def op_tied_head(m: Model) -> bool:
    """An output head sharing an embedding's weight (a tied parameter)."""
    if not m.embeddings:
        return False
    emb, vocab, dim = m.rng.choice(m.embeddings)
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1 and v.shape[-1] == dim)
    if x is None:
        return False
    m.read(x, saved=True)
    y = m.new("f", (*x.shape[:-1], vocab), grad=True, writable=True)
    if m.rng.random() < 0.5:
        m.line(f"{y.name} = F.linear({x.name}, {emb}.weight)")
    else:
        head = m.fresh("head")
        m.init.append(f"self.{head} = nn.Linear({dim}, {vocab}, bias=False)")
        m.init.append(f"self.{head}.weight = {emb}.weight")
        m.line(f"{y.name} = self.{head}({x.name})")
    m.features["tied weights (embedding and head)"] += 1
    return True


def op_attention(m: Model) -> bool:
    x = m.pick(is_float_rank(2))
    if x is None:
        return False
    t, d = x.shape
    heads = m.rng.choice([h for h in (1, 2) if d % h == 0])
    m.read(x, saved=True)
    q, k, v = (m.fresh(p) for p in ("q", "k", "val"))
    if m.rng.random() < 0.5:
        qkv = m.module("qkv", f"nn.Linear({d}, {3 * d})")
        m.line(f"{q}, {k}, {v} = {qkv}({x.name}).chunk(3, dim=-1)")
    else:
        for name in (q, k, v):
            m.line(f"{name} = {m.module('proj', f'nn.Linear({d}, {d})')}({x.name})")
    if heads > 1:  # (B, T, D) -> (B, H, T, D/H) by shape arithmetic
        for name in (q, k, v):
            m.line(
                f"{name} = {name}.view({name}.size(0), {name}.size(1), {heads}, -1).transpose(1, 2)"
            )
    s = m.fresh("scores")
    m.line(f"{s} = {q} @ {k}.transpose(-2, -1) * ({k}.size(-1) ** -0.5)")
    mask = m.pick(lambda v: v.kind == "b" and v.batch and v.shape == (t,))
    ids = m.pick(lambda v: v.kind == "i" and v.batch and v.shape == (t,))
    masking = m.rng.choice(["none", "causal", "padding"])
    if masking == "padding" and mask is None and ids is not None:
        m.read(ids)
        mask = m.new("b", (t,))
        m.line(f"{mask.name} = {ids.name} == 0")
    if masking == "causal":
        m.line(f"causal = torch.triu(torch.ones({t}, {t}, dtype=torch.bool), diagonal=1)")
        m.line(f'{s} = {s}.masked_fill(causal, float("-inf"))')
        m.features["causal mask (constant, -inf)"] += 1
    elif masking == "padding" and mask is not None:
        m.read(mask)
        expand = ".unsqueeze(1)" if heads == 1 else "[:, None, None, :]"
        m.line(f"{s} = {s}.masked_fill({mask.name}{expand}, -1e9)")
        m.features["padding mask (bool value)"] += 1
    weights = "F.softmax({s}, dim=-1)" if m.rng.random() < 0.5 else "{s}.softmax(-1)"
    y = m.new("f", (t, d), grad=True, writable=True, contiguous=heads == 1)  # reshape: maybe a view
    m.line(f"{y.name} = {weights.format(s=s)} @ {v}")
    if heads > 1:
        m.line(f"{y.name} = {y.name}.transpose(1, 2).reshape({y.name}.size(0), {t}, {d})")
    m.features[f"attention ({heads} head{'s' if heads > 1 else ''})"] += 1
    return True


def op_mask(m: Model) -> bool:
    """A boolean value: from integer ids (padding) or from a comparison of floats."""
    ids = m.pick(lambda v: v.kind == "i" and v.batch)
    if ids is not None and m.rng.random() < 0.6:
        form = m.rng.choice(["{x} == 0", "{x}.eq(0)", "{x} != 0"])
        m.read(ids)
        y = m.new("b", ids.shape)
        m.line(f"{y.name} = {form.format(x=ids.name)}")
        m.features["bool mask from ids"] += 1
        return True
    x = m.pick(is_float)
    if x is None:
        return False
    m.read(x)
    y = m.new("b", x.shape)
    m.line(f"{y.name} = {m.rng.choice(['{x} > 0', '{x}.abs() < 0.5']).format(x=x.name)}")
    m.features["bool mask from floats"] += 1
    return True


def op_apply_mask(m: Model) -> bool:
    mask = m.pick(lambda v: v.kind == "b" and v.batch)
    if mask is None:
        return False
    x = m.pick(lambda v: is_float(v) and v.shape in (mask.shape, (*mask.shape, *v.shape[-1:])))
    if x is None:
        return False
    index = mask.name if x.shape == mask.shape else f"{mask.name}.unsqueeze(-1)"
    form = m.rng.choice(
        [
            "{x}.masked_fill({m}, 0.0)",
            "torch.where({m}, {x}, torch.zeros_like({x}))",
            "{x} * {m}.float()",
            "{x} * {m}.to({x}.dtype)",
        ]
    )
    m.read(x, saved="*" in form)
    m.read(mask)
    y = m.new("f", x.shape, grad=x.grad, writable=True)
    m.line(f"{y.name} = {form.format(x=x.name, m=index)}")
    m.features["masked_fill / where / mask as float"] += 1
    return True


def op_integer(m: Model) -> bool:
    """An integer value computed in forward: positions, remainders, an argmax."""
    ids = m.pick(lambda v: v.kind == "i" and v.batch and len(v.shape) == 1)
    choice = m.rng.choice(["cumsum", "mod", "argmax", "arange"])
    if choice in ("cumsum", "mod") and ids is not None:
        m.read(ids)
        t = ids.shape[0]
        if choice == "cumsum":
            y = m.new("i", ids.shape, vocab=t + 1)
            m.line(f"{y.name} = ({ids.name} != 0).long().cumsum(-1)")
        else:
            y = m.new("i", ids.shape, vocab=3)
            m.line(f"{y.name} = {ids.name} % 3")
        m.features[f"integer value ({choice})"] += 1
        return True
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    m.read(x)
    if choice == "arange" and len(x.shape) == 2:
        y = m.new("i", (x.shape[0],), batch=False, vocab=x.shape[0])
        m.line(f"{y.name} = torch.arange({x.name}.size(1))")
        m.features["integer value (arange of a size, no batch)"] += 1
        return True
    y = m.new("i", x.shape[:-1], vocab=x.shape[-1])
    m.line(f"{y.name} = {x.name}.argmax(-1)")
    m.features["integer value (argmax)"] += 1
    return True


def op_count(m: Model) -> bool:
    """Divide by a count of non-padding ids: an integer made float, without gradient."""
    ids = m.pick(lambda v: v.kind == "i" and v.batch and len(v.shape) == 1)
    x = m.pick(lambda v: is_float(v) and len(v.shape) == 1)
    if ids is None or x is None:
        return False
    m.read(ids)
    m.read(x, saved=True)
    y = m.new("f", x.shape, grad=x.grad)
    m.line(f"{y.name} = {x.name} / ({ids.name}.ne(0).sum(-1, keepdim=True).float() + 1)")
    m.features["count of ids as float"] += 1
    return True


def op_parameter(m: Model) -> bool:
    """A bare nn.Parameter: scaling or shifting a value, or a value of its own (no batch)."""
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    n = x.shape[-1]
    p = m.fresh("p")
    if m.rng.random() < 0.5:
        m.init.append(f"self.{p} = nn.Parameter(torch.ones({n}))")
        form = "{x} * self.{p}"
    else:
        m.init.append(f"self.{p} = nn.Parameter(0.1 * torch.randn({n}))")
        form = "{x} + self.{p}"
    if m.rng.random() < 0.3:  # the parameter's own value, computed once per forward
        w = m.new("f", (n,), batch=False, grad=True)
        m.line(f"{w.name} = self.{p}.tanh()")
        m.features["value from a parameter (no batch)"] += 1
        return True
    m.read(x, saved="*" in form)
    y = m.new("f", x.shape, grad=True, writable=True)
    m.line(f"{y.name} = {form.format(x=x.name, p=p)}")
    m.features["bare nn.Parameter"] += 1
    return True


def op_positions(m: Model) -> bool:
    """Learned positions: ``arange`` of a size (no batch), embedded, added to a (T, D) value."""
    x = m.pick(is_float_rank(2))
    if x is None:
        return False
    t, d = x.shape
    m.read(x)
    pos = m.new("i", (t,), batch=False, vocab=t)
    table = m.module("pos", f"nn.Embedding({t}, {d})", reuse=0.5)
    m.line(f"{pos.name} = torch.arange({x.name}.size(1))")
    if m.rng.random() < 0.5:  # the position embedding is its own value (it may cross stages)
        w = m.new("f", (t, d), batch=False, grad=True)
        m.line(f"{w.name} = {table}({pos.name})")
        m.features["Embedding of positions (no batch)"] += 1
        return True
    y = m.new("f", x.shape, grad=True, writable=True, contiguous=x.contiguous)
    m.line(f"{y.name} = {x.name} + {table}({pos.name})")
    m.features["Embedding of positions (no batch)"] += 1
    return True


def op_broadcast(m: Model) -> bool:
    """A value without the batch dimension (parameter-made, positions) applied to a batch one."""
    w = m.pick(lambda v: v.kind == "f" and not v.batch)
    if w is None:
        return False
    x = m.pick(lambda v: is_float(v) and _broadcasts(w, v))
    if x is None:
        return False
    op = m.rng.choice(["+", "*"])
    m.read(x, w, saved=op == "*")
    y = m.new("f", x.shape, grad=x.grad or w.grad, writable=True)
    m.line(f"{y.name} = {x.name} {op} {w.name}")
    m.features["no-batch value broadcast"] += 1
    return True


def op_buffer(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    n = x.shape[-1]
    buf = m.fresh("buf")
    persistent = m.rng.random() < 0.7
    m.init.append(
        f'self.register_buffer("{buf}", torch.linspace(-1, 1, {n}), persistent={persistent})'
    )
    m.read(x)
    y = m.new("f", x.shape, grad=x.grad, writable=True)
    m.line(f"{y.name} = {x.name} + self.{buf}")
    m.features["buffer" if persistent else "buffer (not persistent)"] += 1
    return True


def op_buffer_update(m: Model) -> bool:
    """A buffer mutated in forward (a call counter, a running mean under no_grad), never read
    by the outputs, whose values would otherwise depend on the micro-batching."""
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    name = m.fresh("stat")
    if m.rng.random() < 0.5:
        m.init.append(f'self.register_buffer("{name}", torch.zeros((), dtype=torch.long))')
        m.line(f"self.{name}.add_(1)")
        m.features["buffer mutated (counter)"] += 1
        return True
    n = x.shape[-1]
    m.init.append(f'self.register_buffer("{name}", torch.zeros({n}))')
    m.read(x)
    m.line("with torch.no_grad():")
    m.line(f"    self.{name}.mul_(0.9).add_(0.1 * {x.name}.detach().reshape(-1, {n}).mean(0))")
    m.features["buffer mutated (running mean, no_grad)"] += 1
    return True


def op_constant(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    n = x.shape[-1]
    numbers = ", ".join(f"{m.rng.uniform(-1, 1):.2f}" for _ in range(n))
    form = m.rng.choice(
        [
            "{x} * 0.5 + 1.0",
            "{x} * ({x}.size(-1) ** -0.5)",
            "{x} - {x}.mean(-1, keepdim=True)",
            f"{{x}} + torch.tensor([{numbers}])",
            f"{{x}} * torch.linspace(0.5, 1.5, {n})",
        ]
    )
    m.read(x, saved="{x} *" in form and "0.5 + 1.0" not in form and "size" not in form)
    y = m.new("f", x.shape, grad=x.grad, writable=True)
    m.line(f"{y.name} = {form.format(x=x.name)}")
    m.features["constants"] += 1
    return True


def op_reduce(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 2)
    if x is None:
        return False
    form = m.rng.choice(["{x}.mean(1)", "{x}.sum(dim=1)", "{x}.amax(1)", "torch.mean({x}, dim=1)"])
    m.read(x, saved="amax" in form)
    y = m.new("f", x.shape[1:], grad=x.grad, writable="amax" not in form)  # amax keeps both
    m.line(f"{y.name} = {form.format(x=x.name)}")
    m.features["reduction"] += 1
    return True


def op_softmax(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    m.read(x)
    y = m.new("f", x.shape, grad=x.grad)
    m.line(f"{y.name} = {x.name}.softmax(dim=-1)")
    m.features["softmax"] += 1
    return True


def op_dropout(m: Model) -> bool:
    x = m.pick(is_float)
    if x is None:
        return False
    if m.rng.random() < 0.5:
        call = f"{m.module('drop', 'nn.Dropout(0.0)', reuse=0.5)}({x.name})"
    else:
        call = f"F.dropout({x.name}, p=0.0, training=self.training)"
    y = m.view_of(x, x.shape)  # with p=0 the result may be the input itself
    m.line(f"{y.name} = {call}")
    m.features["dropout p=0"] += 1
    return True


def op_shape_branch(m: Model) -> bool:
    """Python control flow on a size: torch.fx cannot trace it, so torch.export is used."""
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    m.read(x)
    y = m.new("f", x.shape, grad=x.grad, writable=True)
    m.line(f"if {x.name}.shape[-1] % 2 == 0:")
    m.line(f"    {y.name} = {x.name} * 2.0")
    m.line("else:")
    m.line(f"    {y.name} = {x.name} + 1.0")
    m.features["Python branch on a shape (torch.export)"] += 1
    return True


BLOCK = '''class Block(nn.Module):
    """A pre-norm residual block: a submodule with children, traced through."""

    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.fc(F.gelu(self.norm(x)))'''


def op_block(m: Model) -> bool:
    """Submodules with children: a Block class of the file, nn.Sequential, an nn.ModuleList."""
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    d = x.shape[-1]
    form = m.rng.choice(["block", "sequential", "modulelist"])
    if form == "block":
        m.classes["Block"] = BLOCK
        call = f"{m.module('block', f'Block({d})', reuse=0.5)}({x.name})"
        m.features["custom Block submodule"] += 1
    elif form == "sequential":
        ctor = f"nn.Sequential(nn.Linear({d}, {d}), nn.ReLU(), nn.Linear({d}, {d}))"
        call = f"{m.module('seq', ctor, reuse=0.5)}({x.name})"
        m.features["nn.Sequential"] += 1
    else:
        layers = m.rng.randint(2, 3)
        ctor = f"nn.ModuleList([nn.Linear({d}, {d}) for _ in range({layers})])"
        stack = m.module("layers", ctor, reuse=0.5)
        y = m.new("f", x.shape, grad=True)
        m.read(x, saved=True)
        m.line(f"{y.name} = {x.name}")
        m.line(f"for layer in {stack}:")
        m.line(f"    {y.name} = torch.tanh(layer({y.name}))")
        m.features["nn.ModuleList loop"] += 1
        return True
    m.read(x, saved=True)
    y = m.new("f", x.shape, grad=True, writable=form == "block")
    m.line(f"{y.name} = {call}")
    return True


def op_unused(m: Model) -> bool:
    """A parameter, buffer or submodule that forward never reads (a pooler left unused)."""
    kind = m.rng.choice(["parameter", "buffer", "submodule"])
    name = m.fresh("unused")
    if kind == "parameter":
        m.init.append(f"self.{name} = nn.Parameter(torch.ones(3))")
    elif kind == "buffer":
        m.init.append(f'self.register_buffer("{name}", torch.ones(3))')
    else:
        m.init.append(f"self.{name} = nn.Linear(3, 3)")
    m.features[f"unused {kind}"] += 1
    return True


def op_no_grad(m: Model) -> bool:
    """A value computed under ``torch.no_grad()`` (a scale): no gradient flows through it."""
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    s = m.fresh("scale")
    m.line("with torch.no_grad():")
    m.line(f"    {s} = {x.name}.abs().mean(-1, keepdim=True) + 1.0")
    m.read(x, saved=True)
    y = m.new("f", x.shape, grad=x.grad)
    m.line(f"{y.name} = {x.name} / {s}")
    m.features["torch.no_grad() region"] += 1
    return True


OPS: dict[str, tuple[Callable[[Model], bool], float]] = {
    "linear": (op_linear, 6),
    "activation": (op_activation, 4),
    "inplace": (op_inplace, 3),
    "residual": (op_residual, 3),
    "gate": (op_gate, 1.5),
    "cat": (op_cat, 1.5),
    "chunk": (op_chunk, 1.5),
    "layernorm": (op_layernorm, 1.5),
    "batchnorm": (op_batchnorm, 1),
    "conv": (op_conv, 2),
    "pool": (op_pool, 1.5),
    "flatten": (op_flatten, 1.5),
    "unflatten": (op_unflatten, 1),
    "transpose": (op_transpose, 0.7),
    "embedding": (op_embedding, 2),
    "tied_head": (op_tied_head, 1),
    "attention": (op_attention, 1.5),
    "mask": (op_mask, 1.5),
    "apply_mask": (op_apply_mask, 1.5),
    "integer": (op_integer, 1),
    "count": (op_count, 0.5),
    "parameter": (op_parameter, 1),
    "positions": (op_positions, 0.7),
    "broadcast": (op_broadcast, 2),
    "buffer": (op_buffer, 0.7),
    "buffer_update": (op_buffer_update, 0.5),
    "constant": (op_constant, 1),
    "reduce": (op_reduce, 1),
    "softmax": (op_softmax, 0.5),
    "dropout": (op_dropout, 0.7),
    "shape_branch": (op_shape_branch, 0.4),
    "block": (op_block, 1.5),
    "no_grad": (op_no_grad, 0.7),
    "unused": (op_unused, 0.08),
}


# ---------------------------------------------------------------------------------------------
# A whole model file and its compile configuration.


@dataclass(frozen=True)
class Config:
    """How one model is compiled."""

    stages: int
    schedule: str
    microbatches: int
    checkpoint: str

    @property
    def devices(self) -> int:
        return self.stages // 2 if self.schedule == "interleaved" else self.stages

    def options(self) -> dict[str, object]:
        extra = {"virtual_stages": 2} if self.schedule == "interleaved" else {}
        return {
            "stages": self.stages,
            "schedule": self.schedule,
            "microbatches": self.microbatches,
            "checkpoint": self.checkpoint,
            **extra,
        }

    def __str__(self) -> str:
        return (
            f"stages {self.stages}, {self.schedule}, {self.microbatches} micro-batches, "
            f"checkpoint {self.checkpoint}"
        )


@dataclass(frozen=True)
class Case:
    """One generated model: its file's source, configuration, and the features it uses."""

    seed: int
    source: str
    config: Config
    features: tuple[str, ...]
    ops: int


def _add_inputs(m: Model) -> None:
    """1-3 used inputs (floats of rank 1-3 after the batch, ids, a mask), maybe one unused."""
    count = m.rng.randint(1, 3)
    for k in range(count + (m.rng.random() < 0.25)):
        kind = m.rng.choice(["f", "f", "i", "b"] if k else ["f", "f", "i"])
        if kind == "f":
            shape = m.rng.choice(
                [(m.rng.choice(SIZES),), (m.rng.choice(SIZES), m.rng.choice((4, 8))),
                 (m.rng.choice((2, 3, 4)), 4, 4)]
            )  # fmt: skip
            make = f"torch.randn({BATCH}, {', '.join(map(str, shape))}, generator=g)"
            facts: dict[str, object] = {}
        elif kind == "i":
            shape, vocab = (m.rng.choice((4, 6, 8)),), m.rng.choice((5, 10, 17))
            make = f"torch.randint(0, {vocab}, ({BATCH}, {shape[0]}), generator=g)"
            facts = {"vocab": vocab}
        else:
            shape = (m.rng.choice((4, 6, 8)),)
            make = f"torch.rand({BATCH}, {shape[0]}, generator=g) < 0.3"
            facts = {}
        name = ("x", "ids", "mask")["fib".index(kind)] + str(k)
        m.inputs.append((name, make))
        if k == count:  # the extra one
            m.features["unused input"] += 1
            continue
        m.values.append(Value(name, kind, shape, **facts))  # type: ignore[arg-type]
        m.features[{"f": "float input", "i": "integer ids input", "b": "bool input"}[kind]] += 1


def _signature(m: Model) -> None:
    """How the inputs are passed: a tuple or a dict; maybe a defaulted parameter not passed."""
    m.positional = m.rng.random() < 0.4
    if m.positional:
        m.features["example inputs as a tuple"] += 1
    if m.rng.random() < 0.15:
        m.defaults.append("unset=None")
        m.features["forward parameter left at its default"] += 1


def _outputs(m: Model) -> tuple[list[Value], str]:
    """The returned values (at least one float that depends on a parameter) and the form."""
    trained = [v for v in m.values if is_float(v) and v.grad]
    if not trained:
        x = m.pick(is_float)
        if x is None:
            op_embedding(m)
        else:
            op_linear(m)
        trained = [v for v in m.values if is_float(v) and v.grad]
    fresh = [v for v in trained if v.uses == 0] or trained[-1:]
    outs = m.rng.sample(fresh, min(len(fresh), m.rng.randint(1, 3)))
    dead = [v for v in m.values if is_float(v) and v.uses == 0 and v not in outs]
    if dead and m.rng.random() < 0.9:  # the dead ends, summed into one more output
        terms = [f"{v.name}.reshape({v.name}.size(0), -1).mean(1, keepdim=True)" for v in dead]
        m.read(*dead)
        aux = m.new("f", (1,), grad=any(v.grad for v in dead))
        m.line(f"{aux.name} = {' + '.join(terms)}")
        outs.append(aux)
    if m.rng.random() < 0.08:
        outs.append(outs[0])
        m.features["same value returned twice"] += 1
    given = [v for v in m.values if v.name in dict(m.inputs)]
    if given and m.rng.random() < 0.08:
        outs.append(m.rng.choice(given))
        m.features["model input returned as output"] += 1
    others = [v for v in m.values if v.batch and v.kind != "f"]
    if others and m.rng.random() < 0.25:
        outs.append(m.rng.choice(others))
        m.features["integer or bool output"] += 1
    form = "single" if len(outs) == 1 and m.rng.random() < 0.6 else m.rng.choice(["tuple", "dict"])
    m.features[f"output: {form}"] += 1
    return outs, form


def generate(seed: int, *, inplace: bool = True) -> Case:
    """The model and configuration of ``seed`` (``inplace=False``: no in-place ops)."""
    rng = random.Random(seed)
    m = Model(rng, inplace)
    _add_inputs(m)
    _signature(m)
    target = rng.randint(3, 14)
    done = tries = 0
    names, weights = list(OPS), [w for _, w in OPS.values()]
    while done < target and tries < 200:
        tries += 1
        if OPS[rng.choices(names, weights)[0]][0](m):
            done += 1
    outs, form = _outputs(m)
    source = _source(m, seed, outs, form)
    config = _config(rng, done)
    return Case(seed, source, config, tuple(sorted(m.features)), done)


def _config(rng: random.Random, ops: int) -> Config:
    schedule = rng.choice(SCHEDULES)
    most = max(1, min(4, ops))
    if schedule == "interleaved":
        stages = rng.choice([s for s in (2, 4) if s <= most] or [2])
    else:
        stages = rng.randint(1, most)
    devices = stages // 2 if schedule == "interleaved" else 1
    counts = [m for m in (1, 2, 4) if m % devices == 0]  # interleaved: a multiple of devices
    return Config(stages, schedule, rng.choice(counts), rng.choice(POLICIES))


def _source(m: Model, seed: int, outs: list[Value], form: str) -> str:
    names = [f"out{k}" for k in range(len(outs))]
    if form == "single":
        returned = outs[0].name
    elif form == "tuple":
        returned = "(" + ", ".join(v.name for v in outs) + ",)"
    else:
        returned = "{" + ", ".join(f'"{n}": {v.name}' for n, v in zip(names, outs)) + "}"
    floats = [k for k, v in enumerate(outs) if v.kind == "f"]
    targets = [
        f"torch.randn({', '.join(map(str, (BATCH, *outs[k].shape)))}, generator=g)" for k in floats
    ]
    pick = {"single": "output", "tuple": "output[{k}]", "dict": 'output["out{k}"]'}[form]
    losses = " + ".join(
        f"F.mse_loss({pick.format(k=k)}, t{j})" for j, k in enumerate(floats)
    )  # fmt: skip
    init = m.init or ["pass"]
    classes = [line for source in m.classes.values() for line in (*source.splitlines(), "", "")]
    lines = [
        f'"""pipecompile fuzz model, seed {seed}: {", ".join(sorted(m.features))}."""',
        "",
        "import torch",
        "import torch.nn.functional as F",
        "from torch import nn",
        "",
        "",
        *classes,
        "class Fuzz(nn.Module):",
        "    def __init__(self) -> None:",
        "        super().__init__()",
        *(f"        {line}" for line in init),
        "",
        f"    def forward(self, {', '.join([n for n, _ in m.inputs] + m.defaults)}):",
        *(f"        {line}" for line in m.body),
        f"        return {returned}",
        "",
        "",
        "def build_model():",
        f"    torch.manual_seed({seed})",
        "    return Fuzz().train()",
        "",
        "",
        "def example_inputs():",
        f"    g = torch.Generator().manual_seed({seed})",
        "    return "
        + (
            f"({''.join(f'{make}, ' for _, make in m.inputs)})"
            if m.positional
            else f"{{{', '.join(f'{n!r}: {make}' for n, make in m.inputs)}}}"
        ),
        "",
        "",
        "def example_targets():",
        f"    g = torch.Generator().manual_seed({seed + 1})",
        f"    return ({', '.join(targets)}{',' if len(targets) == 1 else ''})",
        "",
        "",
        f"def loss_fn(output, {', '.join(f't{j}' for j in range(len(floats)))}):",
        f"    return {losses}",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The driver: one case through the whole tool, classified.


@dataclass
class Outcome:
    """What happened to one seed."""

    seed: int
    verdict: str  # matched, refused, internal, mismatch, invalid
    phase: str = ""  # eager, compile, run, check, distributed
    key: str = ""  # the reason: error class and first words, or the known cause
    detail: str = ""  # the message, report or traceback
    config: str = ""
    features: tuple[str, ...] = ()
    seconds: float = 0.0
    distributed: str = ""  # "", or the verdict of the --nproc run
    source: str = field(default="", repr=False)


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Timeout(f"no result within {CASE_TIMEOUT_S} s (a hang?)")


def run_case(
    seed: int, *, inplace: bool = True, distributed: bool = False, workdir: Path | None = None
) -> Outcome:
    """Generate seed ``seed``'s model, push it through pipecompile, classify what happened."""
    start = time.perf_counter()
    try:
        case = generate(seed, inplace=inplace)
    except Exception as err:
        outcome = Outcome(seed, "invalid")
        _classify(outcome, "invalid", "generate", err)
        return outcome
    outcome = Outcome(seed, "matched", config=str(case.config), features=case.features)
    outcome.source = case.source
    with tempfile.TemporaryDirectory(prefix="fuzz", dir=workdir) as tmp:
        old = signal.signal(signal.SIGALRM, _alarm) if _main_thread() else None
        if old is not None:
            signal.alarm(CASE_TIMEOUT_S)
        try:
            _run(case, Path(tmp), outcome, distributed)
        except _Timeout as err:
            _classify(outcome, "internal", outcome.phase, err)
        finally:
            if old is not None:
                signal.alarm(0)
                signal.signal(signal.SIGALRM, old)
    outcome.seconds = time.perf_counter() - start
    return outcome


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _run(case: Case, tmp: Path, outcome: Outcome, distributed: bool) -> None:
    from pipecompile.codegen.emit import ModelRef, emit
    from pipecompile.compiler import compile_model
    from pipecompile.errors import InternalError, PipecompileError, RuntimeFailure
    from pipecompile.model.model_file import load_model_file
    from pipecompile.runtime.check import check_step
    from pipecompile.runtime.check_async import check_async_step
    from pipecompile.runtime.pipeline import Pipeline

    path = tmp / "model.py"
    path.write_text(case.source)
    outcome.phase = "eager"
    try:
        spec = load_model_file(str(path))
        _eager_step(spec)
        spec = load_model_file(str(path))  # a fresh model: the eager step changed buffers
    except Exception as err:
        return _classify(outcome, "invalid", "eager", err)
    outcome.phase = "compile"
    out = tmp / "out"
    try:
        compiled = compile_model(spec.model, spec.inputs, **case.config.options())  # type: ignore[arg-type]
        emit(compiled, out, model=ModelRef(path, "build_model", f"fuzz seed {case.seed}"))
    except InternalError as err:
        return _classify(outcome, "internal", "compile", err)
    except PipecompileError as err:
        return _classify(outcome, "refused", "compile", err)
    except Exception as err:
        return _classify(outcome, "internal", "compile", err)
    outcome.phase = "run"
    try:
        pipe = Pipeline.load(out)
        buffers = _buffers_after(spec.model, pipe, spec.inputs)
        args = (pipe, spec.model, spec.inputs, spec.targets, spec.loss_fn)
        if pipe.asynchronous:
            report = check_async_step(*args, atol=1e-5, rtol=1e-5)  # type: ignore[arg-type]
        else:
            report = check_step(*args, atol=1e-5, rtol=1e-5)  # type: ignore[arg-type]
    except (InternalError, RuntimeFailure) as err:
        return _classify(outcome, "internal", "run", err)
    except PipecompileError as err:  # accepted at compile, refused at run: still a bug
        return _classify(outcome, "internal", "run", err)
    except Exception as err:
        return _classify(outcome, "internal", "run", err)
    failures = list(report.failures)
    if not pipe.asynchronous:  # pipedream's micro-batches see other weights: no reference
        failures += _compare_buffers(pipe.state_dict(), buffers)
    if failures:
        outcome.verdict, outcome.phase = "mismatch", "check"
        outcome.key = "check failed: " + _words(failures[0], 6)
        outcome.detail = "\n".join([str(report), *(f"  MISMATCH {f}" for f in failures)])
        return None
    if distributed:
        _run_distributed(out, case.config, outcome)
    return None


def _buffers_after(model: object, pipe: object, inputs: dict[str, object]) -> dict[str, object]:
    """The buffers (BatchNorm statistics, counters, running means) after one step: the eager
    model from the pipeline's weights, run on each micro-batch in turn, as the stages do."""
    import copy

    import torch

    from pipecompile.ir.microbatch import split_microbatches
    from pipecompile.runtime.check import fit_weights

    twin = copy.deepcopy(model)
    twin.load_state_dict(fit_weights(pipe, twin))  # type: ignore[arg-type, attr-defined]
    with torch.no_grad():
        for batch in split_microbatches(inputs, pipe.program.microbatches):  # type: ignore[arg-type, attr-defined]
            twin(**batch)  # type: ignore[operator]
    return {n: b.detach().clone() for n, b in twin.named_buffers()}  # type: ignore[attr-defined]


def _compare_buffers(have: dict[str, object], want: dict[str, object]) -> list[str]:
    """A line per buffer of the pipeline that differs from the reference after the step."""
    import torch

    bad = []
    for name, ref in want.items():
        got = have.get(name)
        if got is None:
            continue  # not persistent: not in the state dict
        assert isinstance(got, torch.Tensor) and isinstance(ref, torch.Tensor)
        if got.shape != ref.shape or not torch.allclose(
            got.double(), ref.double(), atol=1e-5, rtol=1e-5
        ):
            bad.append(f"buffer {name} after the step: {got.tolist()} vs eager {ref.tolist()}")
    return bad


def _eager_step(spec: object) -> None:
    """Forward, loss and backward of the eager model: the generated model must run."""
    import torch

    model, inputs = spec.model, spec.inputs  # type: ignore[attr-defined]
    loss = spec.loss_fn(model(**inputs), *spec.targets)  # type: ignore[attr-defined]
    if not torch.isfinite(loss):
        raise ValueError(f"the eager loss is {float(loss)}")
    loss.backward()


def _run_distributed(out: Path, config: Config, outcome: Outcome) -> None:
    argv = [sys.executable, "-m", "pipecompile", "run", str(out), "--check", "--lr", "0.001"]
    argv += ["--nproc", str(config.devices), "--timeout", "60"]
    outcome.phase = "distributed"
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=DIST_TIMEOUT_S, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        outcome.distributed = outcome.verdict = "internal"
        outcome.key = f"distributed: no result within {DIST_TIMEOUT_S} s"
        return
    text = result.stdout + result.stderr
    if result.returncode == 0 and "check passed" in result.stdout:
        outcome.distributed = "matched"
        outcome.phase = "run"
        return
    mismatch = result.returncode == 1 and "check FAILED" in text
    outcome.distributed = outcome.verdict = "mismatch" if mismatch else "internal"
    lines = [line for line in text.splitlines() if line.strip()]
    reason = next((line for line in lines if line.startswith("pipecompile")), lines[-1:] or [""])
    outcome.key = f"distributed (exit {result.returncode}): " + _words(str(reason), 8)
    outcome.detail = text[-4000:]


def _classify(outcome: Outcome, verdict: str, phase: str, err: BaseException) -> None:
    outcome.verdict, outcome.phase = verdict, phase
    text = f"{type(err).__name__}: {err}"
    chain = text + "".join(
        f"\n{type(e).__name__}: {e}" for e in _causes(err)
    )  # the wrapped errors name the cause
    known = next((name for name, phrase in KNOWN.items() if phrase in chain), None)
    if known:
        outcome.key = f"known: {known}"
    elif verdict == "refused":
        outcome.key = f"{type(err).__name__}: {_words(str(err), 10)}"
    else:
        outcome.key = f"{type(err).__name__}: {_words(str(err), 8)}{_where(err)}"
    outcome.detail = chain + "\n" + "".join(traceback.format_exception(err))[-6000:]


def _causes(err: BaseException) -> list[BaseException]:
    found, seen = [], {id(err)}
    cause = err.__cause__ or err.__context__
    while cause is not None and id(cause) not in seen:
        found.append(cause)
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return found


def _words(text: str, count: int) -> str:
    """The first ``count`` words of ``text``'s first line, names and numbers blanked out,
    so that the same failure on different models has the same key."""
    first = (text.strip().splitlines() or [""])[0]
    first = re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`", "'_'", first)
    first = re.sub(r"\b\d+(\.\d+)?(e[-+]?\d+)?\b", "N", first)
    first = re.sub(r"\b(v|q|k|val|scores|lin|conv|norm|bn|emb|p|buf|stat)\d+\b", "_", first)
    return " ".join(first.split()[:count])


def _where(err: BaseException) -> str:
    """`` (at FILE:FUNCTION)``: the innermost frame in pipecompile of the deepest cause."""
    deepest = ([err, *_causes(err)])[-1]
    frames = traceback.extract_tb(deepest.__traceback__)
    ours = [f for f in frames if "/pipecompile/" in f.filename or "/passes/" in f.filename]
    if not ours:
        return ""
    frame = ours[-1]
    rel = os.path.relpath(frame.filename, REPO)
    return f" (at {rel}:{frame.name})"


# ---------------------------------------------------------------------------------------------
# Many seeds, in parallel, and the summary.


@dataclass(frozen=True)
class Plan:
    """What the worker processes run for each seed."""

    inplace: bool
    distributed_every: int
    first: int


def _work(item: tuple[int, Plan]) -> Outcome:
    seed, plan = item
    every = plan.distributed_every
    distributed = every > 0 and (seed - plan.first) % every == every - 1
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        return run_case(seed, inplace=plan.inplace, distributed=distributed)


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the pool


def run_many(seeds: list[int], plan: Plan, *, jobs: int, progress: bool = True) -> list[Outcome]:
    """Every seed's outcome, in seed order, computed by ``jobs`` processes."""
    items = [(seed, plan) for seed in seeds]
    outcomes: list[Outcome] = []
    if jobs <= 1:
        iterator: Iterable[Outcome] = map(_work, items)
        pool = None
    else:
        pool = multiprocessing.get_context("spawn").Pool(jobs, initializer=_init_worker)
        iterator = pool.imap_unordered(_work, items)
    try:
        for outcome in iterator:
            outcomes.append(outcome)
            if progress:
                _progress(outcome, len(outcomes), len(items))
    except BaseException:
        if pool is not None:
            pool.terminate()
        raise
    if pool is not None:
        pool.close()
        pool.join()
    return sorted(outcomes, key=lambda o: o.seed)


def _progress(outcome: Outcome, done: int, total: int) -> None:
    if outcome.verdict not in ("matched", "refused"):
        print(f"  seed {outcome.seed}: {outcome.verdict} [{outcome.phase}] {outcome.key}")
    if done % 100 == 0 or done == total:
        print(f"  ... {done}/{total}", file=sys.stderr, flush=True)


def summary(outcomes: list[Outcome], *, flags: str = "") -> str:
    """Counts by verdict, refusals and failures by reason, every failure's seed."""
    verdicts = Counter(o.verdict for o in outcomes)
    lines = [f"{len(outcomes)} models"]
    for verdict in ("matched", "refused", "internal", "mismatch", "invalid"):
        lines.append(f"  {verdict:<9}{verdicts.get(verdict, 0):>6}")
        group = [o for o in outcomes if o.verdict == verdict]
        if verdict == "matched" or not group:
            continue
        by_key = Counter(o.key for o in group)
        for key, n in by_key.most_common():
            seeds = [o.seed for o in group if o.key == key]
            shown = ", ".join(map(str, seeds[:8])) + (" ..." if len(seeds) > 8 else "")
            lines.append(f"    {n:>5}  {key}")
            if verdict != "refused" or n <= 3:
                lines.append(f"           seeds {shown}")
    dist = [o for o in outcomes if o.distributed]
    if dist:
        counts = Counter(o.distributed for o in dist)
        lines.append(
            f"  distributed --nproc runs: {len(dist)} "
            + ", ".join(f"{v} {n}" for v, n in sorted(counts.items()))
        )
    bad = [o for o in outcomes if o.verdict in ("internal", "mismatch", "invalid")]
    if bad:
        lines.append(f"replay: python tools/fuzz.py --seed SEED --show{flags}")
    return "\n".join(lines)


def feature_table(outcomes: list[Outcome]) -> str:
    """Per feature: how many models used it and how many of them matched."""
    used, matched = Counter[str](), Counter[str]()
    for o in outcomes:
        for f in o.features:
            used[f] += 1
            matched[f] += o.verdict == "matched"
    rows = [f"  {n:>5} {matched[f]:>5}  {f}" for f, n in sorted(used.items())]
    return "\n".join(["features: models / matched", *rows])


def show(seed: int, *, inplace: bool, distributed: bool = False) -> int:
    """Print one seed's model file, configuration and full outcome (``distributed``: with the
    ``pipecompile run --nproc N --check`` run too)."""
    case = generate(seed, inplace=inplace)
    print(case.source)
    print(f"# config: {case.config}; {case.ops} ops")
    outcome = run_case(seed, inplace=inplace, distributed=distributed)
    print(f"# outcome: {outcome.verdict} [{outcome.phase}] {outcome.key}")
    if outcome.detail:
        print(outcome.detail)
    return 0 if outcome.verdict in ("matched", "refused") else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100, help="how many seeds (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--quick", action="store_true", help="a few models, a few seconds")
    parser.add_argument("--show", action="store_true", help="print --seed's model and outcome")
    parser.add_argument("--no-inplace", action="store_true", help="generate no in-place ops")
    parser.add_argument(
        "--distributed-every",
        type=int,
        default=0,
        metavar="K",
        help="every K-th model also runs `pipecompile run --nproc N --check`",
    )
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--features", action="store_true", help="print the feature table")
    args = parser.parse_args(argv)
    if args.count < 1 or args.jobs < 1 or args.distributed_every < 0:
        parser.error("--count and --jobs must be at least 1, --distributed-every at least 0")
    try:
        import torch  # noqa: F401  (workers would fail one by one without it)
    except ImportError:
        print("fuzz: torch is not installed in this Python; activate the project's venv")
        return 2
    inplace = not args.no_inplace
    flags = " --no-inplace" if args.no_inplace else ""
    if args.show:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return show(args.seed, inplace=inplace, distributed=args.distributed_every > 0)
    count = 6 if args.quick else args.count
    seeds = list(range(args.seed, args.seed + count))
    plan = Plan(inplace, args.distributed_every, args.seed)
    start = time.perf_counter()
    outcomes = run_many(seeds, plan, jobs=args.jobs)
    took = time.perf_counter() - start
    print(f"fuzz: seeds {seeds[0]}-{seeds[-1]}{flags}, {args.jobs} job(s), {took:.1f} s")
    print(summary(outcomes, flags=flags))
    if args.features:
        print(feature_table(outcomes))
    return 1 if any(o.verdict in ("internal", "mismatch", "invalid") for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
