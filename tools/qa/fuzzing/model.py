"""A random model being generated: live values of known shapes, and the lines of its file."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

BATCH = 8
SIZES = (4, 6, 8, 12, 16)


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
