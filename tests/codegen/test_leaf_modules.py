"""Every torch.nn module class, built with settings away from its defaults, is rebuilt from the
constructor call a stage file holds and computes exactly what the original does (forward and
backward); a class that cannot be rebuilt is traced through instead (tests/codegen/test_prove.py
compiles a few end to end)."""

# ruff: noqa: E501 - the table of cases reads best one case a line

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipecompile.ir.graph.leaf_modules import leaf_constructor

T = torch.randn
IMG = (2, 4, 9, 9)  # odd sizes: ceil_mode and padding change the shapes
SEQ = (2, 4, 9)
VOL = (1, 4, 5, 5, 5)


def _ints(*shape: int, high: int = 10) -> Callable[[], tuple[torch.Tensor]]:
    return lambda: (torch.randint(0, high, shape),)


# (module, its inputs); each with settings other than the defaults where it has any.
CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple]]] = {
    "AdaptiveAvgPool1d": (lambda: nn.AdaptiveAvgPool1d(4), lambda: (T(*SEQ),)),
    "AdaptiveAvgPool2d": (lambda: nn.AdaptiveAvgPool2d((4, None)), lambda: (T(*IMG),)),
    "AdaptiveAvgPool3d": (lambda: nn.AdaptiveAvgPool3d(2), lambda: (T(*VOL),)),
    "AdaptiveMaxPool1d": (lambda: nn.AdaptiveMaxPool1d(4, return_indices=True), lambda: (T(*SEQ),)),
    "AdaptiveMaxPool2d": (lambda: nn.AdaptiveMaxPool2d(3), lambda: (T(*IMG),)),
    "AdaptiveMaxPool3d": (lambda: nn.AdaptiveMaxPool3d(2), lambda: (T(*VOL),)),
    "AlphaDropout": (lambda: nn.AlphaDropout(0.3).eval(), lambda: (T(*SEQ),)),
    "AvgPool1d": (lambda: nn.AvgPool1d(3, 2, 1, count_include_pad=False, ceil_mode=True), lambda: (T(*SEQ),)),
    "AvgPool2d": (lambda: nn.AvgPool2d(3, 1, 1, count_include_pad=False), lambda: (T(*IMG),)),
    "AvgPool2d_divisor": (lambda: nn.AvgPool2d(3, 2, divisor_override=2, ceil_mode=True), lambda: (T(*IMG),)),
    "AvgPool3d": (lambda: nn.AvgPool3d(3, 2, 1, count_include_pad=False), lambda: (T(*VOL),)),
    "BCELoss": (lambda: nn.BCELoss(weight=torch.rand(9), reduction="sum"), lambda: (torch.rand(*SEQ), torch.rand(*SEQ))),
    "BCEWithLogitsLoss": (lambda: nn.BCEWithLogitsLoss(pos_weight=torch.rand(9)), lambda: (T(*SEQ), torch.rand(*SEQ))),
    "BatchNorm1d": (lambda: nn.BatchNorm1d(4, eps=1e-3, momentum=None), lambda: (T(*SEQ),)),
    "BatchNorm2d": (lambda: nn.BatchNorm2d(4, affine=False, track_running_stats=False), lambda: (T(*IMG),)),
    "BatchNorm3d": (lambda: nn.BatchNorm3d(4, momentum=0.5), lambda: (T(*VOL),)),
    "Bilinear": (lambda: nn.Bilinear(4, 3, 5, bias=False), lambda: (T(2, 4), T(2, 3))),
    "CELU": (lambda: nn.CELU(0.5), lambda: (T(*SEQ),)),
    "CTCLoss": (lambda: nn.CTCLoss(blank=1, reduction="sum", zero_infinity=True), lambda: (T(9, 2, 5).log_softmax(2), torch.randint(2, 5, (2, 4)), torch.tensor([9, 9]), torch.tensor([4, 3]))),
    "ChannelShuffle": (lambda: nn.ChannelShuffle(2), lambda: (T(*IMG),)),
    "CircularPad1d": (lambda: nn.CircularPad1d((1, 2)), lambda: (T(*SEQ),)),
    "CircularPad2d": (lambda: nn.CircularPad2d((1, 2, 0, 1)), lambda: (T(*IMG),)),
    "CircularPad3d": (lambda: nn.CircularPad3d(1), lambda: (T(*VOL),)),
    "ConstantPad1d": (lambda: nn.ConstantPad1d((1, 2), 3.5), lambda: (T(*SEQ),)),
    "ConstantPad2d": (lambda: nn.ConstantPad2d((1, 2, 0, 1), -1.0), lambda: (T(*IMG),)),
    "ConstantPad3d": (lambda: nn.ConstantPad3d(1, 2.0), lambda: (T(*VOL),)),
    "Conv1d": (lambda: nn.Conv1d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2, padding_mode="circular"), lambda: (T(*SEQ),)),
    "Conv2d": (lambda: nn.Conv2d(4, 6, 3, padding="same", padding_mode="reflect", bias=False), lambda: (T(*IMG),)),
    "Conv3d": (lambda: nn.Conv3d(4, 2, 2, padding=1, padding_mode="replicate"), lambda: (T(*VOL),)),
    "ConvTranspose1d": (lambda: nn.ConvTranspose1d(4, 6, 3, stride=2, output_padding=1, groups=2), lambda: (T(*SEQ),)),
    "ConvTranspose2d": (lambda: nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, dilation=2, bias=False), lambda: (T(*IMG),)),
    "ConvTranspose3d": (lambda: nn.ConvTranspose3d(4, 2, 2, stride=2), lambda: (T(*VOL),)),
    "CosineEmbeddingLoss": (lambda: nn.CosineEmbeddingLoss(margin=0.3), lambda: (T(3, 5), T(3, 5), torch.tensor([1, -1, 1]))),
    "CosineSimilarity": (lambda: nn.CosineSimilarity(dim=2, eps=1e-3), lambda: (T(*SEQ), T(*SEQ))),
    "CrossEntropyLoss": (lambda: nn.CrossEntropyLoss(weight=torch.rand(4), ignore_index=2, label_smoothing=0.1), lambda: (T(*SEQ), _ints(2, 9, high=4)()[0])),
    "CrossMapLRN2d": (lambda: nn.CrossMapLRN2d(3, alpha=0.1, beta=0.5, k=2.0), lambda: (T(*IMG),)),
    "Dropout": (lambda: nn.Dropout(0.4).eval(), lambda: (T(*SEQ),)),
    "Dropout1d": (lambda: nn.Dropout1d(0.4).eval(), lambda: (T(*SEQ),)),
    "Dropout2d": (lambda: nn.Dropout2d(0.4).eval(), lambda: (T(*IMG),)),
    "Dropout3d": (lambda: nn.Dropout3d(0.4).eval(), lambda: (T(*VOL),)),
    "ELU": (lambda: nn.ELU(alpha=0.3), lambda: (T(*SEQ),)),
    "Embedding": (lambda: nn.Embedding(10, 4, padding_idx=3, max_norm=0.5, norm_type=1.0, scale_grad_by_freq=True), _ints(2, 9)),
    "EmbeddingBag": (lambda: nn.EmbeddingBag(10, 4, mode="max", padding_idx=0), _ints(2, 9)),
    "EmbeddingBag_sum": (lambda: nn.EmbeddingBag(10, 4, mode="sum", max_norm=1.0), _ints(2, 9)),
    "FeatureAlphaDropout": (lambda: nn.FeatureAlphaDropout(0.3).eval(), lambda: (T(*IMG),)),
    "Flatten": (lambda: nn.Flatten(2, 3), lambda: (T(*VOL),)),
    "Fold": (lambda: nn.Fold((5, 5), 2, dilation=2, padding=1, stride=1), lambda: (T(2, 8, 25),)),
    "FractionalMaxPool2d": (lambda: nn.FractionalMaxPool2d(2, output_ratio=0.5), lambda: (T(*IMG),)),
    "FractionalMaxPool3d": (lambda: nn.FractionalMaxPool3d(2, output_size=3), lambda: (T(*VOL),)),
    "GELU": (lambda: nn.GELU("tanh"), lambda: (T(*SEQ),)),
    "GLU": (lambda: nn.GLU(dim=1), lambda: (T(*SEQ),)),
    "GRU": (lambda: nn.GRU(9, 5, num_layers=2, batch_first=True, bidirectional=True), lambda: (T(*SEQ),)),
    "GRUCell": (lambda: nn.GRUCell(9, 5, bias=False), lambda: (T(4, 9),)),
    "GaussianNLLLoss": (lambda: nn.GaussianNLLLoss(full=True, eps=1e-3, reduction="sum"), lambda: (T(*SEQ), T(*SEQ), torch.rand(*SEQ))),
    "GroupNorm": (lambda: nn.GroupNorm(2, 4, eps=1e-3, affine=False), lambda: (T(*IMG),)),
    "Hardshrink": (lambda: nn.Hardshrink(0.3), lambda: (T(*SEQ),)),
    "Hardsigmoid": (lambda: nn.Hardsigmoid(), lambda: (T(*SEQ),)),
    "Hardswish": (lambda: nn.Hardswish(), lambda: (T(*SEQ),)),
    "Hardtanh": (lambda: nn.Hardtanh(-0.5, 0.7), lambda: (T(*SEQ),)),
    "HingeEmbeddingLoss": (lambda: nn.HingeEmbeddingLoss(margin=0.4), lambda: (T(*SEQ), torch.ones(*SEQ))),
    "HuberLoss": (lambda: nn.HuberLoss(delta=0.3, reduction="sum"), lambda: (T(*SEQ), T(*SEQ))),
    "Identity": (lambda: nn.Identity(), lambda: (T(*SEQ),)),
    "InstanceNorm1d": (lambda: nn.InstanceNorm1d(4, affine=True), lambda: (T(*SEQ),)),
    "InstanceNorm2d": (lambda: nn.InstanceNorm2d(4, track_running_stats=True, momentum=0.3), lambda: (T(*IMG),)),
    "InstanceNorm3d": (lambda: nn.InstanceNorm3d(4, eps=1e-2), lambda: (T(*VOL),)),
    "KLDivLoss": (lambda: nn.KLDivLoss(reduction="batchmean", log_target=True), lambda: (T(*SEQ), T(*SEQ))),
    "L1Loss": (lambda: nn.L1Loss(reduction="sum"), lambda: (T(*SEQ), T(*SEQ))),
    "LPPool1d": (lambda: nn.LPPool1d(3, 2, stride=1, ceil_mode=True), lambda: (torch.rand(*SEQ) + 0.1,)),
    "LPPool2d": (lambda: nn.LPPool2d(2, 3, stride=2), lambda: (torch.rand(*IMG) + 0.1,)),
    "LPPool3d": (lambda: nn.LPPool3d(1.5, 2), lambda: (torch.rand(*VOL) + 0.1,)),
    "LSTM": (lambda: nn.LSTM(9, 6, num_layers=2, batch_first=True, proj_size=3), lambda: (T(*SEQ),)),
    "LSTMCell": (lambda: nn.LSTMCell(9, 5), lambda: (T(4, 9),)),
    "LayerNorm": (lambda: nn.LayerNorm((4, 9), eps=1e-3, bias=False), lambda: (T(*SEQ),)),
    "LayerNorm_plain": (lambda: nn.LayerNorm(9, elementwise_affine=False), lambda: (T(*SEQ),)),
    "LeakyReLU": (lambda: nn.LeakyReLU(0.3), lambda: (T(*SEQ),)),
    "Linear": (lambda: nn.Linear(9, 3, bias=False), lambda: (T(*SEQ),)),
    "LocalResponseNorm": (lambda: nn.LocalResponseNorm(3, alpha=0.1, beta=0.5, k=2.0), lambda: (T(*IMG),)),
    "LogSigmoid": (lambda: nn.LogSigmoid(), lambda: (T(*SEQ),)),
    "LogSoftmax": (lambda: nn.LogSoftmax(dim=1), lambda: (T(*SEQ),)),
    "MSELoss": (lambda: nn.MSELoss(reduction="none"), lambda: (T(*SEQ), T(*SEQ))),
    "MarginRankingLoss": (lambda: nn.MarginRankingLoss(margin=0.2), lambda: (T(5), T(5), torch.tensor([1.0, -1, 1, -1, 1]))),
    "MaxPool1d": (lambda: nn.MaxPool1d(3, 2, 1, dilation=2, ceil_mode=True), lambda: (T(*SEQ),)),
    "MaxPool2d": (lambda: nn.MaxPool2d(3, 2, 1, return_indices=True), lambda: (T(*IMG),)),
    "MaxPool3d": (lambda: nn.MaxPool3d(2, ceil_mode=True), lambda: (T(*VOL),)),
    "MaxUnpool1d": (lambda: nn.MaxUnpool1d(2), lambda: F.max_pool1d(T(*SEQ), 2, return_indices=True)),
    "MaxUnpool2d": (lambda: nn.MaxUnpool2d(3, stride=2, padding=1), lambda: F.max_pool2d(T(*IMG), 3, 2, 1, return_indices=True)),
    "MaxUnpool3d": (lambda: nn.MaxUnpool3d(2), lambda: F.max_pool3d(T(1, 2, 4, 4, 4), 2, return_indices=True)),
    "Mish": (lambda: nn.Mish(), lambda: (T(*SEQ),)),
    "MultiLabelMarginLoss": (lambda: nn.MultiLabelMarginLoss(reduction="sum"), lambda: (T(3, 4), torch.tensor([[3, 0, -1, 1]] * 3))),
    "MultiLabelSoftMarginLoss": (lambda: nn.MultiLabelSoftMarginLoss(weight=torch.rand(4)), lambda: (T(3, 4), torch.randint(0, 2, (3, 4)).float())),
    "MultiMarginLoss": (lambda: nn.MultiMarginLoss(p=2, margin=0.5, weight=torch.rand(4)), lambda: (T(3, 4), torch.tensor([0, 3, 1]))),
    "NLLLoss": (lambda: nn.NLLLoss(weight=torch.rand(4), ignore_index=1), lambda: (T(*SEQ), _ints(2, 9, high=4)()[0])),
    "NLLLoss2d": (lambda: nn.NLLLoss2d(reduction="sum"), lambda: (T(*IMG), _ints(2, 9, 9, high=4)()[0])),
    "PReLU": (lambda: nn.PReLU(4, init=0.1), lambda: (T(*IMG),)),
    "PairwiseDistance": (lambda: nn.PairwiseDistance(p=1.0, eps=1e-3, keepdim=True), lambda: (T(3, 5), T(3, 5))),
    "PixelShuffle": (lambda: nn.PixelShuffle(2), lambda: (T(1, 8, 3, 3),)),
    "PixelUnshuffle": (lambda: nn.PixelUnshuffle(3), lambda: (T(*IMG),)),
    "PoissonNLLLoss": (lambda: nn.PoissonNLLLoss(log_input=False, full=True), lambda: (torch.rand(*SEQ) + 0.1, torch.rand(*SEQ))),
    "RMSNorm": (lambda: nn.RMSNorm(9, eps=1e-3, elementwise_affine=False), lambda: (T(*SEQ),)),
    "RNN": (lambda: nn.RNN(9, 5, num_layers=2, bias=False), lambda: (T(*SEQ),)),
    "RNN_relu": (lambda: nn.RNN(9, 5, nonlinearity="relu"), lambda: (T(*SEQ),)),
    "RNNCell": (lambda: nn.RNNCell(9, 5, nonlinearity="relu"), lambda: (T(4, 9),)),
    "RReLU": (lambda: nn.RReLU(0.1, 0.2).eval(), lambda: (T(*SEQ),)),
    "ReLU": (lambda: nn.ReLU(), lambda: (T(*SEQ),)),
    "ReLU6": (lambda: nn.ReLU6(), lambda: (T(*SEQ) * 8,)),
    "ReflectionPad1d": (lambda: nn.ReflectionPad1d((2, 1)), lambda: (T(*SEQ),)),
    "ReflectionPad2d": (lambda: nn.ReflectionPad2d((2, 1, 0, 3)), lambda: (T(*IMG),)),
    "ReflectionPad3d": (lambda: nn.ReflectionPad3d(1), lambda: (T(*VOL),)),
    "ReplicationPad1d": (lambda: nn.ReplicationPad1d((2, 1)), lambda: (T(*SEQ),)),
    "ReplicationPad2d": (lambda: nn.ReplicationPad2d((2, 1, 0, 3)), lambda: (T(*IMG),)),
    "ReplicationPad3d": (lambda: nn.ReplicationPad3d(1), lambda: (T(*VOL),)),
    "SELU": (lambda: nn.SELU(), lambda: (T(*SEQ),)),
    "SiLU": (lambda: nn.SiLU(), lambda: (T(*SEQ),)),
    "Sigmoid": (lambda: nn.Sigmoid(), lambda: (T(*SEQ),)),
    "SmoothL1Loss": (lambda: nn.SmoothL1Loss(beta=0.3), lambda: (T(*SEQ), T(*SEQ))),
    "SoftMarginLoss": (lambda: nn.SoftMarginLoss(reduction="sum"), lambda: (T(*SEQ), torch.sign(T(*SEQ)))),
    "Softmax": (lambda: nn.Softmax(dim=1), lambda: (T(*SEQ),)),
    "Softmax2d": (lambda: nn.Softmax2d(), lambda: (T(*IMG),)),
    "Softmin": (lambda: nn.Softmin(dim=2), lambda: (T(*SEQ),)),
    "Softplus": (lambda: nn.Softplus(beta=2.0, threshold=1.0), lambda: (T(*SEQ),)),
    "Softshrink": (lambda: nn.Softshrink(0.3), lambda: (T(*SEQ),)),
    "Softsign": (lambda: nn.Softsign(), lambda: (T(*SEQ),)),
    "SyncBatchNorm": (lambda: nn.SyncBatchNorm(4).eval(), lambda: (T(*IMG),)),
    "Tanh": (lambda: nn.Tanh(), lambda: (T(*SEQ),)),
    "Tanhshrink": (lambda: nn.Tanhshrink(), lambda: (T(*SEQ),)),
    "Threshold": (lambda: nn.Threshold(0.2, -3.0), lambda: (T(*SEQ),)),
    "TripletMarginLoss": (lambda: nn.TripletMarginLoss(margin=0.5, p=1.0, swap=True), lambda: (T(3, 5), T(3, 5), T(3, 5))),
    "TripletMarginWithDistanceLoss": (lambda: nn.TripletMarginWithDistanceLoss(margin=0.5, swap=True), lambda: (T(3, 5), T(3, 5), T(3, 5))),
    "Unflatten": (lambda: nn.Unflatten(2, (3, 3)), lambda: (T(*SEQ),)),
    "Unfold": (lambda: nn.Unfold(3, dilation=2, padding=1, stride=2), lambda: (T(*IMG),)),
    "Upsample": (lambda: nn.Upsample(scale_factor=1.5, mode="bilinear", align_corners=True), lambda: (T(*IMG),)),
    "Upsample_size": (lambda: nn.Upsample(size=(5, 7), mode="bicubic", recompute_scale_factor=None), lambda: (T(*IMG),)),
    "UpsamplingBilinear2d": (lambda: nn.UpsamplingBilinear2d(scale_factor=2), lambda: (T(*IMG),)),
    "UpsamplingNearest2d": (lambda: nn.UpsamplingNearest2d(size=4), lambda: (T(*IMG),)),
    "ZeroPad1d": (lambda: nn.ZeroPad1d((0, 3)), lambda: (T(*SEQ),)),
    "ZeroPad2d": (lambda: nn.ZeroPad2d((1, 0, 2, 3)), lambda: (T(*IMG),)),
    "ZeroPad3d": (lambda: nn.ZeroPad3d(1), lambda: (T(*VOL),)),
}  # fmt: skip

# Cases whose state no constructor call read from attributes of the same names gives: traced
# through, op by op (exact by construction).
TRACED = {
    "PairwiseDistance": "stores its p as norm",
    "RNN_relu": "nn.RNN keeps nonlinearity outside the base class's signature",
    "TripletMarginWithDistanceLoss": "holds a function",
}

# Classes that are never a leaf of a stage, and why: the tracer goes through them.
NOT_LEAVES = {
    "Module": "the base class",
    "Container": "a container",
    "Sequential": "a container",
    "ModuleList": "a container",
    "ModuleDict": "a container",
    "ParameterList": "a container",
    "ParameterDict": "a container",
    "DataParallel": "a wrapper of another module",
    "RNNBase": "a base class (nn.RNN, LSTM, GRU are leaves)",
    "RNNCellBase": "a base class",
    "MultiheadAttention": "has a child (out_proj)",
    "Transformer": "has children",
    "TransformerEncoder": "has children",
    "TransformerDecoder": "has children",
    "TransformerEncoderLayer": "has children",
    "TransformerDecoderLayer": "has children",
    "AdaptiveLogSoftmaxWithLoss": "has children",
    "LinearCrossEntropyLoss": "has a child (the linear layer)",
}
LAZY = {n for n in dir(nn) if n.startswith("Lazy")}  # uninitialised: they have no shapes yet


def _torch_nn_classes() -> set[str]:
    return {
        name
        for name in dir(nn)
        if inspect.isclass(getattr(nn, name)) and issubclass(getattr(nn, name), nn.Module)
    }


def test_every_torch_nn_class_is_covered() -> None:
    """A new torch.nn class fails here until it has a case (or a reason not to be a leaf)."""
    covered = {name.split("_")[0] for name in CASES} | set(NOT_LEAVES) | LAZY
    assert _torch_nn_classes() - covered == set()


@pytest.mark.parametrize("name", sorted(NOT_LEAVES))
def test_the_rest_is_traced_through(name: str) -> None:
    cls = getattr(nn, name)
    if name in ("MultiheadAttention", "Transformer", "AdaptiveLogSoftmaxWithLoss"):
        module = {"MultiheadAttention": lambda: nn.MultiheadAttention(8, 2),
                  "Transformer": lambda: nn.Transformer(8, 2, 1, 1, 16),
                  "AdaptiveLogSoftmaxWithLoss": lambda: nn.AdaptiveLogSoftmaxWithLoss(8, 10, [4])}[name]()  # fmt: skip
        assert leaf_constructor(module) is None
    else:
        assert inspect.isclass(cls)


def test_lazy_modules_are_traced_through() -> None:
    assert leaf_constructor(nn.LazyLinear(3)) is None


@pytest.mark.parametrize("name", sorted(CASES))
def test_rebuilt_module_computes_the_same(name: str) -> None:
    torch.manual_seed(0)
    make, inputs = CASES[name]
    module = make()
    source = leaf_constructor(module)
    if name in TRACED:
        assert source is None
        return
    assert source is not None, f"{name} would be traced through"
    rebuilt = eval(source, {"torch": torch})  # noqa: S307 - what a stage file holds
    rebuilt.load_state_dict(module.state_dict())
    rebuilt.train(module.training)
    args = inputs()
    if args[0].is_floating_point():  # the input's gradient (a loss's target has none)
        args = (args[0].requires_grad_(), *args[1:])
    want, have = _run(module, args, seed=1), _run(rebuilt, args, seed=1)
    assert len(want) == len(have)
    for w, h in zip(want, have):
        assert w.shape == h.shape and w.dtype == h.dtype
        torch.testing.assert_close(h, w, rtol=0, atol=0, equal_nan=True)


def _run(module: nn.Module, args: tuple, seed: int) -> list[torch.Tensor]:
    """Outputs, then the gradients of the inputs and parameters (a fixed cotangent)."""
    torch.manual_seed(seed)
    out = module(*args)
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, torch.Tensor)]
    flat = _leaves(outs)
    floats = [o for o in flat if o.is_floating_point() and o.requires_grad]
    grads: list[torch.Tensor] = []
    if floats:
        leaves = [a for a in args if a.requires_grad] + [
            p for p in module.parameters() if p.requires_grad
        ]
        cot = [torch.ones_like(o) * 0.5 for o in floats]
        found = torch.autograd.grad(floats, leaves, cot, allow_unused=True)
        grads = [g for g in found if g is not None]
    return [o.detach() for o in flat] + grads


def _leaves(values: list) -> list[torch.Tensor]:
    found = []
    for v in values:
        if isinstance(v, (tuple, list)):
            found += _leaves(list(v))
        elif isinstance(v, torch.Tensor):
            found.append(v)
    return found


def test_settings_are_written_out() -> None:
    """The settings a printed form leaves out are in the constructor call."""
    assert "count_include_pad=False" in leaf_constructor(
        nn.AvgPool2d(3, 1, 1, count_include_pad=False)
    )
    assert "align_corners=True" in leaf_constructor(
        nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
    )
    assert "divisor_override=2" in leaf_constructor(nn.AvgPool2d(3, divisor_override=2))
    assert "norm_type=2" in leaf_constructor(nn.LPPool2d(2, 3))


def test_changed_after_construction_is_traced_through() -> None:
    """A module whose state no constructor call gives (an attribute set afterwards, a hook)
    is not a leaf: its ops are traced instead."""
    pool = nn.AvgPool2d(3)
    pool.extra = 1
    assert leaf_constructor(pool) is None
    hooked = nn.ReLU()
    hooked.register_forward_hook(lambda m, i, o: o * 2)
    assert leaf_constructor(hooked) is None

    class MyPool(nn.AvgPool2d):
        pass

    assert leaf_constructor(MyPool(3)) is None
