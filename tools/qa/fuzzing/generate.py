"""A whole random model file (``build_model``, ``example_inputs``, ``example_targets``,
``loss_fn``) and the configuration it is compiled with."""

from __future__ import annotations

import random
from dataclasses import dataclass

from fuzzing.model import BATCH, SIZES, Model, Value, is_float
from fuzzing.ops import OPS, op_embedding, op_linear

SCHEDULES = ("gpipe", "1f1b", "zb1p", "interleaved", "pipedream")
POLICIES = ("never", "except_last", "always")


@dataclass(frozen=True)
class Config:
    """How one model is compiled."""

    stages: int
    schedule: str
    microbatches: int
    recompute: str

    @property
    def devices(self) -> int:
        return self.stages // 2 if self.schedule == "interleaved" else self.stages

    def options(self) -> dict[str, object]:
        extra = {"virtual_stages": 2} if self.schedule == "interleaved" else {}
        return {
            "stages": self.stages,
            "schedule": self.schedule,
            "microbatches": self.microbatches,
            "recompute": self.recompute,
            **extra,
        }

    def __str__(self) -> str:
        return (
            f"stages {self.stages}, {self.schedule}, {self.microbatches} micro-batches, "
            f"recompute {self.recompute}"
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
