"""The runtime's retrace of a loaded stage (``op_seeds``) reads the stage's buffers when it runs,
never a copy folded while tracing: a buffer changed later (loaded weights, a resumed state, a
move to a GPU) is the one the seeded forward computes with."""

import torch
from torch import nn

from pipecompile.runtime.state.op_seeds import seed_random_ops


class _Stage(nn.Module):
    """An emitted stage's shape: a computation on a buffer alone, then a random op."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        doubled = torch.ops.aten.mul.Tensor(self.scale, 2.0)
        noise = torch.ops.aten.rand_like.default(x)
        return torch.ops.aten.mul.Tensor(x, doubled), noise


def test_a_buffer_changed_after_seeding_is_the_one_computed_with():
    stage = _Stage()
    assert seed_random_ops(stage, ["rand_like"], "stage 0")
    with torch.no_grad():
        stage.scale.fill_(3.0)
    x = torch.arange(3.0)
    assert torch.equal(stage(x)[0], x * 6.0)


def test_seeding_leaves_no_tensor_that_a_move_to_another_device_misses():
    stage = _Stage()
    assert seed_random_ops(stage, ["rand_like"], "stage 0")
    plain = [k for k, v in vars(stage).items() if isinstance(v, torch.Tensor)]
    assert plain == []
    moved = stage.to("meta")
    out, _ = moved(torch.ones(3, device="meta"))
    assert out.device.type == "meta"


class _Constant(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        steps = torch.ops.aten.mul.Tensor(torch.ones(3), 2.0)  # reads no input: a constant
        return torch.ops.aten.mul.Tensor(x, steps), torch.ops.aten.rand_like.default(x)


def test_a_constant_the_retrace_keeps_moves_with_the_stage():
    stage = _Constant()
    assert seed_random_ops(stage, ["rand_like"], "stage 0")
    assert "_tensor_constant0" in dict(stage.named_buffers())
    assert "_tensor_constant0" not in stage.state_dict()
    out, _ = stage.to("meta")(torch.ones(3, device="meta"))
    assert out.device.type == "meta"
