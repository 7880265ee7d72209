"""Which nodes of a graph draw random numbers.

The compiler lists a stage's random nodes by their name in the traced graph (the manifest's
``random_ops``); the runtime finds the same nodes in the stage's own code and seeds each from
(seed, step, micro-batch, that name), so the numbers do not depend on how the graph was cut.
Known here: torch.nn's dropout modules and RReLU, torch's and functional's random functions,
the in-place samplers (``uniform_`` ...) and every aten op tagged nondeterministic_seeded; a
dropout at rate 0 is not random (its value is its input).
Random numbers drawn inside other code (a custom autograd Function, an op of another library)
are not seen; docs/USAGE.md says what that means.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

__all__ = ["is_random", "random_nodes"]

RANDOM_MODULES = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
    nn.RReLU,
)

RANDOM_FUNCTIONS = {
    F.dropout,
    F.dropout1d,
    F.dropout2d,
    F.dropout3d,
    F.alpha_dropout,
    F.feature_alpha_dropout,
    F.rrelu,
    F.gumbel_softmax,
    F.scaled_dot_product_attention,
    torch.dropout,
    torch.bernoulli,
    torch.rand,
    torch.rand_like,
    torch.randn,
    torch.randn_like,
    torch.randint,
    torch.randint_like,
    torch.randperm,
    torch.normal,
    torch.poisson,
    torch.multinomial,
    torch.alpha_dropout,
    torch.feature_alpha_dropout,
    torch.rrelu,
}

RANDOM_METHODS = {
    "bernoulli",
    "bernoulli_",
    "uniform_",
    "normal_",
    "random_",
    "exponential_",
    "geometric_",
    "cauchy_",
    "log_normal_",
    "multinomial",
}


DROPOUT_FUNCTIONS = {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout}
DROPOUT_FUNCTIONS |= {F.feature_alpha_dropout, torch.dropout, torch.alpha_dropout}
DROPOUT_FUNCTIONS |= {torch.feature_alpha_dropout, torch.ops.aten.dropout.default}
DROPOUT_FUNCTIONS |= {torch.ops.aten.native_dropout.default}


def is_random(node: fx.Node, root: nn.Module) -> bool:
    """Whether ``node``'s value (in a graph whose modules live under ``root``) depends on
    random numbers. A dropout at rate 0 does not: its value is its input, whatever it draws."""
    if node.op == "call_module":
        module = root.get_submodule(str(node.target))
        if isinstance(module, RANDOM_MODULES[:-1]) and getattr(module, "p", None) == 0:
            return False
        return isinstance(module, RANDOM_MODULES)
    if node.op == "call_method":
        return node.target in RANDOM_METHODS
    if node.op != "call_function":
        return False
    target = node.target
    if target is F.scaled_dot_product_attention:  # random only with dropout
        p = node.kwargs.get("dropout_p", node.args[4] if len(node.args) > 4 else 0.0)
        return not (isinstance(p, int | float) and p == 0)
    if _is_hashable(target) and target in DROPOUT_FUNCTIONS:
        p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
        if isinstance(p, int | float) and p == 0:
            return False
    if isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        seeded = torch.Tag.nondeterministic_seeded in getattr(target, "tags", ())
        return seeded and not _draws_nothing(node, target)
    try:
        return target in RANDOM_FUNCTIONS
    except TypeError:  # an unhashable callable
        return False


def _draws_nothing(node: fx.Node, target: Any) -> bool:
    """An ATen dropout or attention (as torch.export records them) whose rate is 0 or that
    runs in eval mode (``train=False``): its value does not depend on what it draws."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return False
    for k, arg in enumerate(schema.arguments):
        if arg.name not in ("p", "dropout_p", "train"):
            continue
        value = node.kwargs.get(arg.name, node.args[k] if k < len(node.args) else None)
        if value is None and arg.has_default_value():
            value = arg.default_value
        if (arg.name == "train" and value is False) or (arg.name != "train" and value == 0):
            return True
    return False


def random_nodes(module: fx.GraphModule) -> list[fx.Node]:
    """``module``'s random nodes, in the order its forward runs them."""
    return [n for n in module.graph.nodes if is_random(n, module)]


def _is_hashable(target: object) -> bool:
    try:
        hash(target)
    except TypeError:
        return False
    return True
