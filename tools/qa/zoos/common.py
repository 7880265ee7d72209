"""The model-file template every zoo fills in: ``build_model()`` (seeded, dropout off, training
mode), ``example_inputs()``, ``example_targets()`` and ``loss_fn`` (a batch mean)."""

from __future__ import annotations

from dataclasses import dataclass

BATCH = 8  # rows of the example batch: 2 or 4 micro-batches of it
CLASSES = 10  # classes of every image classifier
IMAGE = 64  # side of the example images, where a model takes any size

HEADER = '''"""{zoo} {name} with random weights: a model file written by tools/qa/zoo.py."""

from __future__ import annotations
{path}
import torch
import torch.nn.functional as F
from torch import nn

BATCH = {batch}
'''

ZOO_PATH = """
import sys

if {zoo_dir!r} not in sys.path:  # torchvision and timm live there, not in the environment
    sys.path.insert(0, {zoo_dir!r})
"""

FOOTER = '''

def _no_dropout(model: nn.Module) -> nn.Module:
    """Every dropout and stochastic-depth module at rate 0: eager and pipeline draw different
    masks (torchvision's StochasticDepth has ``p``, timm's and transformers' DropPath
    ``drop_prob``)."""
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
        if type(module).__name__ == "StochasticDepth":
            module.p = 0.0
        if isinstance(getattr(module, "drop_prob", None), float):
            module.drop_prob = 0.0
    return model


def build_model() -> nn.Module:
    torch.manual_seed(0)
    model = _no_dropout(_build())
    model.train()
    return model
'''

IMAGES = """
SIZE = {size}
CLASSES = {classes}


def _build() -> nn.Module:
{build}


def example_inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1234)
    return (torch.randn(BATCH, 3, SIZE, SIZE, generator=g),)


def example_targets() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(5678)
    return (torch.randint(0, CLASSES, (BATCH,), generator=g),)


def loss_fn(output, target: torch.Tensor) -> torch.Tensor:
    if isinstance(output, tuple | list):  # (logits, auxiliary logits, ...)
        output = output[0]
    return F.cross_entropy(output, target)
"""


@dataclass(frozen=True)
class Model:
    """One model of one zoo, with the source of its model file."""

    zoo: str
    name: str
    source: str
    generates: bool = False  # a causal LM: compiled with --generate, decoded against HF


def model_file(zoo: str, name: str, body: str, zoo_dir: str | None = None) -> str:
    """A whole model file: the header (``zoo_dir`` put on ``sys.path`` when given), ``body``
    (which defines ``_build()`` and the example and loss hooks) and ``build_model()``."""
    path = ZOO_PATH.format(zoo_dir=zoo_dir) if zoo_dir else ""
    header = HEADER.format(zoo=zoo, name=name, path=path, batch=BATCH)
    return header + body + FOOTER


def image_body(build: str, size: int = IMAGE, classes: int = CLASSES) -> str:
    """The body of an image classifier's model file; ``build`` is ``_build()``'s code (one or
    more lines, unindented, ending in a ``return``)."""
    indented = "\n".join(f"    {line}" if line else "" for line in build.strip().splitlines())
    return IMAGES.format(size=size, classes=classes, build=indented)


def sample(names: list[str], count: int) -> list[str]:
    """``count`` names evenly spaced over ``names`` (all of them for 0)."""
    if count <= 0 or count >= len(names):
        return names
    step = len(names) / count
    return [names[int(k * step)] for k in range(count)]
